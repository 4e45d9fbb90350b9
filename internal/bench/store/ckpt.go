package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// The checkpoint commit measurement (h): what making a checkpoint durable costs with one
// copy (every part persisted, fsync'd, by the store that holds it) and with two (the same,
// while a second process, standing for a second machine, pulls every part over loopback and
// persists it too, as Gang.Checkpoint does), against the time to send the parts once over
// loopback (the second process pulls them without persisting).

// ServeCommand is a line the benchmark sends its serving process after its config: pull
// the ids from the store at From (and persist each), or free them.
type ServeCommand struct {
	Op      string   `json:"op"` // "pull" or "free"
	From    string   `json:"from,omitempty"`
	IDs     []string `json:"ids"`
	Persist bool     `json:"persist,omitempty"`
}

// ServeReply answers a ServeCommand: the seconds it took, or why it failed.
type ServeReply struct {
	S   float64 `json:"s"`
	Err string  `json:"err,omitempty"`
}

// serveCommands answers the commands that follow the config line until stdin ends.
func serveCommands(ctx context.Context, in *bufio.Reader, out *json.Encoder, st *object.Store, token []byte, log *zap.Logger) error {
	ccfg := transfer.DefaultClientConfig()
	ccfg.Token, ccfg.Logger = token, log
	cl, err := transfer.NewClient(ccfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return nil // stdin closed: done
		}
		var c ServeCommand
		if err := json.Unmarshal(line, &c); err != nil {
			return fmt.Errorf("benchstore: serve: command %q: %w", line, err)
		}
		t0 := time.Now()
		err = runCommand(ctx, c, st, cl)
		r := ServeReply{S: time.Since(t0).Seconds()}
		if err != nil {
			r.Err = err.Error()
		}
		if err := out.Encode(r); err != nil {
			return err
		}
	}
}

func runCommand(ctx context.Context, c ServeCommand, st *object.Store, cl *transfer.Client) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.IDs))
	for i, s := range c.IDs {
		id, err := object.ParseID(s)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch c.Op {
			case "pull": // as an agent's replicate: pull, then persist
				if errs[i] = cl.Pull(ctx, st, id, []string{c.From}, transfer.PullOptions{Owner: "bench"}); errs[i] == nil && c.Persist {
					_, errs[i] = st.Persist(ctx, id)
				}
			case "free":
				errs[i] = st.Release(ctx, id, "bench")
			default:
				errs[i] = fmt.Errorf("unknown op %q", c.Op)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// runCheckpoint measures (h) and fills res.
func runCheckpoint(ctx context.Context, cfg Config, st *object.Store, res *Result, log *zap.Logger) error {
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	srv, err := startServer(ctx, cfg, ServeConfig{Token: hex.EncodeToString(tok), Size: 4096, Room: cfg.CkptBytes + 64<<20})
	if err != nil {
		return err
	}
	defer srv.stop()
	// This process's store serves the parts, as a worker's machine does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	scfg := transfer.DefaultServerConfig()
	scfg.Token, scfg.Logger = tok, log
	tsrv, err := transfer.NewServer(scfg, transfer.StoreSource{Store: st})
	if err != nil {
		ln.Close()
		return err
	}
	go tsrv.Serve(ln)
	defer tsrv.Shutdown(context.Background())
	from := ln.Addr().String()

	partSize := cfg.CkptBytes / int64(cfg.CkptParts)
	data := pattern(int(partSize))
	put := func() ([]object.ID, []string, error) {
		ids := make([]object.ID, cfg.CkptParts)
		strs := make([]string, cfg.CkptParts)
		for i := range ids {
			// As a worker's put through its agent: streamed in, hashed on the way.
			m, err := st.PutFrom(ctx, "bench", object.NewID(), int64(len(data)), bytes.NewReader(data))
			if err != nil {
				return nil, nil, err
			}
			ids[i], strs[i] = m.ID, m.ID.String()
		}
		return ids, strs, nil
	}
	free := func(ids []object.ID, remote []string) error {
		for _, id := range ids {
			if err := st.Release(ctx, id, "bench"); err != nil {
				return err
			}
		}
		if len(remote) > 0 {
			return srv.command(ServeCommand{Op: "free", IDs: remote})
		}
		return nil
	}
	persistAll := func(ids []object.ID) error {
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		for i, id := range ids {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = st.Persist(ctx, id) }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	oneCopy := func() (time.Duration, error) {
		ids, _, err := put()
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		err = persistAll(ids)
		d := time.Since(t0)
		if ferr := free(ids, nil); err == nil {
			err = ferr
		}
		return d, err
	}
	twoCopies := func() (time.Duration, error) {
		ids, strs, err := put()
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		remote := make(chan error, 1)
		go func() { remote <- srv.command(ServeCommand{Op: "pull", From: from, IDs: strs, Persist: true}) }()
		err = persistAll(ids)
		if rerr := <-remote; err == nil {
			err = rerr
		}
		d := time.Since(t0)
		if ferr := free(ids, strs); err == nil {
			err = ferr
		}
		return d, err
	}
	sendOnce := func() (time.Duration, error) {
		ids, strs, err := put()
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		err = srv.command(ServeCommand{Op: "pull", From: from, IDs: strs})
		d := time.Since(t0)
		if ferr := free(ids, strs); err == nil {
			err = ferr
		}
		return d, err
	}
	if _, err := twoCopies(); err != nil { // warm-up: memory and connections
		return fmt.Errorf("benchstore: checkpoint warm-up: %w", err)
	}
	var extras []float64
	var ones, twos, sends []time.Duration
	for i := range cfg.CkptRuns {
		var t1, t2 time.Duration
		for j := range 2 {
			var err error
			if (i+j)%2 == 0 {
				t1, err = oneCopy()
			} else {
				t2, err = twoCopies()
			}
			if err != nil {
				return fmt.Errorf("benchstore: checkpoint commit: %w", err)
			}
		}
		ts, err := sendOnce()
		if err != nil {
			return fmt.Errorf("benchstore: checkpoint send: %w", err)
		}
		log.Info("checkpoint commit", zap.Duration("one_copy", t1), zap.Duration("two_copies", t2), zap.Duration("send", ts))
		ones, twos, sends = append(ones, t1), append(twos, t2), append(sends, ts)
		extras = append(extras, (t2 - t1).Seconds())
	}
	med := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2].Seconds()
	}
	slices.Sort(extras)
	res.CkptBytes, res.CkptParts, res.CkptRuns = partSize*int64(cfg.CkptParts), cfg.CkptParts, cfg.CkptRuns
	res.CkptCommit1S, res.CkptCommit2S, res.CkptSendS = med(ones), med(twos), med(sends)
	res.CkptSecondCopyS = extras[len(extras)/2]
	res.CkptSecondCopyVsSend = res.CkptSecondCopyS / res.CkptSendS
	res.CkptPersistGBps = gbps(res.CkptBytes, time.Duration(res.CkptCommit1S*float64(time.Second)))
	return nil
}

// command sends the serving process a command and waits for its answer.
func (s *server) command(c ServeCommand) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	line, _ := json.Marshal(c)
	if _, err := s.stdin.Write(append(line, '\n')); err != nil {
		return err
	}
	b, err := s.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("benchstore: serving process: %w", err)
	}
	var r ServeReply
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	if r.Err != "" {
		return fmt.Errorf("benchstore: serving process: %s", r.Err)
	}
	return nil
}
