package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
)

// The commit path. Decisions are made under the controller's lock and applied to the
// cache at once; their commits queue in the order they were made (enqueueLocked) and one
// committer per term proposes the queue, each batch as one transaction (group commit): a
// decision's compares on records that an earlier decision of the batch writes are implied
// by the order and left out. So the versions a decision read are the versions the log has
// when it is applied, and a leader's own decisions never conflict with each other.
//
// A commit the log refuses (a compare failed: someone else wrote a record, an admin's raw
// write, another head that believed it led) is not a reason to rebuild: the records that
// batch and the decisions queued after it touched are read back from the log, and those
// gangs, machines, cordons and the queue configuration are given to the core again as
// deltas (reconcile). A commit whose outcome is unknown (no quorum, not the leader any
// more) ends the term: the next one starts from the log.

// queuedWork is decisions waiting for the log, and the channel that answers their maker.
type queuedWork struct {
	work []commitFn
	done chan error
}

// maxBatchOps bounds the ops of one transaction (a batch holds at least one decision).
const maxBatchOps = 1024

// workOps is what a decision weighs in a transaction: its ops and its events (each an
// event record and the events' counter).
func workOps(w commitFn) int { return len(w.ops) + 2*len(w.events) }

// splitWork cuts decisions made together into parts of at most maxBatchOps (a decision is
// never cut): stopping a job of 15,001 gangs was one transaction of some 45,000 ops, tens
// of megabytes that every replica had to take, decode and apply at once while its
// elections' heartbeats waited behind it, and the leadership moved for minutes
// (BENCHMARKS.md, the scale envelope). The parts are committed in order, each in a
// transaction of its own (or with others of the queue); decisions that fit one
// transaction stay in one.
func splitWork(work []commitFn) [][]commitFn {
	var parts [][]commitFn
	start, n := 0, 0
	for i, w := range work {
		k := workOps(w)
		if i > start && n+k > maxBatchOps {
			parts = append(parts, work[start:i])
			start, n = i, 0
		}
		n += k
	}
	return append(parts, work[start:])
}

// enqueueLocked queues decisions for the log, after those made before; the channel
// answers when they are committed (nil) or not (the first error of their parts: a part
// refused leaves the parts before it committed, and the records it touched read back).
func (c *Controller) enqueueLocked(t *term, work []commitFn) <-chan error {
	ch := make(chan error, 1)
	n := 0
	for _, w := range work {
		n += len(w.ops) + len(w.events)
	}
	if n == 0 {
		ch <- nil
		return ch
	}
	if c.t != t { // a timer of a term that ended
		ch <- c.notLeader()
		return ch
	}
	parts := splitWork(work)
	if len(parts) == 1 {
		t.queue = append(t.queue, &queuedWork{work: work, done: ch})
	} else {
		dones := make([]chan error, len(parts))
		for i, p := range parts {
			dones[i] = make(chan error, 1)
			t.queue = append(t.queue, &queuedWork{work: p, done: dones[i]})
		}
		go func() { // every part is answered: committed, refused or dropped with the term
			var first error
			for _, d := range dones {
				if err := <-d; err != nil && first == nil {
					first = err
				}
			}
			ch <- first
		}()
	}
	if prune := c.pruneEndedLocked(t); len(prune) > 0 {
		for _, p := range splitWork(prune) {
			t.queue = append(t.queue, &queuedWork{work: p, done: make(chan error, 1)})
		}
	}
	select {
	case t.kick <- struct{}{}:
	default:
	}
	return ch
}

// await waits for queued decisions to be committed, or for ctx.
func await(ctx context.Context, ch <-chan error) error {
	select {
	case err := <-ch:
		return err
	default:
	}
	releaseSlot(ctx) // it uses no CPU until the log answers (http.go)
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the commit: %v", api.ErrUnavailable, ctx.Err())
	}
}

// commitLoop is the term's committer.
func (c *Controller) commitLoop(t *term) {
	for {
		select {
		case <-t.kick:
		case <-t.ended:
		}
		for {
			c.mu.Lock()
			if c.t != t {
				rest := t.queue
				t.queue = nil
				c.mu.Unlock()
				answer(rest, c.notLeader())
				return
			}
			batch, n := []*queuedWork(nil), 0
			for len(t.queue) > 0 {
				q := t.queue[0]
				k := 0
				for _, w := range q.work {
					k += workOps(w)
				}
				if len(batch) > 0 && n+k > maxBatchOps {
					break
				}
				batch, n = append(batch, q), n+k
				t.queue = t.queue[1:]
			}
			c.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			c.commitBatch(t, batch)
		}
	}
}

func answer(qs []*queuedWork, err error) {
	for _, q := range qs {
		q.done <- err
	}
}

