package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/runtime/api"
)

// A process gang's members have no SDK: the agent does for them what a worker does for
// itself. Rank 0's agent picks the gang's rendezvous port, the other ranks' agents wait for
// it before they start theirs; a notice on the gang's record becomes a notice file and a
// signal to each member's process group.

// errNotWanted: a worker was dropped before it started (its gang generation ended while
// it waited).
var errNotWanted = errors.New("agent: worker no longer wanted")

// rendezvousPoll is how often a process gang's member waiting for rank 0's rendezvous
// address looks for it.
const rendezvousPoll = 100 * time.Millisecond

// rendezvous returns the MASTER_ADDR:MASTER_PORT of w's gang generation: for the member
// that is rank 0 (the first of the world), a port free on this machine now (freeport:
// below the kernel's ephemeral range, released at once for the program to bind) at the host
// other machines reach this agent by; for the others, what rank 0's agent announced in
// its ready record (Worker.Address), waited for. It returns "" when w is no longer wanted
// while it waits.
func (a *Agent) rendezvous(w *worker) (string, error) {
	s := w.spec
	world := s.World
	if len(world) == 0 {
		for i, m := range s.Placement.Members {
			if !m.Removed {
				world = append(world, i)
			}
		}
	}
	if len(world) == 0 {
		return "", fmt.Errorf("agent: process gang %s/%s has no member", s.Job, s.Gang)
	}
	if world[0] == s.Rank {
		port, err := freeport.Port("")
		if err != nil {
			return "", fmt.Errorf("agent: a rendezvous port for %s: %w", s.Key(), err)
		}
		return net.JoinHostPort(a.masterHost(), fmt.Sprint(port)), nil
	}
	key := api.TableWorkers + api.WorkerKey(s.Job, s.Gang, world[0])
	for {
		if !a.wanted(w) {
			return "", nil
		}
		var rec api.Worker
		found, err := a.client.Get(a.ctx, key, &rec)
		if err == nil && found && rec.GangUID == s.GangUID && rec.Generation == s.Generation && rec.Address != "" {
			return rec.Address, nil
		}
		select {
		case <-a.ctx.Done():
			return "", nil
		case <-time.After(rendezvousPoll):
		}
	}
}

// masterHost is the host other machines reach this machine by: its advertised host (the
// agent API's), or its host name when the API listens on every interface.
func (a *Agent) masterHost() string {
	host := "127.0.0.1"
	if u, err := url.Parse(a.addr); err == nil && u.Hostname() != "" {
		host = u.Hostname()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return host
}

// noticer is a Handle that takes notices: a process gang member's (ExecLauncher's).
type noticer interface {
	Signal(sig syscall.Signal) error
	NoticeFile() string
}

// noticeLocked gives a running process gang member the notice on its gang's record, once
// per notice: the notice file first (written whole, then renamed), then the job's signal to
// its process group.
func (a *Agent) noticeLocked(w *worker) {
	s := w.spec
	if s.Process == nil || w.h == nil || w.stopping {
		return
	}
	g, ok := a.gangs[s.Job+"/"+s.Gang]
	if !ok || g.UID != s.GangUID || g.Generation != s.Generation || g.Notice == nil || !g.Notice.Issued.After(w.noticed) {
		return
	}
	n, ok := w.h.(noticer)
	if !ok || n.NoticeFile() == "" {
		return
	}
	w.noticed = g.Notice.Issued
	pn := api.ProcessNotice{Kind: g.Notice.Kind, Issued: g.Notice.Issued, Deadline: g.Notice.Deadline, Generation: s.Generation,
		YieldExitCode: s.Process.YieldExitCode, Reason: g.Notice.Reason, From: g.Notice.From, To: g.Notice.To}
	if err := writeNotice(n.NoticeFile(), pn); err != nil {
		a.log.Warn("could not write a notice file", workerField(s), zap.Error(err))
	}
	sig := signalOf(s.Process.NoticeSignal)
	if err := n.Signal(sig); err != nil {
		a.log.Warn("could not signal a notice", workerField(s), zap.Error(err))
		return
	}
	a.log.Info("notice given", workerField(s), zap.String("kind", string(pn.Kind)), zap.Stringer("signal", sig))
}

// writeNotice writes a notice file whole: a temporary file renamed over it.
func writeNotice(path string, n api.ProcessNotice) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// signalOf is the signal of a name api.ProcessSpec accepts (SIGUSR1 for any other).
func signalOf(name string) syscall.Signal {
	switch name {
	case "SIGUSR2":
		return syscall.SIGUSR2
	case "SIGTERM":
		return syscall.SIGTERM
	case "SIGINT":
		return syscall.SIGINT
	case "SIGHUP":
		return syscall.SIGHUP
	}
	return syscall.SIGUSR1
}
