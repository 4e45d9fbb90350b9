package paxos

import "fmt"

// The asynchronous WAL writer. The ordering rules live in pipeline, which is pure: the
// Replica drives it with a writer goroutine (below), and the deterministic simulation
// drives it with a seeded writer that completes writes late, fails them and loses them in
// crashes, so that the rules are checked by its linearizability and durability checks.
//
// The rules (Ready's contract):
//  1. A Ready's SendFirst (the leader's Accepts) may leave at once: the leader counts its
//     own acceptance only at Advance.
//  2. A Ready that must be persisted is queued to the writer; its Messages leave, and the
//     node is advanced, only once its write and every earlier write are durable.
//  3. A Ready with nothing to persist but with Messages, while writes are in flight,
//     waits behind them (a reply may describe state that an earlier write makes durable).
//  4. Any other Ready is advanced at once.
//  5. Committed entries may be applied at once: a durable majority holds them.
// The writer merges every queued job into one record (the last hard state stands for
// all: it only grows) and one fsync: group commit.

// saveJob is one Ready queued to the writer.
type saveJob struct {
	rd  Ready
	err error // set by the writer
	// sent and back are the loop's: the job went to the writer, and came back from it.
	sent, back bool
}

// pipeline is the order between a Node's Readies and their writes (rules 2-4).
type pipeline struct {
	inflight []*saveJob // queued to the writer and not finished, oldest first
}

// submit takes a Ready whose SendFirst have been sent. It returns the job to hand to the
// writer (nil when none is needed) and the messages that may be sent now.
func (p *pipeline) submit(n *Node, rd Ready) (*saveJob, []Message) {
	if rd.MustPersist || (len(p.inflight) > 0 && len(rd.Messages) > 0) {
		j := &saveJob{rd: rd}
		p.inflight = append(p.inflight, j)
		return j, nil
	}
	n.Advance(rd)
	return nil, rd.Messages
}

// busy reports whether writes are in flight.
func (p *pipeline) busy() bool { return len(p.inflight) > 0 }

// finished is told that the writer completed batch (the oldest jobs in flight, in order).
// It advances the node past each job and returns the messages that may now be sent, or
// the first write's error (the replica must then stop: it cannot persist).
func (p *pipeline) finished(n *Node, batch []*saveJob) ([]Message, error) {
	var send []Message
	for _, j := range batch {
		if len(p.inflight) == 0 || p.inflight[0] != j {
			return send, fmt.Errorf("paxos: a write finished out of order (%d in flight)", len(p.inflight))
		}
		p.inflight = p.inflight[1:]
		if j.err != nil {
			return send, j.err
		}
		send = append(send, j.rd.Messages...)
		n.Advance(j.rd)
	}
	return send, nil
}

// mergeSaves is the one record the writer persists for a batch of jobs: the last hard
// state and every entry in order. must is false when no job needs a write.
func mergeSaves(batch []*saveJob) (hs HardState, ents []Entry, must bool) {
	for _, j := range batch {
		if j.rd.MustPersist {
			must = true
			ents = append(ents, j.rd.Entries...)
		}
	}
	return batch[len(batch)-1].rd.HardState, ents, must
}

// writer persists queued jobs in order, merging all that are queued into one record and
// one fsync, and hands each batch back to the loop.
func (r *Replica) writer() {
	defer close(r.writerDone)
	for {
		var job *saveJob
		select {
		case job = <-r.saveq:
		case <-r.stop:
			return
		}
		batch := []*saveJob{job}
	more:
		for len(batch) < 4096 {
			select {
			case j := <-r.saveq:
				batch = append(batch, j)
			default:
				break more
			}
		}
		var err error
		if hs, ents, must := mergeSaves(batch); must {
			err = r.st.Save(hs, ents)
		}
		for _, j := range batch {
			j.err = err
		}
		select {
		case r.saved <- batch:
		case <-r.stop:
			return
		}
	}
}

// finishSaves sends what waited for a finished write and lets the node count it.
func (r *Replica) finishSaves(batch []*saveJob) error {
	for _, j := range batch {
		j.back = true
	}
	send, err := r.pipe.finished(r.node, batch)
	r.sendAll(send)
	return err
}

// enqueueSave queues a write; while the queue is full it finishes completed writes, so
// the loop and the writer never wait on each other. It returns ErrStopped once Close began
// (the writer may have exited).
func (r *Replica) enqueueSave(j *saveJob) error {
	for {
		select {
		case r.saveq <- j:
			j.sent = true
			return nil
		case b := <-r.saved:
			if err := r.finishSaves(b); err != nil {
				return err
			}
		case <-r.stop:
			return ErrStopped
		}
	}
}

// waitSaves finishes every write in flight (before the loop touches the storage itself).
// It returns ErrStopped once Close began: the writer exits without finishing its batch.
func (r *Replica) waitSaves() error {
	for r.pipe.busy() {
		select {
		case b := <-r.saved:
			if err := r.finishSaves(b); err != nil {
				return err
			}
		case <-r.stop:
			return ErrStopped
		}
	}
	return nil
}
