package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// WorkerInfo is one worker in GET /v1/workers.
type WorkerInfo struct {
	Key        string `json:"key"`
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	Rank       int    `json:"rank"`
	Generation int    `json:"generation"`
	PID        int    `json:"pid,omitempty"`
	GPUs       []int  `json:"gpus"`
}

// apiHandler is the agent's HTTP API, for the machine's worker processes (objects: put,
// map, release, leases) and for operators (workers, logs, kill). Every request needs a
// token (the cluster token, or a scoped one), and is decided by its caller's role
// (authz.go).
func (a *Agent) apiHandler() http.Handler {
	if a.state == nil {
		a.state = newAgentState(a)
	}
	a.authn = a.authenticator()
	m := http.NewServeMux()
	m.HandleFunc("POST /v1/objects/put", a.put)
	m.HandleFunc("POST /v1/objects/create", a.create)
	m.HandleFunc("POST /v1/objects/seal", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		m, err := a.local.Seal(ctx, id, r.Holder)
		if err == nil && r.Durable {
			if m, err = a.local.Persist(ctx, id); err != nil {
				_ = a.local.Free(context.WithoutCancel(ctx), id)
			}
		}
		if err != nil {
			return nil, err
		}
		return info(m, r.Holder), nil
	}))
	m.HandleFunc("POST /v1/objects/abort", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		return nil, a.local.Abort(id, r.Holder)
	}))
	m.HandleFunc("POST /v1/objects/map", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		return a.local.Map(ctx, id, r.Holder)
	}))
	m.HandleFunc("POST /v1/objects/unmap", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		return nil, a.local.Unmap(ctx, id, r.Holder)
	}))
	m.HandleFunc("POST /v1/objects/release", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		return nil, a.local.Release(ctx, id, r.Holder)
	}))
	m.HandleFunc("POST /v1/objects/free", objectOp(a, func(ctx context.Context, id object.ID, _ api.ObjectRef) (any, error) {
		return nil, a.local.Free(ctx, id)
	}))
	m.HandleFunc("POST /v1/objects/replicate", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		if r.Holder == "" {
			return nil, fmt.Errorf("%w: a replica needs a holder", api.ErrInvalid)
		}
		m, err := a.local.Replicate(ctx, id, r.Holder, r.Durable)
		if err != nil {
			return nil, err
		}
		return info(m, r.Holder), nil
	}))
	m.HandleFunc("POST /v1/objects/persist", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		m, err := a.local.Persist(ctx, id)
		if err != nil {
			return nil, err
		}
		return info(m, r.Holder), nil
	}))
	m.HandleFunc("POST /v1/objects/export", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		if a.cfg.CheckpointDir == "" {
			return nil, fmt.Errorf("%w: %s mounts no shared checkpoint directory", api.ErrInvalid, a.cfg.Name)
		}
		m, err := a.node.Store.Export(ctx, id, a.cfg.CheckpointDir)
		if err != nil {
			return nil, err
		}
		m.Locations = []string{objects.SharedLocation(a.cfg.CheckpointDir)}
		if err := a.dir.Register(ctx, m); err != nil {
			_ = object.RemoveFile(a.cfg.CheckpointDir, id)
			return nil, err
		}
		return info(m, r.Holder), nil
	}))
	m.HandleFunc("POST /v1/objects/unexport", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		if a.cfg.CheckpointDir == "" {
			return nil, fmt.Errorf("%w: %s mounts no shared checkpoint directory", api.ErrInvalid, a.cfg.Name)
		}
		if err := object.RemoveFile(a.cfg.CheckpointDir, id); err != nil {
			return nil, err
		}
		if err := a.dir.RemoveLocation(ctx, id, objects.SharedLocation(a.cfg.CheckpointDir)); err != nil && !errors.Is(err, object.ErrNotFound) {
			return nil, err
		}
		return nil, nil
	}))
	m.HandleFunc("POST /v1/objects/verify", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		if r.Shared {
			if a.cfg.CheckpointDir == "" {
				return nil, fmt.Errorf("%w: %s mounts no shared checkpoint directory", api.ErrInvalid, a.cfg.Name)
			}
			m, err := object.VerifyFile(a.cfg.CheckpointDir, id)
			if err != nil {
				return nil, err
			}
			m.Locations = []string{objects.SharedLocation(a.cfg.CheckpointDir)}
			return info(m, ""), nil
		}
		m, err := a.node.Store.Verify(ctx, id)
		if err != nil {
			return nil, err
		}
		ai := info(m, "")
		ai.Durable = a.node.Store.Durable(id)
		return ai, nil
	}))
	m.HandleFunc("POST /v1/objects/drop", objectOp(a, func(ctx context.Context, id object.ID, r api.ObjectRef) (any, error) {
		var cause error
		if r.Cause == api.CauseOwnerDied {
			cause = object.ErrOwnerDied
		}
		return nil, a.local.Drop(ctx, id, cause)
	}))
	m.HandleFunc("POST /v1/leases/renew", func(w http.ResponseWriter, r *http.Request) {
		var ref api.ObjectRef
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&ref); err != nil || ref.Holder == "" {
			a.fail(w, fmt.Errorf("%w: lease renewal needs a holder", api.ErrInvalid))
			return
		}
		a.node.Store.Renew(ref.Holder)
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("GET /v1/workers", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		out := []WorkerInfo{}
		for _, wk := range a.workers {
			wi := WorkerInfo{Key: wk.spec.Key(), Job: wk.spec.Job, Gang: wk.spec.Gang, Rank: wk.spec.Rank, Generation: wk.spec.Generation, GPUs: wk.spec.Member.GPUs}
			if wk.h != nil {
				wi.PID = wk.h.PID()
			}
			out = append(out, wi)
		}
		a.mu.Unlock()
		sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
		writeJSON(w, http.StatusOK, out)
	})
	m.HandleFunc("POST /v1/workers/kill", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rank, err := strconv.Atoi(q.Get("rank"))
		if err != nil {
			a.fail(w, fmt.Errorf("%w: rank %q", api.ErrInvalid, q.Get("rank")))
			return
		}
		pid, err := a.KillWorker(q.Get("job"), q.Get("gang"), rank)
		if err != nil {
			a.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]int{"pid": pid})
	})
	m.HandleFunc("GET /v1/logs", a.logs)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" { // the dashboard's read-only token opens it too
			a.serveMetrics(w, r)
			return
		}
		if a.id != nil {
			if _, ok := pki.Verified(r.TLS); !ok {
				a.log.Warn("agent request without a client certificate refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
				writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "unauthenticated: a client certificate of the cluster CA is required", Kind: "unauthenticated"})
				return
			}
		}
		r, ok := a.authorize(w, r, m) // authz.go
		if !ok {
			return
		}
		m.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *Agent) fail(w http.ResponseWriter, err error) {
	code, kind := api.ErrorStatus(err)
	switch {
	case errors.Is(err, object.ErrNotFound):
		code, kind = http.StatusNotFound, "not_found"
	case errors.Is(err, object.ErrTooLarge):
		code, kind = http.StatusRequestEntityTooLarge, api.KindTooLarge
	case errors.Is(err, object.ErrOwnerDied):
		code, kind = http.StatusGone, api.KindOwnerDied
	case errors.Is(err, object.ErrLost), errors.Is(err, transfer.ErrObjectLost):
		code, kind = http.StatusGone, api.KindObjectLost
	}
	writeJSON(w, code, api.ErrorBody{Error: err.Error(), Kind: kind})
}

