package dashboard

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
)

//go:embed static
var static embed.FS

// Source is what the handler shows: a head's view of the cluster.
type Source interface {
	// State is the cluster now.
	State(ctx context.Context) (State, error)
	// Series returns the samples after since (Unix milliseconds).
	Series(since int64) []Sample
	// Progress returns a gang's progress reports after since (Unix milliseconds).
	Progress(gang string, since int64) []api.Progress
	// Events returns the events of a job ("" for all) after seq, at most limit, oldest
	// first.
	Events(ctx context.Context, job string, after int64, limit int) ([]api.Event, error)
}

// Config configures the handler.
type Config struct {
	// Token is the dashboard's read-only token (api.DashboardToken of the secret).
	Token string
	// Source is the view shown.
	Source Source
	// Logger (default no-op).
	Logger *zap.Logger
}

// MaxEvents bounds the events of one answer.
const MaxEvents = 1000

// ErrUnauthenticated is the answer to a read without the dashboard token.
var ErrUnauthenticated = errors.New("dashboard: a valid dashboard token is required")

// Bearer reports whether the request carries one of the tokens as its bearer token
// (compared in constant time).
func Bearer(r *http.Request, tokens ...string) bool {
	got := r.Header.Get("Authorization")
	ok := 0
	for _, t := range tokens {
		if t != "" {
			ok |= subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+t))
		}
	}
	return ok == 1
}

// Handler serves the dashboard under /ui/: the pages to anyone (they hold no data), the
// read endpoints under /ui/api/ to the bearers of the dashboard token.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	log := cfg.Logger.Named("dashboard")
	files, _ := fs.Sub(static, "static")
	m := http.NewServeMux()
	page := func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(files, "index.html")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		secure(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	}
	m.HandleFunc("GET /ui/{$}", page)
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		u := "/ui/"
		if r.URL.RawQuery != "" {
			u += "?" + r.URL.RawQuery
		}
		http.Redirect(w, r, u, http.StatusFound)
	})
	fileServer := http.StripPrefix("/ui/static/", http.FileServerFS(files))
	m.HandleFunc("GET /ui/static/", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		w.Header().Set("Cache-Control", "max-age=3600")
		fileServer.ServeHTTP(w, r)
	})
	read := func(fn func(r *http.Request) (any, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			secure(w)
			w.Header().Set("Cache-Control", "no-store")
			if !Bearer(r, cfg.Token) {
				log.Debug("dashboard read refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
				writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: ErrUnauthenticated.Error(), Kind: "unauthenticated"})
				return
			}
			out, err := fn(r)
			if err != nil {
				code, kind := api.ErrorStatus(err)
				writeJSON(w, code, api.ErrorBody{Error: err.Error(), Kind: kind})
				return
			}
			writeJSON(w, http.StatusOK, out)
		}
	}
	m.HandleFunc("GET /ui/api/state", read(func(r *http.Request) (any, error) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		return cfg.Source.State(ctx)
	}))
	m.HandleFunc("GET /ui/api/series", read(func(r *http.Request) (any, error) {
		since, err := intParam(r, "since", 0)
		if err != nil {
			return nil, err
		}
		s := cfg.Source.Series(since)
		if s == nil {
			s = []Sample{}
		}
		return s, nil
	}))
	m.HandleFunc("GET /ui/api/progress", read(func(r *http.Request) (any, error) {
		since, err := intParam(r, "since", 0)
		if err != nil {
			return nil, err
		}
		gang := r.URL.Query().Get("gang")
		job, name, ok := strings.Cut(gang, "/")
		if !ok || api.CheckName("job", job) != nil || api.CheckName("gang", name) != nil {
			return nil, errors.Join(api.ErrInvalid, errors.New("progress: gang must be job/gang"))
		}
		p := cfg.Source.Progress(gang, since)
		if p == nil {
			p = []api.Progress{}
		}
		return p, nil
	}))
	m.HandleFunc("GET /ui/api/events", read(func(r *http.Request) (any, error) {
		after, err := intParam(r, "after", 0)
		if err != nil {
			return nil, err
		}
		limit, err := intParam(r, "limit", 200)
		if err != nil {
			return nil, err
		}
		job := r.URL.Query().Get("job")
		if job != "" {
			if err := api.CheckName("job", job); err != nil {
				return nil, err
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		evs, err := cfg.Source.Events(ctx, job, after, int(min(max(limit, 1), MaxEvents)))
		if evs == nil {
			evs = []api.Event{}
		}
		return evs, err
	}))
	return m
}

func intParam(r *http.Request, name string, def int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, errors.Join(api.ErrInvalid, errors.New("parameter "+name+"="+strconv.Quote(s)+": want an integer >= 0"))
	}
	return v, nil
}

// secure sets the headers every dashboard answer carries: no framing, no sniffing, no
// referrer (the page's URL may still hold the token when it loads), and scripts from this
// origin only.
func secure(w http.ResponseWriter) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
