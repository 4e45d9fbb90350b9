package paxos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Transport carries messages between replicas. Send is best effort (a message may be
// lost; Paxos retransmits) and must not block for long. Recv delivers inbound messages;
// it is read by one goroutine. Implementations: MemNetwork (tests, fault injection) and
// TCPTransport.
type Transport interface {
	Send(m Message)
	Recv() <-chan Message
	Close() error
}

// PeerSetter is implemented by transports that learn a replica's address at run time
// (TCPTransport). The replica calls it when AddReplica starts teaching a new replica and
// when a committed configuration names an address.
type PeerSetter interface {
	SetPeer(id uint64, addr string)
}

// StateMachine is the replicated application. Apply is called for every committed
// normal entry in slot order, from the replica's goroutine only; its result is returned
// to the proposer. After a restart Apply is called again from slot 1 (replay).
type StateMachine interface {
	Apply(slot uint64, data []byte) []byte
}

// Snapshotter is implemented by state machines that can be snapshotted; the replica then
// compacts its log every SnapshotEvery applied slots and catches up far-behind replicas
// with the snapshot. Both are called from the replica's goroutine.
type Snapshotter interface {
	// Snapshot returns the whole state and the last applied slot it covers.
	Snapshot() ([]byte, uint64, error)
	// Restore replaces the state with a snapshot's.
	Restore(data []byte) error
}

// Bounds of ReplicaConfig.TickInterval. A tick drives timers only (the election timeout
// is ElectionTicks of them), so below a millisecond it only burns CPU; above ten seconds an
// election would take minutes.
const (
	MinTickInterval = time.Millisecond
	MaxTickInterval = 10 * time.Second
)

// ReplicaConfig configures a Replica (the driver around Node).
type ReplicaConfig struct {
	// Node is the pure core's config.
	Node Config
	// TickInterval is the wall-clock length of one tick (default 10 ms), in
	// [MinTickInterval, MaxTickInterval].
	TickInterval time.Duration
	// MaxDrain caps how many queued proposals or messages one loop turn takes in; all of
	// them share one WAL write and fsync (group commit).
	MaxDrain int
	// SnapshotEvery is how many applied slots trigger a snapshot and log compaction when
	// the state machine is a Snapshotter (0 disables).
	SnapshotEvery uint64
	// Logger is the replica's logger (default zap.NewNop()).
	Logger *zap.Logger
}

// DefaultReplicaConfig returns a working config for replica id of the group peers.
func DefaultReplicaConfig(id uint64, peers []uint64) ReplicaConfig {
	return ReplicaConfig{Node: DefaultConfig(id, peers), TickInterval: 10 * time.Millisecond, MaxDrain: 4096, SnapshotEvery: 100000, Logger: zap.NewNop()}
}

// Bounds of the election timeout SetTiming accepts: at least MinElectionTicks ticks (with
// fewer, one late heartbeat is an election), at most a minute.
const (
	MinElectionTicks   = 5
	MaxElectionTimeout = time.Minute
)

// SetTiming sets the tick and the election timeout (the shortest silence of the leader
// after which a follower asks for an election; the timeout is randomized up to twice
// that). The heartbeat interval and the lease's clock-drift allowance follow: a fifth of
// the election timeout each (at least a tick), so that a leader sends about five
// heartbeats per timeout and its lease, renewed by each, lasts four fifths of one. On a
// loaded machine a 100 ms tick and a 1 s election timeout hold where 10 ms and 100 ms
// churn: a replica that misses its turn on the CPU for a few hundred milliseconds does
// not start an election, and its idle cost is ten timer wake-ups a second.
func (c *ReplicaConfig) SetTiming(tick, election time.Duration) error {
	if tick < MinTickInterval || tick > MaxTickInterval {
		return fmt.Errorf("%w: tick %v must be in [%v, %v]", ErrInvalidConfig, tick, MinTickInterval, MaxTickInterval)
	}
	if election > MaxElectionTimeout {
		return fmt.Errorf("%w: election timeout %v is over %v", ErrInvalidConfig, election, MaxElectionTimeout)
	}
	ticks := int((election + tick/2) / tick)
	if ticks < MinElectionTicks {
		return fmt.Errorf("%w: election timeout %v is %d ticks of %v; it must be at least %d ticks (%v)", ErrInvalidConfig, election, ticks, tick, MinElectionTicks, MinElectionTicks*tick)
	}
	c.TickInterval = tick
	c.Node.ElectionTicks = ticks
	c.Node.HeartbeatTicks = max(1, ticks/5)
	c.Node.LeaseDriftTicks = max(1, ticks/5)
	return nil
}

// Validate checks the config.
func (c ReplicaConfig) Validate() error {
	if err := c.Node.Validate(); err != nil {
		return err
	}
	if c.TickInterval < MinTickInterval || c.TickInterval > MaxTickInterval {
		return fmt.Errorf("%w: TickInterval %v must be in [%v, %v]", ErrInvalidConfig, c.TickInterval, MinTickInterval, MaxTickInterval)
	}
	if c.MaxDrain < 1 {
		return fmt.Errorf("%w: MaxDrain %d < 1", ErrInvalidConfig, c.MaxDrain)
	}
	return nil
}

type result struct {
	val []byte
	err error
}

type proposal struct {
	typ  EntryType
	data []byte
	done chan result
}

type readReq struct {
	done chan error
}

// Replica runs one Paxos replica: it owns a Node, a Storage, a Transport and the
// StateMachine, in one goroutine. Propose and Read are safe for concurrent use.
type Replica struct {
	cfg  ReplicaConfig
	log  *zap.Logger
	node *Node
	st   Storage
	tr   Transport
	sm   StateMachine

	props chan *proposal
	reads chan *readReq
	ctrl  chan func()
	stop  chan struct{}
	done  chan struct{}

	// The WAL writer goroutine (writer.go): Readies queue in order; each turn merges
	// everything queued into one record and one fsync, then hands the batch back.
	saveq      chan *saveJob
	saved      chan []*saveJob
	writerDone chan struct{}
	pipe       pipeline // loop-owned: the order of writes, sends and Advance

	mu     sync.Mutex
	status Status
	// preLogged is the last pre-vote round logged, preRefused the refusals its round heard.
	preLogged, preRefused uint64
	err                   error
	// fault is the storage failure the replica is waiting out (a full disk), nil when
	// none; faultSince when it began (diskfull.go).
	fault      error
	faultSince time.Time
	// leaseUntil is when this leader's lease ends on the wall clock (monotonic): past it,
	// Leading is false even if the loop has not run since (a paused process).
	leaseUntil time.Time
	watchers   []chan struct{} // closed at the next change of role or leader
	// t0 is the instant of tick 0: the node has been ticked once per TickInterval since
	// (loop-owned; moved forward after a long stall, see catchUp; reset when the node is
	// rebuilt).
	t0 time.Time

	// loop-owned
	waiting  map[uint64]*proposal
	readWait map[uint64]*readReq
	// caughtUp is how many ticks the last catchUp applied at once (logged with a change
	// of leadership).
	caughtUp   uint64
	readReady  []ReadState
	nextReadID uint64
	snap       SnapshotData
	// applied is the last slot the state machine has applied: a node rebuilt from storage
	// after a storage failure hands out again slots the state machine already holds.
	applied uint64
	// faultBackoff and faultEnded are the retry backoff of the last fault and when it
	// ended: a disk that fills again at once is retried ever more slowly.
	faultBackoff time.Duration
	faultEnded   time.Time
}

// StartReplica loads the storage, builds the Node and starts the replica's goroutine.
func StartReplica(cfg ReplicaConfig, st Storage, tr Transport, sm StateMachine) (*Replica, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hs, ents, err := st.Load()
	if err != nil {
		return nil, fmt.Errorf("paxos: replica %d load: %w", cfg.Node.ID, err)
	}
	snap, err := st.LoadSnapshot()
	if err != nil {
		return nil, fmt.Errorf("paxos: replica %d load snapshot: %w", cfg.Node.ID, err)
	}
	if snap.Slot > 0 {
		ss, ok := sm.(Snapshotter)
		if !ok {
			return nil, fmt.Errorf("paxos: replica %d has a snapshot through slot %d but its state machine cannot restore it", cfg.Node.ID, snap.Slot)
		}
		if err := ss.Restore(snap.Data); err != nil {
			return nil, fmt.Errorf("paxos: replica %d restore snapshot through %d: %w", cfg.Node.ID, snap.Slot, err)
		}
	}
	n, err := NewNode(cfg.Node, hs, ents)
	if err != nil {
		return nil, fmt.Errorf("paxos: replica %d restore: %w", cfg.Node.ID, err)
	}
	r := &Replica{
		cfg: cfg, log: cfg.Logger.Named("paxos").With(zap.Uint64("replica", cfg.Node.ID)),
		node: n, st: st, tr: tr, sm: sm,
		props:      make(chan *proposal, cfg.MaxDrain),
		reads:      make(chan *readReq, 1024),
		ctrl:       make(chan func()),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		saveq:      make(chan *saveJob, 4096),
		saved:      make(chan []*saveJob, 64),
		writerDone: make(chan struct{}),
		waiting:    map[uint64]*proposal{},
		readWait:   map[uint64]*readReq{},
		snap:       snap,
		applied:    snap.Slot,
	}
	r.status = n.Status()
	r.t0 = time.Now()
	r.setPeers(snap.Conf)
	r.log.Info("replica started", zap.Uint64("promised", hs.Promised), zap.Uint64("commit", hs.Commit), zap.Int("entries", len(ents)))
	go r.writer()
	go r.run()
	return r, nil
}

func (r *Replica) sendAll(msgs []Message) {
	for _, m := range msgs {
		if m.Type == MsgSnapshot {
			if m.Slot != r.snap.Slot {
				continue
			}
			m.Snapshot = r.snap.Data
			m.Conf = r.snap.Conf
		}
		r.tr.Send(m)
	}
}

// Status returns the replica's latest state.
func (r *Replica) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Leading reports whether this replica leads and holds its lease at this instant: a
// majority acknowledged one of its heartbeats recently enough that no other replica can
// have been elected since (ElectionTicks minus the drift allowance, on the monotonic
// clock). A leader that was paused, or whose loop is starved, stops Leading when its
// lease runs out, before it has noticed anything itself: a caller that decides only while
// Leading never acts on a view older than the lease.
func (r *Replica) Leading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status.Role == Leader && time.Now().Before(r.leaseUntil)
}

