package paxos

// Catch-up: a replica whose commit index is behind is taught the chosen values
// (MsgChosen, batched) or, when they are compacted, the state machine snapshot
// (MsgSnapshot, bytes attached by the driver). Chosen values carry no epoch constraint:
// whoever knows them may teach them.

// maybeCatchUp sends peer, which reported commit index peerCommit, what it lacks: one
// batch in flight per peer, resent after an election timeout.
func (n *Node) maybeCatchUp(peer, peerCommit uint64) {
	if peerCommit >= n.log.commit {
		return
	}
	p := n.trk.pr(peer)
	if peerCommit < n.log.snap {
		// The values it lacks are compacted: the driver attaches the snapshot.
		if p.catchupTo >= n.log.snap && n.now-p.catchupAt < uint64(n.cfg.ElectionTicks) {
			return
		}
		p.catchupTo, p.catchupAt = n.log.snap, n.now
		n.send(Message{Type: MsgSnapshot, To: peer, Ballot: n.promised, Slot: n.log.snap, Commit: n.log.commit})
		return
	}
	if p.catchupTo > peerCommit && n.now-p.catchupAt < uint64(n.cfg.ElectionTicks) {
		return
	}
	to := min(n.log.commit, peerCommit+uint64(n.cfg.MaxBatch))
	ents := make([]Entry, 0, to-peerCommit)
	size := 0
	for s := peerCommit + 1; s <= to; s++ {
		e := n.log.at(s).e
		if size += len(e.Data); size > n.cfg.MaxBatchBytes && len(ents) > 0 {
			to = s - 1
			break
		}
		ents = append(ents, e)
	}
	p.catchupTo, p.catchupAt = to, n.now
	n.send(Message{Type: MsgChosen, To: peer, Ballot: n.promised, Commit: n.log.commit, Entries: ents})
}

// onChosen adopts chosen values that extend the commit index.
func (n *Node) onChosen(m Message) {
	for _, e := range m.Entries {
		if e.Slot != n.log.commit+1 {
			continue
		}
		b := max(m.Ballot, e.Ballot)
		if st := n.log.at(e.Slot); st != nil && st.e.Ballot > b {
			b = st.e.Ballot
		}
		e.Ballot = b
		if e.Epoch == 0 {
			e.Epoch = max(n.conf.Epoch, 1)
		}
		n.log.set(e)
		n.out.persist = append(n.out.persist, e)
		n.log.commit++
		if e.Type == EntryConfig {
			n.switchConf(n.log.commit, e)
		}
	}
	n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Commit: n.log.commit, KnownCommit: m.Commit})
}

// onSnapshot adopts a snapshot past the commit index (and its configuration).
func (n *Node) onSnapshot(m Message) {
	if m.Slot > n.log.commit && m.Snapshot != nil && (m.Conf.Epoch == 0 || usableConf(m.Conf)) {
		n.log.dropThrough(m.Slot)
		n.log.commit = m.Slot
		n.log.applied = m.Slot
		n.out.snapshot = &SnapshotData{Slot: m.Slot, Data: m.Snapshot, Conf: m.Conf.Clone()}
		n.out.hsDirty = true
		if m.Conf.Epoch > 0 && m.Conf.Epoch != n.conf.Epoch {
			// The snapshot crosses configuration changes: adopt its configuration.
			n.confs = []ConfState{m.Conf.Clone()}
			n.setConf(m.Conf.Clone())
			n.stopAt = 0
			n.dropStale(m.Slot)
			if n.role != Follower {
				n.stepDown(0)
			}
		} else {
			n.confs = []ConfState{n.ConfAt(m.Slot)}
		}
	}
	n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Commit: n.log.commit, KnownCommit: m.Commit})
}