func objectOp(a *Agent, fn func(context.Context, object.ID, api.ObjectRef) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var ref api.ObjectRef
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&ref); err != nil {
			a.fail(w, fmt.Errorf("%w: %s: %v", api.ErrInvalid, r.URL.Path, err))
			return
		}
		id, err := object.ParseID(ref.ID)
		if err != nil {
			a.fail(w, fmt.Errorf("%w: object id %q: %v", api.ErrInvalid, ref.ID, err))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
		defer cancel()
		out, err := fn(ctx, id, ref)
		if err != nil {
			a.fail(w, err)
			return
		}
		if out == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

func info(m object.Meta, holder string) api.ObjectInfo {
	ai := api.ObjectInfo{ID: m.ID.String(), Holder: holder, Size: m.Size, Fingerprint: m.Fingerprint, Durable: m.Durable}
	if len(m.Locations) > 0 {
		ai.Location = m.Locations[0]
	}
	return ai
}

// put stores the request body as a new object held by ?holder=; with ?durable=1 the copy
// is persisted (fsync'd) before the answer. The body is streamed into the store's shared
// memory as it arrives, never buffered: its length must be declared (411 otherwise), and
// one over the store's object size limit is refused before a byte is read (413, naming
// the limit). A body that breaks off gives back what it held at once.
func (a *Agent) put(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	holder := q.Get("holder")
	if holder == "" {
		a.fail(w, fmt.Errorf("%w: a put needs a holder", api.ErrInvalid))
		return
	}
	if r.ContentLength < 0 {
		writeJSON(w, http.StatusLengthRequired, api.ErrorBody{Error: "a put needs a Content-Length: bodies are streamed into the store, never buffered",
			Kind: "invalid"})
		return
	}
	if limit := a.node.Store.MaxObjectSize(); r.ContentLength > limit {
		a.fail(w, fmt.Errorf("an object of %d bytes is over this store's object size limit of %d bytes (%s): %w",
			r.ContentLength, limit, a.cfg.Name, object.ErrTooLarge))
		return
	}
	body := http.MaxBytesReader(w, r.Body, r.ContentLength)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute) // room, then the body
	defer cancel()
	m, err := a.local.PutFrom(ctx, holder, r.ContentLength, body)
	if err != nil {
		if !errors.Is(err, object.ErrTooLarge) && !errors.Is(err, object.ErrStoreFull) && !errors.Is(err, object.ErrDiskFull) {
			err = fmt.Errorf("%w: %v", api.ErrInvalid, err) // the body broke off
		}
		a.fail(w, err)
		return
	}
	if q.Get("durable") == "1" {
		id := m.ID
		if m, err = a.local.Persist(ctx, id); err != nil {
			_ = a.local.Free(context.WithoutCancel(ctx), id)
			a.fail(w, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, info(m, holder))
}

// create admits ?size= bytes for a new object that the calling worker process writes
// itself, straight into this machine's shared memory (zero-copy puts: nothing crosses
// this API but the answer), to belong to ?holder= once sealed (POST /v1/objects/seal);
// ?lease= is the writing process's own holder, whose death aborts the write. The answer
// says where to map it (api.ObjectWrite).
func (a *Agent) create(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	holder, lease := q.Get("holder"), q.Get("lease")
	if holder == "" || lease == "" {
		a.fail(w, fmt.Errorf("%w: a create needs a holder and a lease (?holder=&lease=)", api.ErrInvalid))
		return
	}
	size, err := strconv.ParseInt(q.Get("size"), 10, 64)
	if err != nil || size < 0 {
		a.fail(w, fmt.Errorf("%w: a create needs ?size=, a number of bytes >= 0 (got %q)", api.ErrInvalid, q.Get("size")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute) // room, as a put waits for it
	defer cancel()
	id, m, unmap, err := a.local.Create(ctx, holder, lease, size)
	if unmap == nil {
		unmap = []string{}
	}
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ObjectWrite{ID: id.String(), Path: m.Path, Offset: m.Offset, Size: m.Size, Unmap: unmap})
}

// LogPath is where a worker's stdout and stderr go on its agent.
func LogPath(dir, job, gang string, rank, gen int) string {
	return filepath.Join(dir, "logs", job, fmt.Sprintf("%s.%d.g%d.log", gang, rank, gen))
}

// logs streams a worker's log: ?job=&gang=&rank= (&gen=, default the newest), &follow=1
// keeps streaming until the client goes away.
func (a *Agent) logs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	job, gang := q.Get("job"), q.Get("gang")
	if err := api.CheckName("job", job); err != nil {
		a.fail(w, err)
		return
	}
	if err := api.CheckName("gang", gang); err != nil {
		a.fail(w, err)
		return
	}
	rank, err := strconv.Atoi(q.Get("rank"))
	if err != nil || rank < 0 {
		a.fail(w, fmt.Errorf("%w: rank %q", api.ErrInvalid, q.Get("rank")))
		return
	}
	gen := -1
	if g := q.Get("gen"); g != "" {
		if gen, err = strconv.Atoi(g); err != nil || gen < 0 {
			a.fail(w, fmt.Errorf("%w: generation %q", api.ErrInvalid, g))
			return
		}
	} else {
		matches, _ := filepath.Glob(filepath.Join(a.cfg.Dir, "logs", job, fmt.Sprintf("%s.%d.g*.log", gang, rank)))
		for _, p := range matches {
			s := strings.TrimSuffix(p[strings.LastIndex(p, ".g")+2:], ".log")
			if n, err := strconv.Atoi(s); err == nil && n > gen {
				gen = n
			}
		}
	}
	if gen < 0 {
		a.fail(w, fmt.Errorf("%w: no log of %s/%s rank %d on %s", api.ErrNotFound, job, gang, rank, a.cfg.Name))
		return
	}
	f, err := os.Open(LogPath(a.cfg.Dir, job, gang, rank, gen))
	if err != nil {
		a.fail(w, fmt.Errorf("%w: log of %s/%s rank %d generation %d on %s", api.ErrNotFound, job, gang, rank, gen, a.cfg.Name))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Atoll-Generation", strconv.Itoa(gen))
	fl, _ := w.(http.Flusher)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if err == io.EOF {
			if q.Get("follow") == "" {
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return
		}
	}
}
