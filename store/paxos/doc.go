// Package paxos is Multi-Paxos as a pure state machine, shaped like etcd raft's RawNode:
// messages and ticks in, a Ready batch (what to persist, send and apply) out.
//
// The core (Node) does no I/O and starts no goroutines. A replica that times out runs
// phase 1 once with a ballot (round<<16 | id) for every slot above its commit index,
// re-proposes the highest-ballot value it learns for each open slot (a no-op fills a
// hole), appends a no-op to mark its start, and from then on runs phase 2 only: proposals
// are batched into one Accept per peer per Ready and pipelined without waiting. A leader
// counts its own acceptance once its write is durable (Advance), so its Accepts go out
// before its own fsync. Followers refuse to promise a rival for ElectionTicks after hearing
// the leader (and for ElectionTicks after a restart), which makes the leader lease safe;
// reads are served under the lease (with a clock-drift allowance) or after a read-index
// heartbeat round. A replica whose election timeout expires first asks the voters whether it
// could win (pre-vote, Config.PreVote), raising no ballot, so that a follower that was cut
// off or too slow cannot depose a healthy leader. Lagging or restarted replicas are caught
// up with chosen values.
//
// Membership changes one replica at a time through the log: a configuration entry
// (ProposeConfChange) chosen at slot i ends the current configuration epoch at i, and the
// next epoch, with its members and quorums, starts at slot i+1 (stop-the-world: nothing
// is proposed past the entry while it is in flight, values accepted past it in the old
// epoch are void, and messages are only acted on within one epoch). Snapshots carry the
// configuration. A replica being added (Config.Join) first learns the log as a learner.
//
// The core is split as etcd raft splits raft.go: node.go (roles, Tick, Step, replication),
// log.go, tracker.go (one progress per peer; at most MaxMembers voters), readonly.go (leases,
// read-index), confchange.go, catchup.go and ready.go.
//
// The driver ticks the core once per TickInterval elapsed on the monotonic clock, catching
// up the ticks a paused or starved loop missed, so leases are measured in real time.
//
// Around the core: Storage (WAL on tidwall/wal, with a locked directory and torn-tail
// repair; MemStorage), Transport (TCPTransport with length-prefixed protobuf frames, HMAC
// token authentication and optional mutual TLS; MemNetwork with faults), and Replica, the
// driver with an asynchronous writer and group commit (writer.go holds the ordering rules,
// which the deterministic simulation in the tests drives as well).
//
// Starting three in-process replicas with WALs in a temporary directory:
//
//	net := paxos.NewMemNetwork(1) // or paxos.NewTCPTransport per replica
//	ids := []uint64{1, 2, 3}
//	for _, id := range ids {
//		w, _ := paxos.OpenWAL(filepath.Join(dir, fmt.Sprint(id)), paxos.WALOptions{})
//		r, _ := paxos.StartReplica(paxos.DefaultReplicaConfig(id, ids), w, net.Transport(id), mySM)
//		defer r.Close()
//	}
//	result, err := r.Propose(ctx, cmd) // *NotLeaderError on a follower: retry at err.Leader
//	err = r.Read(ctx)                  // then read mySM: linearizable
//	err = leader.AddReplica(ctx, 4, "10.0.0.4:7000") // replica 4 started with Config.Join
//	err = leader.RemoveReplica(ctx, 2)
//
// store/metaserver.StartCluster does exactly this with the metadata state machine.
package paxos