// Changed returns a channel closed at the next change of this replica's role or of the
// leader it knows (a watch instead of polling Status).
func (r *Replica) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{})
	select {
	case <-r.done:
		close(ch) // stopped: nothing will change any more
	default:
		r.watchers = append(r.watchers, ch)
	}
	return ch
}

// catchUp ticks the node once per TickInterval elapsed since the last tick, so that its
// clock follows the wall clock's even when the loop was not scheduled for a while (the
// ticker drops the ticks of a slow receiver: a leader counting ticker events would think
// its lease still valid after a pause). After a stall of more than three election
// timeouts the surplus is skipped: every timer of the node has expired by then.
func (r *Replica) catchUp() {
	due := uint64(time.Since(r.t0) / r.cfg.TickInterval)
	now := r.node.Now()
	if due <= now {
		return
	}
	n := due - now
	if limit := uint64(3 * r.cfg.Node.ElectionTicks); n > limit {
		r.t0 = r.t0.Add(time.Duration(n-limit) * r.cfg.TickInterval)
		n = limit
	}
	r.caughtUp = n
	if r.node.Role() == Leader {
		r.stepQueued()
	}
	r.node.TickN(n)
}

// stepQueued steps the messages that wait in the transport's queue now, before a leader's
// ticks judge check-quorum on them: they are its followers' answers that arrived while its
// loop did not run, or was busy. Ticked first, a leader of 2,000 machines stepped down
// with 46 messages waiting (bench scale). A follower ticks first (catchUp): a leader's
// heartbeat stepped with a clock behind the wall's would be judged old once ticked.
func (r *Replica) stepQueued() {
	recv := r.tr.Recv()
	for i := len(recv); i > 0; i-- {
		select {
		case m, ok := <-recv:
			if !ok {
				return
			}
			r.node.Step(m)
		default:
			return
		}
	}
}

