package paxos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The deterministic simulation: a seeded scheduler of message delivery (drops, duplicates,
// reordering, delays, partitions including a leader cut off from the majority), crashes with
// restart from the persisted state, and a disk that fails writes (the replica crashes).
// Each replica's Readies go through the Replica's own write pipeline (writer.go) to a seeded
// asynchronous writer: writes complete several time units later, merge everything queued
// (group commit), fail, or are lost in a crash, so the pipeline's ordering (persist before
// send, advance after persist) is checked here too.
// Clients run a key-value workload; the history is checked with porcupine, acknowledged
// writes are checked present in the final logs, and every slot's chosen value is checked
// unique across all replicas.

const tickEvery = 10 // time units per tick

type simOpts struct {
	nodes      int
	clients    int
	duration   int64 // time units of faulty run
	drop       float64
	dup        float64
	crash      float64 // per tick, per node
	diskFail   float64 // per write (one write merges every Ready queued behind it)
	partition  float64 // per tick
	leaseDrift int
	compact    float64 // per tick, per node: snapshot + log compaction
	// reconfig runs membership changes 3→4→5→4→3 through the log (nodes must be 5: 4
	// and 5 start as joiners); reconfigRate is the chance per tick of an attempt.
	reconfig     bool
	reconfigRate float64
}

type kvInput struct {
	put   bool
	key   string
	value string
}

type kvOutput struct {
	value string
}

var kvModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(kvInput).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		in := input.(kvInput)
		if in.put {
			return true, in.value
		}
		return output.(kvOutput).value == state.(string), state
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(kvInput)
		if in.put {
			return fmt.Sprintf("put(%s,%s)", in.key, in.value)
		}
		return fmt.Sprintf("get(%s)->%q", in.key, output.(kvOutput).value)
	},
}

// simKV is the replicated state machine: a map with per-client dedup of puts.
type simKV struct {
	data    map[string]string
	lastOp  map[int]int
	applied uint64
}

func newSimKV() *simKV { return &simKV{data: map[string]string{}, lastOp: map[int]int{}} }

// command encoding: "client|op|P|key|value" or "client|op|G|key|".
func encodeCmd(client, op int, put bool, key, value string) []byte {
	t := "G"
	if put {
		t = "P"
	}
	return []byte(fmt.Sprintf("%d|%d|%s|%s|%s", client, op, t, key, value))
}

func (kv *simKV) apply(e Entry) string {
	kv.applied = e.Slot
	if e.Type != EntryNormal {
		return ""
	}
	parts := strings.SplitN(string(e.Data), "|", 5)
	client, _ := strconv.Atoi(parts[0])
	op, _ := strconv.Atoi(parts[1])
	if parts[2] == "G" {
		return kv.data[parts[3]]
	}
	if op <= kv.lastOp[client] {
		return ""
	}
	kv.lastOp[client] = op
	kv.data[parts[3]] = parts[4]
	return ""
}

type simMsg struct {
	at  int64
	seq int64
	m   Message
}

type simDisk struct {
	hs      HardState
	entries []Entry
	snap    SnapshotData
}

func (kv *simKV) snapshot() []byte {
	b, _ := json.Marshal(map[string]any{"data": kv.data, "last": kv.lastOp, "applied": kv.applied})
	return b
}

