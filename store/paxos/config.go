package paxos

import (
	"fmt"
	"slices"
)

// Config configures the pure core (Node).
type Config struct {
	// ID is this replica's id: non-zero, below 2^16, unique in Peers.
	ID uint64
	// Peers lists every replica id of the group's first configuration (epoch 1), this one
	// included: at most MaxMembers (64). Later configurations come from the log (configuration entries) or from a
	// snapshot; restart a replica with the same Peers it was first started with.
	Peers []uint64
	// Join starts a replica that is not in the first configuration: it votes for nothing
	// and never campaigns until it has learned, from the log or a snapshot, a
	// configuration that includes it (Peers is then ignored and may be empty).
	Join bool
	// ElectionTicks is the minimum number of ticks without hearing from a leader before a
	// follower campaigns (the timeout is randomized in [ElectionTicks, 2*ElectionTicks)).
	// It is also how long a follower refuses to promise a rival after hearing the leader,
	// which is what makes the leader lease safe.
	ElectionTicks int
	// HeartbeatTicks is how often the leader sends an empty Accept carrying the commit index.
	HeartbeatTicks int
	// LeaseDriftTicks is the clock-drift bound: the leader trusts its lease only until
	// ElectionTicks-LeaseDriftTicks ticks after the heartbeat a majority acknowledged.
	// Set it to ElectionTicks (or more) to disable lease reads (read-index only).
	LeaseDriftTicks int
	// MaxBatch caps the entries in one Accept or catch-up message.
	MaxBatch int
	// MaxBatchBytes caps the data bytes in one Accept or catch-up message (a single larger
	// entry still goes alone); keep it well under the transport's frame limit.
	MaxBatchBytes int
	// Seed seeds the election timeout randomization (deterministic for a given seed).
	Seed int64
	// PreVote makes a replica whose election timeout expired first ask the voters whether
	// it could win (MsgPreVote), without raising any ballot; only when a majority (itself
	// included) has not heard a live leader within ElectionTicks does it run phase 1. A
	// follower that was partitioned away, or too slow to hear the heartbeats, then cannot
	// depose a healthy leader when it comes back with a higher ballot. It costs one round
	// trip per election. Default on.
	PreVote bool
}

// DefaultConfig returns a config for a replica with the given id in the given group:
// 10 ticks election timeout, heartbeat every tick, 2 ticks of drift allowance, pre-vote.
// With the driver's default 10 ms tick that is a 100-200 ms election timeout (in-process
// groups and tests); a group of processes on a loaded machine wants longer ticks
// (ReplicaConfig.SetTiming).
func DefaultConfig(id uint64, peers []uint64) Config {
	return Config{
		ID:              id,
		Peers:           slices.Clone(peers),
		ElectionTicks:   10,
		HeartbeatTicks:  1,
		LeaseDriftTicks: 2,
		MaxBatch:        4096,
		MaxBatchBytes:   8 << 20,
		Seed:            int64(id),
		PreVote:         true,
	}
}

// Validate checks the config for bad values and bad combinations.
func (c Config) Validate() error {
	if c.ID == 0 || c.ID > 0xffff {
		return fmt.Errorf("%w: ID %d must be in [1, 65535]", ErrInvalidConfig, c.ID)
	}
	if len(c.Peers) == 0 && !c.Join {
		return fmt.Errorf("%w: Peers is empty", ErrInvalidConfig)
	}
	if len(c.Peers) > MaxMembers {
		return fmt.Errorf("%w: %d peers, more than MaxMembers (%d)", ErrInvalidConfig, len(c.Peers), MaxMembers)
	}
	seen := map[uint64]bool{}
	for _, p := range c.Peers {
		if p == 0 || p > 0xffff {
			return fmt.Errorf("%w: peer id %d must be in [1, 65535]", ErrInvalidConfig, p)
		}
		if seen[p] {
			return fmt.Errorf("%w: peer id %d listed twice", ErrInvalidConfig, p)
		}
		seen[p] = true
	}
	if !seen[c.ID] && !c.Join {
		return fmt.Errorf("%w: ID %d is not in Peers %v", ErrInvalidConfig, c.ID, c.Peers)
	}
	if c.HeartbeatTicks < 1 {
		return fmt.Errorf("%w: HeartbeatTicks %d < 1", ErrInvalidConfig, c.HeartbeatTicks)
	}
	if c.ElectionTicks <= 2*c.HeartbeatTicks {
		return fmt.Errorf("%w: ElectionTicks %d must exceed 2*HeartbeatTicks (%d)", ErrInvalidConfig, c.ElectionTicks, 2*c.HeartbeatTicks)
	}
	if c.LeaseDriftTicks < 0 {
		return fmt.Errorf("%w: LeaseDriftTicks %d < 0", ErrInvalidConfig, c.LeaseDriftTicks)
	}
	if c.MaxBatchBytes < 1 {
		return fmt.Errorf("%w: MaxBatchBytes %d < 1", ErrInvalidConfig, c.MaxBatchBytes)
	}
	if c.MaxBatch < 1 {
		return fmt.Errorf("%w: MaxBatch %d < 1", ErrInvalidConfig, c.MaxBatch)
	}
	return nil
}