// Err returns the error that stopped the replica (a failed WAL write), or the storage
// failure it is waiting out (errors.Is ErrDiskFull: see Fault), or nil.
func (r *Replica) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	return r.fault
}

// Close stops the replica's goroutine and closes its storage (not the transport).
func (r *Replica) Close() error {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	<-r.writerDone
	return r.st.Close()
}

// Propose replicates data and returns the state machine's result for it once applied.
// On a follower it returns a *NotLeaderError (errors.Is ErrNotLeader) naming the leader;
// while no leader is known it waits, up to ctx's deadline. ErrProposalDropped means
// another leader filled the slot (retry). A ctx error leaves the outcome unknown.
func (r *Replica) Propose(ctx context.Context, data []byte) ([]byte, error) {
	for {
		p := &proposal{data: data, done: make(chan result, 1)}
		select {
		case r.props <- p:
		case <-r.done:
			return nil, ErrStopped
		case <-ctx.Done():
			return nil, fmt.Errorf("paxos: propose: %w", ctx.Err())
		}
		var res result
		select {
		case res = <-p.done:
		case <-r.done:
			return nil, ErrStopped
		case <-ctx.Done():
			return nil, fmt.Errorf("paxos: propose (outcome unknown): %w", ctx.Err())
		}
		if nl, ok := res.err.(*NotLeaderError); (ok && (nl.Leader == 0 || nl.Leader == r.cfg.Node.ID)) || errors.Is(res.err, ErrReconfiguring) {
			if err := r.waitElection(ctx); err != nil {
				return nil, err
			}
			continue
		}
		return res.val, res.err
	}
}