// commitBatch proposes a batch as one transaction and answers its decisions.
func (c *Controller) commitBatch(t *term, batch []*queuedWork) {
	req, evs, what := batchRequest(batch, c.obs)
	c.obs.txOps.Observe(float64(len(req.Ops)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := c.logw.propose(ctx, req)
	cancel()
	if err == nil {
		c.obs.committed(evs)
		answer(batch, nil)
		return
	}
	desc := strings.Join(what, ", ")
	if len(desc) > 300 {
		desc = desc[:300] + "..."
	}
	err = fmt.Errorf("head: commit %s: %w", desc, err)
	var refused *refusedError
	if !errors.Is(err, errConflict) && !errors.As(err, &refused) {
		// Not the leader any more, or the outcome is unknown: the next term starts from
		// the log.
		c.mu.Lock()
		if c.t == t {
			c.dropTermLocked(err.Error())
		}
		c.mu.Unlock()
		answer(batch, err)
		return
	}
	// The log refused it: read back what this batch and the decisions queued after it
	// touched, and give it to the core again.
	c.mu.Lock()
	later := t.queue
	t.queue = nil
	c.mu.Unlock()
	keys := map[string]bool{}
	for _, q := range append(append([]*queuedWork(nil), batch...), later...) {
		for _, w := range q.work {
			for _, cm := range w.cmp {
				keys[cm.Key] = true
			}
			for _, op := range w.ops {
				keys[op.Key] = true
			}
		}
	}
	c.log.Warn("the log refused a commit; the records it touched are read back", zap.Error(err), zap.Int("records", len(keys)))
	// Read back before answering: a caller told of the refusal acts again on the records
	// as the log has them, not on the refused decision's (a stop retried at once found its
	// gang already stopped in memory, and the read back then brought it back running).
	c.reconcile(t, keys)
	answer(batch, err)
	answer(later, fmt.Errorf("%w: an earlier decision was refused by the log: %v", api.ErrUnavailable, err))
}

// batchRequest is a batch's decisions as one transaction, with their events and what
// they are: a compare on a record that an earlier decision of the batch writes is implied
// by the order and left out.
func batchRequest(batch []*queuedWork, obs *ctlObs) (req meta.Request, evs []api.Event, what []string) {
	written, compared := map[string]bool{}, map[string]bool{}
	for _, q := range batch {
		for _, w := range q.work {
			for _, cm := range w.cmp {
				if !written[cm.Key] && !compared[cm.Key] {
					compared[cm.Key] = true
					req.Compares = append(req.Compares, cm)
				}
			}
			ops := w.ops
			if len(w.events) > 0 {
				ops = append(ops[:len(ops):len(ops)], obs.events.Ops(w.events)...)
			}
			for _, op := range ops {
				written[op.Key] = true
			}
			req.Ops = append(req.Ops, ops...)
			evs = append(evs, w.events...)
			what = append(what, w.what)
		}
	}
	return req, evs, what
}

// refusedError is a commit the state machine refused (malformed, stale).
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return "head: commit refused: " + e.msg }

// logWriter writes transactions to the Paxos log and measures them.
type logWriter struct {
	rep *paxos.Replica
	obs *ctlObs
}

// propose proposes one transaction through the log and waits until it is chosen.
func (c logWriter) propose(ctx context.Context, req meta.Request) error {
	if len(req.Ops) == 0 {
		return nil
	}
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	start := time.Now()
	out, err := c.rep.Propose(ctx, data)
	c.obs.commitTook(time.Since(start), err)
	if err != nil {
		var nl *paxos.NotLeaderError
		if errors.As(err, &nl) {
			return err
		}
		return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	var resp meta.Response
	if err := json.Unmarshal(out, &resp); err != nil {
		return fmt.Errorf("head: decode commit answer: %w", err)
	}
	if resp.Error != "" {
		return &refusedError{msg: resp.Error}
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %w", api.ErrUnavailable, errConflict)
	}
	return nil
}

// commit proposes one transaction outside the decision queue (the operator's
// configuration, which waits for its own commit before it is applied).
func (c logWriter) commit(ctx context.Context, cmp []meta.Compare, ops []meta.Op) error {
	return c.propose(ctx, meta.Request{Compares: cmp, Ops: ops})
}

// reconcile reads back the records of keys from the log and gives them to the cache and
// the core as deltas: gangs forgotten and restored with their records, machines joining or
// leaving, cordons, the queue configuration, the learned workload; then a cycle.
func (c *Controller) reconcile(t *term, keys map[string]bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := c.rep.Read(ctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t != t {
		return
	}
	if err != nil {
		c.dropTermLocked("reading the log back after a refused commit: " + err.Error())
		return
	}
	now := c.cfg.Clock()
	gangs := map[string]bool{}
	membership, reconfigure := false, false
	for key := range keys {
		switch {
		case key == api.TermKey:
			var tr api.ControlTerm
			kv, ok := c.sm.Get(api.TermKey)
			if ok && json.Unmarshal(kv.Value, &tr) == nil && tr.Term != t.id {
				c.dropTermLocked(fmt.Sprintf("the log is at leader term %d, this head's is %d", tr.Term, t.id))
				return
			}
			if ok {
				t.termVer = kv.Version
			}
		case strings.HasPrefix(key, api.TableGangs):
			gangs[strings.TrimPrefix(key, api.TableGangs)] = true
		case strings.HasPrefix(key, api.TableWorkers):
			parts := strings.Split(strings.TrimPrefix(key, api.TableWorkers), "/")
			if len(parts) == 3 {
				gangs[parts[0]+"/"+parts[1]] = true
			}
		case strings.HasPrefix(key, api.TableMachines):
			name := strings.TrimPrefix(key, api.TableMachines)
			delete(t.machines, name)
			if kv, ok := c.sm.Get(key); ok {
				var m api.Machine
				if json.Unmarshal(kv.Value, &m) == nil {
					t.machines[name] = &machineEntry{rec: m, ver: kv.Version}
				}
			}
			if m := t.machines[name]; m != nil && m.rec.Alive {
				c.liveAlive(name, m.rec.Incarnation, now)
			} else {
				c.liveDead(name)
			}
			membership = true
		case strings.HasPrefix(key, api.TableJobs):
			name := strings.TrimPrefix(key, api.TableJobs)
			delete(t.jobs, name)
			if kv, ok := c.sm.Get(key); ok {
				var j api.Job
				if json.Unmarshal(kv.Value, &j) == nil {
					t.jobs[name] = &jobEntry{rec: j, ver: kv.Version}
				}
			}
		case strings.HasPrefix(key, api.CordonsPrefix):
			name := strings.TrimPrefix(key, api.CordonsPrefix)
			delete(t.cordons, name)
			if kv, ok := c.sm.Get(key); ok {
				var cd api.Cordon
				if json.Unmarshal(kv.Value, &cd) == nil {
					t.cordons[name] = &cd
				}
			}
			t.cordonToCore(name)
		case key == api.SchedulerConfigKey:
			if kv, ok := c.sm.Get(key); ok {
				var conf api.SchedulerConfig
				if json.Unmarshal(kv.Value, &conf) == nil && conf.Validate() == nil {
					t.conf, t.confVer, reconfigure = conf, kv.Version, true
				}
			}
		case key == api.WorkloadKey:
			if kv, ok := c.sm.Get(key); ok && t.sched != nil {
				var w gang.LearnedWorkload
				if json.Unmarshal(kv.Value, &w) == nil {
					t.sched.SetLearnedWorkload(w)
				}
			}
		case key == api.RuntimesKey:
			if kv, ok := c.sm.Get(key); ok && t.sched != nil {
				var r gang.LearnedRuntimes
				if json.Unmarshal(kv.Value, &r) == nil {
					t.sched.SetLearnedRuntimes(r)
				}
			}
		case strings.HasPrefix(key, api.CostsPrefix):
			if m := modelOfCostsKey(key); m != "" {
				c.costsChangedLocked(t, m) // committed again with the next batch
			}
		}
	}
	var work []commitFn
	if reconfigure {
		work = append(work, c.reconfigureLocked(t, now)...)
	}
	keysOf := make([]string, 0, len(gangs))
	for k := range gangs {
		keysOf = append(keysOf, k)
	}
	sort.Strings(keysOf)
	// Forget them all first, then restore them from the log: a placement restored must not
	// meet the stale one of another.
	for _, k := range keysOf {
		if t.sched != nil {
			_ = t.sched.Finish(k, now)
		}
		t.stopGangTimers(k)
	}
	for _, k := range keysOf {
		t.dropGang(k)
		kv, ok := c.sm.Get(api.TableGangs + k)
		if !ok {
			continue
		}
		var rec api.Gang
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		e := &gangEntry{rec: rec, ver: kv.Version, ready: map[int]api.Worker{}}
		for _, wkv := range c.sm.Range(api.TableWorkers + k + "/") {
			var w api.Worker
			if json.Unmarshal(wkv.Value, &w) == nil && w.Generation == rec.Generation && w.GangUID == rec.UID {
				e.ready[w.Rank] = w
			}
		}
		if rec.Sched != nil {
			t.seq = max(t.seq, rec.Sched.Seq)
		}
		t.putGang(k, e)
		work = append(work, c.loadGangLocked(t, e, now)...)
	}
	if membership {
		work = append(work, c.membershipLocked(t, now)...)
	}
	work = append(work, c.cycleLocked(t, now)...)
	c.log.Info("records read back from the log and given to the scheduler", zap.Int("gangs", len(keysOf)), zap.Bool("machines", membership))
	_ = c.enqueueLocked(t, work)
	c.notifyLocked()
}

// stopGangTimers stops a gang's restart and notice timers.
func (l *ledger) stopGangTimers(key string) {
	if tm := l.timers[key]; tm != nil {
		tm.Stop()
		delete(l.timers, key)
	}
	l.stopNoticeTimer(key)
}
