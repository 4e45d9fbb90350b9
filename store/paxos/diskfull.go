package paxos

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// A replica whose disk is full steps down and waits the fault out, then rejoins by itself:
//
//  1. A write (WAL append, fsync, snapshot) fails with ENOSPC or EDQUOT. What the failed
//     Ready asked for was not persisted, so nothing that depends on it was sent (Ready's
//     contract), and the node's memory is ahead of its disk.
//  2. The replica stops taking part: the writes in flight are let finish and dropped, the
//     waiting proposals and reads fail with ErrDiskFull, proposals and reads that come fail
//     the same way, messages are dropped (Paxos retransmits), and the status says follower
//     with no leader known (a leader's lease reads stop with it). The other replicas elect
//     a leader without it.
//  3. With a backoff (FaultRetryMin doubling to FaultRetryMax, and going on doubling when
//     the disk fills again soon after) it reopens its storage from disk (Reopener: the WAL
//     wants RejoinFree bytes free, and truncates a torn tail as at a restart) and writes
//     its hard state back as a probe. Once that write is durable, the node is rebuilt from the storage, as a
//     restart would (it refuses to promise for ElectionTicks), and catches up from the
//     leader. The state machine keeps what it applied: the slots it holds are not applied
//     again (a chosen value never changes).
//
// Nothing acknowledged is lost: an acknowledged proposal is durable on a majority, and what
// this replica had not persisted it never claimed to hold. Other storage failures stop the
// replica for good (Err), as before: after a failed fsync for another reason the page
// cache may claim data the disk does not hold.

// Backoff of the retries of a replica waiting out a full disk.
const (
	FaultRetryMin = 50 * time.Millisecond
	FaultRetryMax = 5 * time.Second
)

// Reopener is implemented by storages that can drop their in-memory state and open again
// from disk, as a restart would (WAL: a write that failed may have left a partial record and
// an index that counts it). A replica whose disk filled needs it to rejoin by itself.
// Reopen is called from the replica's goroutine, with no write in flight.
type Reopener interface {
	Reopen() error
}

// IsDiskFull reports whether a storage error is a full disk or an exhausted quota.
func IsDiskFull(err error) bool {
	return errors.Is(err, ErrDiskFull) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Fault returns the storage failure the replica is waiting out (errors.Is ErrDiskFull) and
// since when; a nil error when it takes part normally.
func (r *Replica) Fault() (since time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.faultSince, r.fault
}

// waitOutFault handles a storage failure of the loop: a full disk is waited out until the
// replica can write again (nil: the node is rebuilt and the loop goes on); any other
// failure, or a storage that cannot reopen, is returned (the replica stops), as is
// ErrStopped when Close comes first.
func (r *Replica) waitOutFault(err error, recv <-chan Message) error {
	ro, ok := r.st.(Reopener)
	if !IsDiskFull(err) || !ok || errors.Is(err, ErrStopped) {
		return err
	}
	if !errors.Is(err, ErrDiskFull) {
		err = fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	r.log.Error("storage full: the replica steps down until it can write again", zap.Error(err))
	r.mu.Lock()
	r.fault, r.faultSince = err, time.Now()
	r.status.Role, r.status.Leader = Follower, 0
	r.mu.Unlock()
	if e := r.dropSaves(); e != nil {
		return e
	}
	r.failAll(err)
	r.readReady = nil
	backoff := FaultRetryMin
	if !r.faultEnded.IsZero() && time.Since(r.faultEnded) < 2*FaultRetryMax {
		backoff = min(2*r.faultBackoff, FaultRetryMax) // it filled again at once
	}
	t := time.NewTimer(backoff)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return ErrStopped
		case p := <-r.props:
			p.done <- result{err: err}
		case q := <-r.reads:
			q.done <- err
		case _, ok := <-recv:
			if !ok {
				recv = nil
			}
		case <-t.C:
			rerr := r.rebuild(ro)
			if rerr == nil {
				r.faultBackoff, r.faultEnded = backoff, time.Now()
				r.mu.Lock()
				since := r.faultSince
				r.fault, r.faultSince = nil, time.Time{}
				r.status = r.node.Status()
				r.mu.Unlock()
				r.log.Info("storage writable again: the replica rejoins", zap.Duration("after", time.Since(since)))
				return nil
			}
			if !IsDiskFull(rerr) {
				return fmt.Errorf("paxos: replica %d: reopening its storage after %v: %w", r.cfg.Node.ID, err, rerr)
			}
			r.log.Debug("storage still full", zap.Error(rerr), zap.Duration("retry_in", backoff))
			backoff = min(2*backoff, FaultRetryMax)
			t.Reset(backoff)
		}
	}
}

// dropSaves lets the writer finish every job it was handed and drops them all: nothing
// they carried is sent or advanced (the node is rebuilt from disk).
func (r *Replica) dropSaves() error {
	out := 0
	for _, j := range r.pipe.inflight {
		if j.sent && !j.back {
			out++
		}
	}
	for out > 0 {
		select {
		case b := <-r.saved:
			for _, j := range b {
				j.back = true
			}
			out -= len(b)
		case <-r.stop:
			return ErrStopped
		}
	}
	r.pipe = pipeline{}
	return nil
}

// rebuild reopens the storage, proves it takes a durable write again (the hard state it
// holds, written back: loading takes the highest), and rebuilds the node from it.
func (r *Replica) rebuild(ro Reopener) error {
	if err := ro.Reopen(); err != nil {
		return err
	}
	hs, ents, err := r.st.Load()
	if err != nil {
		return err
	}
	snap, err := r.st.LoadSnapshot()
	if err != nil {
		return err
	}
	if err := r.st.Save(HardState{Promised: hs.Promised, Commit: hs.Commit}, nil); err != nil {
		return err
	}
	n, err := NewNode(r.cfg.Node, hs, ents)
	if err != nil {
		return err
	}
	r.node, r.snap = n, snap
	r.waiting, r.readWait, r.readReady = map[uint64]*proposal{}, map[uint64]*readReq{}, nil
	r.setPeers(snap.Conf)
	return nil
}