func restoreKV(b []byte) *simKV {
	var v struct {
		Data    map[string]string `json:"data"`
		Last    map[int]int       `json:"last"`
		Applied uint64            `json:"applied"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		panic(err)
	}
	return &simKV{data: v.Data, lastOp: v.Last, applied: v.Applied}
}

type simNode struct {
	id      uint64
	node    *Node // nil when crashed
	disk    simDisk
	kv      *simKV
	downTil int64
	// waiting proposals and reads: slot -> op, read id -> op
	props map[uint64]*simOp
	reads map[uint64]*simOp
	ready []ReadState // confirmed read indexes waiting for apply
	// the asynchronous writer: jobs queued behind the write in progress, and that write
	pipe    pipeline
	queued  []*saveJob
	writing []*saveJob
	writeAt int64 // time the write in progress completes
}

type simOp struct {
	client   int
	opID     int
	put      bool
	key      string
	value    string
	data     []byte
	call     int64
	ret      int64
	done     bool
	out      string
	viaRead  bool
	node     uint64
	deadline int64
	nextTry  int64
}

type sim struct {
	t         *testing.T
	rng       *rand.Rand
	o         simOpts
	now       int64
	seq       int64
	nodes     map[uint64]*simNode
	ids       []uint64
	net       []simMsg
	cut       map[[2]uint64]bool
	cutUntil  int64
	chosen    map[uint64]Entry
	clients   []*simOp
	opsDone   []*simOp
	opsAll    []*simOp
	opCount   map[int]int
	readID    uint64
	hint      uint64
	faulty    bool
	snapshots int
	// membership: the first configuration, and the newest committed one
	initial   []uint64
	conf      ConfState
	confSlots []uint64
	attempts  int
	// configuration changes committed while faults were being injected
	confUnderFaults int
	// the writer: writes that merged several Readies, and Readies lost in a crash while
	// queued or being written (their messages were never sent)
	groupWrites int
	lostJobs    int
}

func newSim(t *testing.T, seed int64, o simOpts) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewSource(seed)), o: o, nodes: map[uint64]*simNode{},
		cut: map[[2]uint64]bool{}, chosen: map[uint64]Entry{}, opCount: map[int]int{}, faulty: true}
	for i := 1; i <= o.nodes; i++ {
		s.ids = append(s.ids, uint64(i))
	}
	s.initial = s.ids
	if o.reconfig {
		s.initial = s.ids[:3]
	}
	s.conf = ConfState{Epoch: 1, Start: 1, Members: s.initial}
	for _, id := range s.ids {
		sn := &simNode{id: id}
		s.nodes[id] = sn
		s.restart(sn, seed)
	}
	s.clients = make([]*simOp, o.clients)
	return s
}

func (s *sim) cfg(id uint64, seed int64) Config {
	c := DefaultConfig(id, s.initial)
	c.Join = !slices.Contains(s.initial, id)
	c.Seed = seed*31 + int64(id) + s.now
	c.MaxBatch = 8
	c.LeaseDriftTicks = s.o.leaseDrift
	return c
}

func (s *sim) restart(sn *simNode, seed int64) {
	hs := sn.disk.hs
	hs.Snapshot = sn.disk.snap.Slot
	hs.Conf = sn.disk.snap.Conf
	hs.Commit = max(hs.Commit, hs.Snapshot)
	n, err := NewNode(s.cfg(sn.id, seed), hs, sn.disk.entries)
	if err != nil {
		s.t.Fatalf("restart %d: %v", sn.id, err)
	}
	sn.node = n
	sn.kv = newSimKV()
	if sn.disk.snap.Slot > 0 {
		sn.kv = restoreKV(sn.disk.snap.Data)
	}
	sn.props = map[uint64]*simOp{}
	sn.reads = map[uint64]*simOp{}
	sn.ready = nil
	sn.pipe, sn.queued, sn.writing = pipeline{}, nil, nil
}

// crash stops a replica: what its writer had not completed is lost, and what waited for
// it was never sent.
func (s *sim) crash(sn *simNode) {
	sn.node = nil
	s.lostJobs += len(sn.pipe.inflight)
	sn.pipe, sn.queued, sn.writing = pipeline{}, nil, nil
	sn.downTil = s.now + int64(20+s.rng.Intn(200))
}

func (s *sim) blocked(a, b uint64) bool { return s.cut[[2]uint64{a, b}] }

func (s *sim) enqueue(m Message) {
	if s.faulty && s.rng.Float64() < s.o.drop {
		return
	}
	copies := 1
	if s.faulty && s.rng.Float64() < s.o.dup {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		d := int64(1 + s.rng.Intn(8))
		if s.faulty && s.rng.Float64() < 0.05 {
			d += int64(s.rng.Intn(60))
		}
		s.seq++
		s.net = append(s.net, simMsg{at: s.now + d, seq: s.seq, m: m})
	}
}

// writeStep runs a replica's writer: it completes the write in progress when due, then
// starts one over everything queued (group commit), taking 1-4 time units (sometimes a
// stall of up to 34), during which the replica goes on handing out Readies.
func (s *sim) writeStep(sn *simNode) {
	if sn.node == nil {
		return
	}
	if len(sn.writing) > 0 && s.now >= sn.writeAt {
		batch := sn.writing
		sn.writing = nil
		if !s.completeWrite(sn, batch) {
			return
		}
		s.process(sn)
	}
	if len(sn.writing) == 0 && len(sn.queued) > 0 {
		sn.writing, sn.queued = sn.queued, nil
		sn.writeAt = s.now + int64(1+s.rng.Intn(4))
		if s.faulty && s.rng.Float64() < 0.05 {
			sn.writeAt += int64(s.rng.Intn(30))
		}
	}
}

// completeWrite persists a batch as the Replica's writer does (mergeSaves), or fails it
// (the replica crashes), and sends what waited for it. It reports whether the replica
// is still up.
func (s *sim) completeWrite(sn *simNode, batch []*saveJob) bool {
	if len(batch) > 1 {
		s.groupWrites++
	}
	if hs, ents, must := mergeSaves(batch); must {
		if s.faulty && s.rng.Float64() < s.o.diskFail {
			s.crash(sn) // the write failed: the replica stops before sending what waited
			return false
		}
		sn.disk.hs = hs
		sn.disk.entries = append(sn.disk.entries, ents...)
	}
	send, err := sn.pipe.finished(sn.node, batch)
	if err != nil {
		s.t.Fatalf("node %d: %v", sn.id, err)
	}
	for _, m := range send {
		s.sendFrom(sn, m)
	}
	return true
}

// flushWrites completes every write in flight now, as Replica.waitSaves does before the
// replica touches its storage itself (installing or taking a snapshot).
func (s *sim) flushWrites(sn *simNode) bool {
	batch := append(sn.writing, sn.queued...)
	sn.writing, sn.queued = nil, nil
	if len(batch) == 0 {
		return true
	}
	return s.completeWrite(sn, batch)
}

// sendFrom sends a replica's message, attaching its snapshot to a MsgSnapshot as the
// Replica does.
func (s *sim) sendFrom(sn *simNode, m Message) {
	if m.Type == MsgSnapshot {
		if m.Slot != sn.disk.snap.Slot {
			return
		}
		m.Snapshot = sn.disk.snap.Data
		m.Conf = sn.disk.snap.Conf
	}
	s.enqueue(m)
}

// process hands a node's Readies to the write pipeline, the network and its state machine.
func (s *sim) process(sn *simNode) {
	for sn.node != nil && sn.node.HasReady() {
		rd := sn.node.Ready()
		for _, m := range rd.SendFirst {
			s.enqueue(m)
		}
		if rd.Snapshot != nil {
			if !s.flushWrites(sn) {
				return
			}
			sn.disk.snap = *rd.Snapshot
			sn.kv = restoreKV(rd.Snapshot.Data)
			s.snapshots++
		}
		job, send := sn.pipe.submit(sn.node, rd)
		if job != nil {
			sn.queued = append(sn.queued, job)
		}
		for _, m := range send {
			s.sendFrom(sn, m)
		}
		for _, e := range rd.Committed {
			if prev, ok := s.chosen[e.Slot]; ok {
				if prev.Type != e.Type || !bytes.Equal(prev.Data, e.Data) {
					s.t.Fatalf("slot %d chosen twice: %q then %q (node %d)", e.Slot, prev.Data, e.Data, sn.id)
				}
			} else {
				s.chosen[e.Slot] = e
				if e.Type == EntryConfig {
					c, err := DecodeConfState(e.Data)
					if err != nil {
						s.t.Fatalf("slot %d: %v", e.Slot, err)
					}
					if c.Epoch != s.conf.Epoch+1 {
						s.t.Fatalf("slot %d: configuration epoch %d committed after epoch %d", e.Slot, c.Epoch, s.conf.Epoch)
					}
					if d := len(c.Members) - len(s.conf.Members); d != 1 && d != -1 {
						s.t.Fatalf("slot %d: configuration %v after %v changes more than one replica", e.Slot, c.Members, s.conf.Members)
					}
					c.Start = e.Slot + 1
					s.conf = c
					s.confSlots = append(s.confSlots, e.Slot)
					if s.faulty {
						s.confUnderFaults++
					}
				}
			}
			if e.Slot != sn.kv.applied+1 {
				s.t.Fatalf("node %d applied slot %d after %d", sn.id, e.Slot, sn.kv.applied)
			}
			out := sn.kv.apply(e)
			if op, ok := sn.props[e.Slot]; ok {
				delete(sn.props, e.Slot)
				if bytes.Equal(op.data, e.Data) && !op.done {
					op.out = out
					s.finish(op)
				}
			}
		}
		for _, r := range rd.ReadsReady {
			sn.ready = append(sn.ready, r)
		}
		for _, id := range rd.ReadsDropped {
			delete(sn.reads, id)
		}
		kept := sn.ready[:0]
		for _, r := range sn.ready {
			if sn.kv.applied >= r.Index {
				if op, ok := sn.reads[r.ID]; ok && !op.done {
					op.out = sn.kv.data[op.key]
					s.finish(op)
				}
				delete(sn.reads, r.ID)
			} else {
				kept = append(kept, r)
			}
		}
		sn.ready = kept
	}
}

func (s *sim) finish(op *simOp) {
	op.done = true
	op.ret = s.now
	s.opsDone = append(s.opsDone, op)
	s.clients[op.client] = nil
}

func (s *sim) leaderID() uint64 {
	var best uint64
	var bal uint64
	for _, id := range s.ids {
		sn := s.nodes[id]
		if sn.node != nil && sn.node.role == Leader && sn.node.promised > bal {
			best, bal = id, sn.node.promised
		}
	}
	return best
}

// clientStep starts or retries each client's current operation.
func (s *sim) clientStep(allowNew bool) {
	for c := range s.clients {
		op := s.clients[c]
		if op == nil {
			if !allowNew || s.rng.Intn(3) != 0 {
				continue
			}
			s.opCount[c]++
			op = &simOp{client: c, opID: s.opCount[c], key: fmt.Sprintf("k%d", s.rng.Intn(3)), call: s.now}
			r := s.rng.Intn(10)
			switch {
			case r < 5:
				op.put = true
				op.value = fmt.Sprintf("c%d-%d", c, op.opID)
			case r < 8:
				op.viaRead = true
			}
			op.data = encodeCmd(c, op.opID, op.put, op.key, op.value)
			s.clients[c] = op
			s.opsAll = append(s.opsAll, op)
		}
		if op.done || s.now < op.nextTry {
			continue
		}
		// Try (or retry after the deadline) at the hinted leader or a random replica.
		target := s.hint
		if target == 0 || s.rng.Intn(4) == 0 {
			target = s.ids[s.rng.Intn(len(s.ids))]
		}
		sn := s.nodes[target]
		op.nextTry = s.now + 150
		if sn.node == nil {
			op.nextTry = s.now + 5
			continue
		}
		if op.viaRead {
			s.readID++
			if err := sn.node.ReadIndex(s.readID); err != nil {
				s.hint = leaderHint(err)
				op.nextTry = s.now + 5
				continue
			}
			sn.reads[s.readID] = op
		} else {
			slot, _, err := sn.node.Propose(op.data)
			if err != nil {
				s.hint = leaderHint(err)
				op.nextTry = s.now + 5
				continue
			}
			sn.props[slot] = op
		}
		s.process(sn)
	}
}

func leaderHint(err error) uint64 {
	if nl, ok := err.(*NotLeaderError); ok {
		return nl.Leader
	}
	return 0
}

// reconfigTarget is the plan 3→4→5→4→3: add 4, add 5, then remove two members (random
// ones, the leader among the candidates).
func (s *sim) reconfigStep() {
	stage := int(s.conf.Epoch) - 1
	rate := s.o.reconfigRate
	if !s.faulty {
		rate = 0.3 // finish the plan while settling
	}
	if !s.o.reconfig || stage >= 4 || s.rng.Float64() >= rate {
		return
	}
	l := s.leaderID()
	if l == 0 {
		return
	}
	sn := s.nodes[l]
	n := sn.node
	s.attempts++
	switch stage {
	case 0, 1:
		id := uint64(4 + stage)
		if err := n.AddLearner(id); err != nil {
			return
		}
		// Usually wait for the learner to catch up first; sometimes add it at once
		// (safety must not depend on it).
		if lc, ok := n.LearnerCommit(id); !(ok && lc+5 >= n.log.commit) && s.rng.Intn(4) != 0 {
			s.process(sn)
			return
		}
		_, _, _ = n.ProposeConfChange(true, id, "")
	default:
		m := n.conf.Members
		_, _, _ = n.ProposeConfChange(false, m[s.rng.Intn(len(m))], "")
	}
	s.process(sn)
}

func (s *sim) faultStep() {
	for _, id := range s.ids {
		sn := s.nodes[id]
		if sn.node != nil && s.rng.Float64() < s.o.crash {
			s.crash(sn)
		}
	}
	if s.now >= s.cutUntil && len(s.cut) > 0 {
		s.cut = map[[2]uint64]bool{}
	}
	if len(s.cut) == 0 && s.rng.Float64() < s.o.partition {
		s.cutUntil = s.now + int64(100+s.rng.Intn(600))
		var side []uint64
		if l := s.leaderID(); l != 0 && s.rng.Intn(2) == 0 {
			side = []uint64{l} // the leader cut off from the majority
		} else {
			for _, id := range s.ids {
				if s.rng.Intn(2) == 0 {
					side = append(side, id)
				}
			}
		}
		in := map[uint64]bool{}
		for _, id := range side {
			in[id] = true
		}
		oneWay := s.rng.Intn(4) == 0
		for _, a := range s.ids {
			for _, b := range s.ids {
				if in[a] != in[b] {
					if !oneWay || in[a] {
						s.cut[[2]uint64{a, b}] = true
					}
				}
			}
		}
	}
}

func (s *sim) run() {
	end := s.o.duration
	settle := end + 3000
	for s.now = 1; s.now <= settle; s.now++ {
		if s.now == end {
			s.faulty = false
			s.cut = map[[2]uint64]bool{}
			for _, id := range s.ids {
				if sn := s.nodes[id]; sn.node == nil {
					sn.downTil = s.now
				}
			}
		}
		// restarts, then the writers
		for _, id := range s.ids {
			sn := s.nodes[id]
			if sn.node == nil && s.now >= sn.downTil {
				s.restart(sn, s.now)
			}
		}
		for _, id := range s.ids {
			s.writeStep(s.nodes[id])
		}
		if s.now%tickEvery == 0 {
			if s.faulty {
				s.faultStep()
			}
			s.reconfigStep()
			for _, id := range s.ids {
				if sn := s.nodes[id]; sn.node != nil {
					sn.node.Tick()
					s.process(sn)
				}
				if sn := s.nodes[id]; sn.node != nil && s.o.compact > 0 && s.rng.Float64() < s.o.compact {
					// snapshot the state machine, then compact the log and the "disk"
					// (after the writes in flight, as Replica.maybeSnapshot does)
					at := sn.kv.applied
					if at > sn.disk.snap.Slot && s.flushWrites(sn) {
						sn.disk.snap = SnapshotData{Slot: at, Data: sn.kv.snapshot(), Conf: sn.node.ConfAt(at)}
						if err := sn.node.Compact(at); err != nil {
							s.t.Fatal(err)
						}
						kept := sn.disk.entries[:0]
						for _, e := range sn.disk.entries {
							if e.Slot > at {
								kept = append(kept, e)
							}
						}
						sn.disk.entries = kept
					}
				}
			}
		}
		// deliver due messages, in a seeded random order among the due ones
		var due, later []simMsg
		for _, m := range s.net {
			if m.at <= s.now {
				due = append(due, m)
			} else {
				later = append(later, m)
			}
		}
		s.net = later
		s.rng.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
		for _, dm := range due {
			if s.faulty && s.blocked(dm.m.From, dm.m.To) {
				continue
			}
			sn := s.nodes[dm.m.To]
			if sn == nil || sn.node == nil {
				continue
			}
			sn.node.Step(dm.m)
			s.process(sn)
		}
		s.clientStep(s.now < end)
	}
}

func (s *sim) check() {
	t := s.t
	// 1. The whole group converged and every replica's log agrees with the chosen values.
	var maxCommit uint64
	for _, id := range s.ids {
		sn := s.nodes[id]
		if sn.node == nil {
			t.Fatalf("node %d down after settle", id)
		}
		maxCommit = max(maxCommit, sn.node.log.commit)
	}
	if maxCommit == 0 {
		t.Fatalf("nothing committed")
	}
	for _, id := range s.ids {
		sn := s.nodes[id]
		for slot := sn.node.log.snap + 1; slot <= sn.node.log.commit; slot++ {
			e := sn.node.log.at(slot).e
			c, ok := s.chosen[slot]
			if !ok || c.Type != e.Type || !bytes.Equal(c.Data, e.Data) {
				t.Fatalf("node %d slot %d holds %q, chosen %q", id, slot, e.Data, c.Data)
			}
		}
	}
	// Replicas that applied the same prefix hold the same state (snapshots included).
	var ref *simNode
	for _, id := range s.ids {
		sn := s.nodes[id]
		if ref == nil || sn.kv.applied > ref.kv.applied {
			ref = sn
		}
	}
	for _, id := range s.ids {
		sn := s.nodes[id]
		if sn.kv.applied == ref.kv.applied && fmt.Sprint(sn.kv.data) != fmt.Sprint(ref.kv.data) {
			t.Fatalf("node %d and %d applied through %d but differ: %v vs %v", id, ref.id, ref.kv.applied, sn.kv.data, ref.kv.data)
		}
	}
	// Membership: the plan completed, every replica's configuration agrees with the
	// committed one once it applied the change, and only a member leads.
	if s.o.reconfig {
		if len(s.conf.Members) != 3 || s.conf.Epoch != 5 {
			t.Fatalf("reconfiguration plan incomplete after settle: epoch %d members %v (%d attempts)", s.conf.Epoch, s.conf.Members, s.attempts)
		}
	}
	for _, id := range s.ids {
		sn := s.nodes[id]
		if sn.node.role == Leader && !s.conf.Has(id) {
			t.Fatalf("node %d leads but is not in the final configuration %v", id, s.conf.Members)
		}
		if s.o.reconfig && s.conf.Has(id) && sn.node.log.commit < s.conf.Start-1 {
			t.Fatalf("member %d did not learn the last configuration (commit %d < %d)", id, sn.node.log.commit, s.conf.Start-1)
		}
		if sn.node.log.commit >= s.conf.Start-1 && (sn.node.conf.Epoch != s.conf.Epoch || !slices.Equal(sn.node.conf.Members, s.conf.Members)) {
			t.Fatalf("node %d at commit %d has configuration %d %v, want %d %v", id, sn.node.log.commit, sn.node.conf.Epoch, sn.node.conf.Members, s.conf.Epoch, s.conf.Members)
		}
	}
	// 2. Acknowledged writes are in the chosen log (never lost).
	present := map[string]bool{}
	for _, e := range s.chosen {
		present[string(e.Data)] = true
	}
	for _, op := range s.opsDone {
		if op.put && !present[string(op.data)] {
			t.Fatalf("acknowledged write %q lost", op.data)
		}
	}
	// 3. Linearizable.
	var hist []porcupine.Operation
	for _, op := range s.opsAll {
		if !op.done {
			if !op.put {
				continue // a read that never returned has no effect
			}
			hist = append(hist, porcupine.Operation{ClientId: op.client, Input: kvInput{put: true, key: op.key, value: op.value},
				Call: op.call, Output: kvOutput{}, Return: 1 << 62})
			continue
		}
		hist = append(hist, porcupine.Operation{ClientId: op.client, Input: kvInput{put: op.put, key: op.key, value: op.value},
			Call: op.call, Output: kvOutput{value: op.out}, Return: op.ret})
	}
	res := porcupine.CheckOperationsTimeout(kvModel, hist, 20*time.Second)
	if res == porcupine.Illegal {
		t.Fatalf("history of %d ops is not linearizable", len(hist))
	}
	if len(s.opsDone) == 0 {
		t.Fatalf("no operation completed")
	}
}

func simSeeds(short, long int) int {
	if os.Getenv("ATOLL_LONG") != "" {
		return long
	}
	return short
}

func TestSimulation(t *testing.T) {
	base := simOpts{clients: 3, duration: 4000, drop: 0.05, dup: 0.03, crash: 0.002, diskFail: 0.002, partition: 0.01, leaseDrift: 2, compact: 0.01}
	cases := []struct {
		name  string
		nodes int
		seeds int
		mod   func(*simOpts)
	}{
		{"3-replicas", 3, simSeeds(220, 5000), nil},
		{"5-replicas", 5, simSeeds(110, 3000), nil},
		{"3-replicas-heavy-faults", 3, simSeeds(150, 2000), func(o *simOpts) { o.drop, o.dup, o.crash, o.partition = 0.2, 0.1, 0.01, 0.03 }},
		{"3-replicas-read-index-only", 3, simSeeds(80, 1500), func(o *simOpts) { o.leaseDrift = 100 }},
		{"reconfig-3-4-5-4-3", 5, simSeeds(150, 3000), func(o *simOpts) { o.reconfig, o.reconfigRate = true, 0.05 }},
		{"reconfig-heavy-faults", 5, simSeeds(60, 1000), func(o *simOpts) {
			o.reconfig, o.reconfigRate = true, 0.05
			o.drop, o.dup, o.crash, o.partition = 0.2, 0.1, 0.01, 0.03
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done, snaps, confs, groups, lost := 0, 0, 0, 0, 0
			for seed := int64(1); seed <= int64(tc.seeds); seed++ {
				o := base
				o.nodes = tc.nodes
				if tc.mod != nil {
					tc.mod(&o)
				}
				ok := t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
					s := newSim(t, seed, o)
					s.run()
					s.check()
					done += len(s.opsDone)
					snaps += s.snapshots
					confs += s.confUnderFaults
					groups += s.groupWrites
					lost += s.lostJobs
				})
				if !ok {
					return
				}
			}
			t.Logf("%d seeds, %d completed operations, %d snapshots installed by catch-up, %d configuration changes committed under faults, %d group writes, %d queued Readies lost in crashes",
				tc.seeds, done, snaps, confs, groups, lost)
			if groups == 0 || lost == 0 {
				t.Fatalf("the asynchronous writer was not exercised: %d group writes, %d Readies lost in crashes", groups, lost)
			}
		})
	}
}