func (r *Replica) waitElection(ctx context.Context) error {
	if err := r.waitTick(ctx); err != nil {
		if errors.Is(err, ErrStopped) {
			return err
		}
		return fmt.Errorf("paxos: no leader elected before deadline: %w: %w", ErrNotLeader, err)
	}
	return nil
}

// waitTick waits one tick, or returns ErrStopped or ctx's error.
func (r *Replica) waitTick(ctx context.Context) error {
	t := time.NewTimer(r.cfg.TickInterval)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Read waits until this replica may serve a linearizable read: it is the leader, its
// lease (or a read-index heartbeat round) confirms it, and everything committed before
// the call has been applied. Then the caller reads its state machine directly.
// On a follower it returns a *NotLeaderError; during an election it waits up to ctx.
func (r *Replica) Read(ctx context.Context) error {
	for {
		q := &readReq{done: make(chan error, 1)}
		select {
		case r.reads <- q:
		case <-r.done:
			return ErrStopped
		case <-ctx.Done():
			return fmt.Errorf("paxos: read: %w", ctx.Err())
		}
		var err error
		select {
		case err = <-q.done:
		case <-r.done:
			return ErrStopped
		case <-ctx.Done():
			return fmt.Errorf("paxos: read: %w", ctx.Err())
		}
		if nl, ok := err.(*NotLeaderError); ok && (nl.Leader == 0 || nl.Leader == r.cfg.Node.ID) {
			if werr := r.waitElection(ctx); werr != nil {
				return werr
			}
			continue
		}
		return err
	}
}

func (r *Replica) run() {
	defer func() {
		close(r.done)
		r.mu.Lock()
		for _, ch := range r.watchers {
			close(ch)
		}
		r.watchers = nil
		r.mu.Unlock()
	}()
	// No ticker: the loop sleeps until the node's next timer is due (an idle follower
	// wakes for the leader's heartbeats only), and catchUp ticks whatever elapsed.
	timer := time.NewTimer(r.cfg.TickInterval)
	defer timer.Stop()
	recv := r.tr.Recv()
	for {
		select {
		case <-r.stop:
			r.failAll(ErrStopped)
			return
		case <-timer.C:
			r.catchUp()
		case m, ok := <-recv:
			if !ok {
				recv = nil
				continue
			}
			if r.node.Role() == Leader {
				// An answer to the leader is stepped before its ticks judge (stepQueued).
				r.node.Step(m)
				r.catchUp()
			} else {
				r.catchUp() // time passed before anything else: a lease may have run out
				r.node.Step(m)
			}
		case p := <-r.props:
			r.catchUp()
			r.propose(p)
		case q := <-r.reads:
			r.catchUp()
			r.read(q)
		case f := <-r.ctrl:
			r.catchUp()
			f()
		case batch := <-r.saved:
			r.catchUp()
			if err := r.finishSaves(batch); err != nil {
				if err = r.waitOutFault(err, recv); err != nil {
					r.fatal(err)
					return
				}
				continue
			}
		}
		r.drain(recv)
		if err := r.handleReady(); err != nil {
			if err = r.waitOutFault(err, recv); err != nil {
				r.fatal(err)
				return
			}
		}
		due := r.node.Now() + uint64(r.node.TicksUntilTimer())
		timer.Reset(time.Until(r.t0.Add(time.Duration(due) * r.cfg.TickInterval)))
	}
}

// fatal stops the replica after a storage failure: a replica that cannot persist must
// not answer (it would acknowledge what it may forget). ErrStopped is Close, not a failure.
func (r *Replica) fatal(err error) {
	if errors.Is(err, ErrStopped) {
		r.failAll(ErrStopped)
		return
	}
	r.log.Error("replica stopped: storage failed", zap.Error(err))
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	r.failAll(err)
}

// drain takes in everything already queued so one WAL write covers it (group commit).
func (r *Replica) drain(recv <-chan Message) {
	r.catchUp() // the turn's work (a control function, a wait for the writer) may have taken long
	for i := 0; i < r.cfg.MaxDrain; i++ {
		select {
		case p := <-r.props:
			r.propose(p)
		case m, ok := <-recv:
			if ok {
				r.node.Step(m)
			}
		case q := <-r.reads:
			r.read(q)
		default:
			return
		}
	}
}

func (r *Replica) propose(p *proposal) {
	slot, _, err := r.node.Propose(p.data)
	if err != nil {
		p.done <- result{err: err}
		return
	}
	r.waiting[slot] = p
}

func (r *Replica) read(q *readReq) {
	r.nextReadID++
	if err := r.node.ReadIndex(r.nextReadID); err != nil {
		q.done <- err
		return
	}
	r.readWait[r.nextReadID] = q
}

func (r *Replica) handleReady() error {
	for r.node.HasReady() {
		rd := r.node.Ready()
		for _, m := range rd.SendFirst {
			r.tr.Send(m)
		}
		if rd.Snapshot != nil {
			if err := r.waitSaves(); err != nil {
				return err
			}
			if err := r.installSnapshot(*rd.Snapshot); err != nil {
				return err
			}
		}
		job, send := r.pipe.submit(r.node, rd)
		if job != nil {
			if err := r.enqueueSave(job); err != nil {
				return err
			}
		}
		r.sendAll(send)
		for _, e := range rd.Committed {
			var out []byte
			switch {
			case e.Slot <= r.applied:
				// Applied before a storage failure rebuilt the node: the value chosen for a
				// slot never changes, so the state machine holds it already.
			case e.Type == EntryNormal:
				out = r.sm.Apply(e.Slot, e.Data)
			case e.Type == EntryConfig:
				r.applyConf(e)
				// The new configuration is in Status before the change's proposer is
				// answered: it reads Status next (the membership API answers with it).
				st := r.node.Status()
				r.mu.Lock()
				r.status.Epoch, r.status.Members = st.Epoch, st.Members
				r.mu.Unlock()
			}
			r.applied = max(r.applied, e.Slot)
			if p, ok := r.waiting[e.Slot]; ok {
				delete(r.waiting, e.Slot)
				if e.Type == p.typ && bytes.Equal(e.Data, p.data) {
					p.done <- result{val: out}
				} else {
					p.done <- result{err: ErrProposalDropped}
				}
			}
		}
		for _, id := range rd.ReadsDropped {
			if q, ok := r.readWait[id]; ok {
				delete(r.readWait, id)
				q.done <- &NotLeaderError{Leader: r.node.Leader()}
			}
		}
		r.readReady = append(r.readReady, rd.ReadsReady...)
		st := r.node.Status()
		kept := r.readReady[:0]
		for _, rs := range r.readReady {
			if st.Applied >= rs.Index {
				if q, ok := r.readWait[rs.ID]; ok {
					delete(r.readWait, rs.ID)
					q.done <- nil
				}
			} else {
				kept = append(kept, rs)
			}
		}
		r.readReady = kept
	}
	if err := r.maybeSnapshot(); err != nil {
		return err
	}
	st := r.node.Status()
	var until time.Time
	if end, ok := r.node.LeaseExpiry(); ok {
		until = r.t0.Add(time.Duration(end) * r.cfg.TickInterval)
	}
	r.mu.Lock()
	if st.Role != r.status.Role || st.Leader != r.status.Leader {
		for _, ch := range r.watchers {
			close(ch)
		}
		r.watchers = nil
		// Elections are rare and an operator's first question after a failover: log each
		// change of role or leader with what this replica knew then.
		// caught_up_ticks and queued_messages tell a replica that was starved from one that
		// was not heard: the ticks its last catch-up applied at once (a starved loop ticks
		// the time it missed before it reads what arrived meanwhile), and the messages
		// then waiting to be read.
		r.log.Info("leadership changed", zap.Stringer("role", st.Role), zap.Uint64("leader", st.Leader),
			zap.Uint64("ballot", st.Promised), zap.Uint64("commit", st.Commit), zap.Uint64("applied", st.Applied),
			zap.Stringer("was", r.status.Role), zap.Uint64("was_leader", r.status.Leader),
			zap.Uint64("caught_up_ticks", r.caughtUp), zap.Int("queued_messages", len(r.tr.Recv())))
	}
	rounds, refused, since := r.node.PreVotes()
	if rounds != r.preLogged {
		// Each pre-vote asked (rare: once per election timeout without a leader), with
		// the refusals the one before heard: an election that takes several timeouts
		// says why in the logs.
		r.log.Info("pre-vote asked", zap.Uint64("round", rounds), zap.Uint64("ballot", st.Promised),
			zap.Duration("since_leader_heard", time.Duration(since)*r.cfg.TickInterval), zap.Uint64("previous_refusals", r.preRefused))
		r.preLogged = rounds
	}
	r.preRefused = refused
	r.status = st
	r.leaseUntil = until
	r.mu.Unlock()
	return nil
}

func (r *Replica) failAll(err error) {
	for s, p := range r.waiting {
		p.done <- result{err: err}
		delete(r.waiting, s)
	}
	for id, q := range r.readWait {
		q.done <- err
		delete(r.readWait, id)
	}
}

func (r *Replica) installSnapshot(s SnapshotData) error {
	ss, ok := r.sm.(Snapshotter)
	if !ok {
		return fmt.Errorf("paxos: replica %d got a snapshot but its state machine cannot restore one", r.cfg.Node.ID)
	}
	if err := r.st.SaveSnapshot(s); err != nil {
		return err
	}
	if err := ss.Restore(s.Data); err != nil {
		return fmt.Errorf("paxos: restore snapshot through %d: %w", s.Slot, err)
	}
	r.snap = s
	r.applied = s.Slot
	r.setPeers(s.Conf)
	r.log.Info("installed snapshot from leader", zap.Uint64("slot", s.Slot), zap.Int("bytes", len(s.Data)))
	return r.st.Compact(s.Slot)
}

func (r *Replica) maybeSnapshot() error {
	ss, ok := r.sm.(Snapshotter)
	if !ok || r.cfg.SnapshotEvery == 0 {
		return nil
	}
	applied := r.node.Status().Applied
	if applied < r.snap.Slot+r.cfg.SnapshotEvery {
		return nil
	}
	if err := r.waitSaves(); err != nil { // the storage is the writer's while it works
		return err
	}
	data, slot, err := ss.Snapshot()
	if err != nil {
		return fmt.Errorf("paxos: snapshot: %w", err)
	}
	if slot > applied || slot <= r.snap.Slot {
		return nil
	}
	s := SnapshotData{Slot: slot, Data: data, Conf: r.node.ConfAt(slot)}
	if err := r.st.SaveSnapshot(s); err != nil {
		return err
	}
	if err := r.node.Compact(slot); err != nil {
		return err
	}
	r.snap = s
	r.log.Debug("snapshot taken, log compacted", zap.Uint64("slot", slot), zap.Int("bytes", len(data)))
	return r.st.Compact(slot)
}

// applyConf tells the transport the addresses a committed configuration names.
func (r *Replica) applyConf(e Entry) {
	c, err := DecodeConfState(e.Data)
	if err != nil {
		r.log.Error("undecodable configuration entry", zap.Uint64("slot", e.Slot), zap.Error(err))
		return
	}
	r.setPeers(c)
	r.log.Info("configuration changed", zap.Uint64("slot", e.Slot), zap.Uint64("epoch", c.Epoch),
		zap.Uint64s("members", c.Members), zap.Bool("member", c.Has(r.cfg.Node.ID)))
}

// setPeers hands a configuration's addresses to the transport.
func (r *Replica) setPeers(c ConfState) {
	if ps, ok := r.tr.(PeerSetter); ok {
		for id, addr := range c.Addrs {
			ps.SetPeer(id, addr)
		}
	}
}

// do runs f on the replica's goroutine (it owns the node) and waits for it.
func (r *Replica) do(ctx context.Context, f func()) error {
	done := make(chan struct{})
	select {
	case r.ctrl <- func() { f(); close(done) }:
	case <-r.done:
		return ErrStopped
	case <-ctx.Done():
		return fmt.Errorf("paxos: %w", ctx.Err())
	}
	select {
	case <-done:
		return nil
	case <-r.done:
		return ErrStopped
	}
}

// AddReplica adds replica id (reachable at addr) to the group, through the log. It must be
// called on the leader (otherwise a *NotLeaderError names it). The new replica, started
// with Config.Join, first learns the log as a non-voting learner (catch-up by chosen
// values or snapshot) until it holds everything committed when the call began; then the
// configuration entry is proposed, and the call returns once it is chosen and the new
// configuration, which counts the replica in every quorum, governs the following slots.
// One change at a time: a change already in flight is waited for, within ctx.
func (r *Replica) AddReplica(ctx context.Context, id uint64, addr string) error {
	var target uint64
	var err error
	if e := r.do(ctx, func() {
		if ps, ok := r.tr.(PeerSetter); ok && addr != "" {
			ps.SetPeer(id, addr)
		}
		if r.node.Conf().Has(id) {
			err = fmt.Errorf("%w: replica %d is already a member", ErrBadConfChange, id)
			return
		}
		err = r.node.AddLearner(id)
		target = r.node.Status().Commit
	}); e != nil {
		return fmt.Errorf("paxos: add replica %d: %w", id, e)
	}
	if err != nil {
		return fmt.Errorf("paxos: add replica %d: %w", id, err)
	}
	var lc uint64
	var reported bool
	for {
		var caught bool
		e := r.do(ctx, func() {
			if lc, reported = r.node.LearnerCommit(id); !reported && r.node.Status().Role != Leader {
				err = &NotLeaderError{Leader: r.node.Leader()}
				return
			}
			caught = reported && lc >= target
		})
		if e == nil && err != nil {
			return fmt.Errorf("paxos: add replica %d: %w", id, err)
		}
		if e == nil && caught {
			break
		}
		if e == nil {
			e = r.waitTick(ctx)
		}
		if e != nil {
			if errors.Is(e, ErrStopped) {
				return e
			}
			heard := "never answered (is it running with Config.Join, and reachable at " + addr + "?)"
			if reported {
				heard = fmt.Sprintf("reached slot %d", lc)
			}
			return fmt.Errorf("paxos: add replica %d: it must hold slot %d before it joins, and %s: %w: %w", id, target, heard, ErrLearnerBehind, e)
		}
	}
	return r.changeConf(ctx, true, id, addr)
}

// RemoveReplica removes replica id from the group, through the log (see AddReplica). A
// removed leader steps down once the change is chosen; the remaining members elect a new
// one. The removed replica stops voting; it may then be shut down.
func (r *Replica) RemoveReplica(ctx context.Context, id uint64) error {
	return r.changeConf(ctx, false, id, "")
}

func (r *Replica) changeConf(ctx context.Context, add bool, id uint64, addr string) error {
	for {
		p := &proposal{typ: EntryConfig, done: make(chan result, 1)}
		var err error
		if e := r.do(ctx, func() {
			slot, _, perr := r.node.ProposeConfChange(add, id, addr)
			if perr != nil {
				err = perr
				return
			}
			p.data = r.node.log.at(slot).e.Data
			r.waiting[slot] = p
		}); e != nil {
			return fmt.Errorf("paxos: change configuration (replica %d): %w", id, e)
		}
		if errors.Is(err, ErrReconfiguring) {
			if e := r.waitTick(ctx); e != nil {
				if errors.Is(e, ErrStopped) {
					return e
				}
				return fmt.Errorf("paxos: change configuration (replica %d): a change already in flight did not finish before the deadline: %w: %w", id, ErrReconfiguring, e)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("paxos: change configuration (replica %d): %w", id, err)
		}
		select {
		case res := <-p.done:
			if res.err != nil {
				return fmt.Errorf("paxos: change configuration (replica %d): %w", id, res.err)
			}
			return nil
		case <-r.done:
			return ErrStopped
		case <-ctx.Done():
			return fmt.Errorf("paxos: change configuration (replica %d), outcome unknown: %w", id, ctx.Err())
		}
	}
}
