package pools

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Consolidation (Config.Consolidate) moves gangs between ready machines so that fewer
// machines are paid for. A move is a preemption (checkpoint, stop) after which the
// scheduler places the gang again on the free cards it was planned for; it costs each of the
// gang's cards its Gang.MoveCost (checkpoint, restart, restore), and every step weighs that
// cost against what the move saves, ski-rental fashion (no step waits on a tuned constant):
//
//   - making room: a pending gang of one member that no ready machine has room for, but
//     that one ready machine would have room for once some of its gangs move onto the free
//     cards of others, gets that room instead of a launch, when the moves cost less than
//     the launch (launch latency times the machine's cards; the cheapest moves win);
//   - emptying: while nothing is pending, a partly used machine whose gangs have not changed
//     for its pool's idle timeout and all fit on the free cards of other ready machines is
//     drained, and its gangs move there (the emptiest machines first), once a machine's worth
//     of cards, unused since its gangs last changed, covers what the moves cost;
//   - back to spot: such an on-demand machine (a fallback taken while spot had no room) whose
//     gangs do not fit elsewhere gets a spot machine launched for them when a spot pool has
//     room and the on-demand premium paid since its gangs last changed covers the launch and
//     the moves; once it is ready, emptying moves them there.
//
// Only gangs that tolerate interruption, have all their members on the machine and are not
// already stopping move. Targets are ready machines that nothing drains, without a notice; a
// gang pinned to a pool moves only within it, a same-island gang only to machines of one
// island.

// room is what a ready machine has free during a decision.
type room struct {
	m     *Machine
	r     *poolRun
	cards int
	cpu   int64
	mem   int64
	// soon are the cards of gangs stopping on it (moved off by an earlier decision): free
	// once they are gone.
	soon int
	// movable are its gangs that may move.
	movable []*Gang
	// settled: its gangs have not changed for its pool's idle timeout.
	settled bool
	// taken says the machine receives a moved gang or a pending one in this decision: it is
	// not emptied.
	taken bool
	// known: every gang on it is known, so its free cards are.
	known bool
}

// roomsOf lists the ready machines that nothing drains and that have no notice, with their
// free capacity (those hosting a gang not in Snapshot.Running count as full).
func roomsOf(d *Decision, s *Snapshot, runs map[string]*poolRun, drainingNow map[string]bool) ([]*room, map[string]*Gang) {
	drained := make(map[string]bool, len(drainingNow)+len(d.Drains))
	for name := range drainingNow {
		drained[name] = true
	}
	for _, dr := range d.Drains {
		drained[dr.Machine] = true
	}
	running := make(map[string]*Gang, len(s.Running))
	for i := range s.Running {
		running[s.Running[i].ID] = &s.Running[i]
	}
	var rooms []*room
	for i := range s.Machines {
		m := &s.Machines[i]
		r := runs[m.Pool]
		if m.State != Ready || drained[m.Name] || !m.Notice.IsZero() {
			continue
		}
		sh := r.p.Shape
		rm := &room{m: m, r: r, cards: sh.GPUs, cpu: sh.CPUMilli, mem: sh.MemMiB, known: true,
			settled: !m.Changed.IsZero() && s.Now.Sub(m.Changed) >= time.Duration(r.p.Spec.IdleTimeout)}
		for _, h := range m.Gangs {
			g := running[h.Gang]
			if g == nil {
				// Unknown use: the machine keeps what it has and takes nothing.
				rm.cards, rm.known, rm.movable = 0, false, nil
				break
			}
			rm.cards -= h.Members * g.Member.GPUs
			rm.cpu -= int64(h.Members) * g.Member.CPUMilli
			rm.mem -= int64(h.Members) * g.Member.MemMiB
			switch {
			case h.Stopping:
				rm.soon += h.Members * g.Member.GPUs
			case g.Tolerant && h.Members == g.Size:
				rm.movable = append(rm.movable, g)
			}
		}
		rooms = append(rooms, rm)
	}
	return rooms, running
}

// takes says whether room r may take gang g (pool, models, island), leaving its capacity
// aside.
func (r *room) takes(g *Gang) bool {
	sh := r.r.p.Shape
	switch {
	case !r.known, g.Pool != "" && r.m.Pool != g.Pool, !sh.hasModel(g.Member.Models):
		return false
	case r.r.p.Spec.Capacity == Spot && !g.Tolerant:
		return false
	case g.SameIsland && (len(sh.Islands) != 1 || sh.Islands[0] < g.Size*g.Member.GPUs):
		// Free cards per island are not known on a ready machine.
		return false
	}
	return true
}

// cardTime is what moving the gangs costs: their cards times their move cost.
func cardTime(gangs []*Gang) time.Duration {
	var t time.Duration
	for _, g := range gangs {
		t += time.Duration(g.Size*g.Member.GPUs) * g.MoveCost
	}
	return t
}

type move struct {
	g   *Gang
	dst *room
}

// planMoves finds a room for each gang (largest first, each on the room with the least free
// cards that holds it whole) among rooms other than from, without changing the rooms; false
// when one does not fit.
func planMoves(gangs []*Gang, from *room, rooms []*room) ([]move, bool) {
	type left struct {
		cards    int
		cpu, mem int64
	}
	tmp := make(map[*room]left)
	free := func(r *room) left {
		if l, ok := tmp[r]; ok {
			return l
		}
		return left{r.cards, r.cpu, r.mem}
	}
	gangs = slices.Clone(gangs)
	slices.SortStableFunc(gangs, func(x, y *Gang) int {
		return cmp.Compare(y.Size*y.Member.GPUs, x.Size*x.Member.GPUs)
	})
	var out []move
	for _, g := range gangs {
		cards := g.Size * g.Member.GPUs
		cpu, mem := int64(g.Size)*g.Member.CPUMilli, int64(g.Size)*g.Member.MemMiB
		var best *room
		for _, r := range rooms {
			if r == from || !r.takes(g) {
				continue
			}
			f := free(r)
			if f.cards < cards || f.cpu < cpu || f.mem < mem {
				continue
			}
			if best == nil || f.cards < free(best).cards {
				best = r
			}
		}
		if best == nil {
			return nil, false
		}
		f := free(best)
		tmp[best] = left{f.cards - cards, f.cpu - cpu, f.mem - mem}
		out = append(out, move{g: g, dst: best})
	}
	return out, true
}

// commitMoves takes the moves' capacity from their targets and preempts the gangs off from.
func (a *Autoscaler) commitMoves(d *Decision, s *Snapshot, from *room, moves []move, why string) {
	for _, mv := range moves {
		mv.dst.cards -= mv.g.Size * mv.g.Member.GPUs
		mv.dst.cpu -= int64(mv.g.Size) * mv.g.Member.CPUMilli
		mv.dst.mem -= int64(mv.g.Size) * mv.g.Member.MemMiB
		mv.dst.taken = true
		from.movable = slices.DeleteFunc(from.movable, func(g *Gang) bool { return g == mv.g })
		d.Preemptions = append(d.Preemptions, Preempt{Gang: mv.g.ID, Machine: from.m.Name, Deadline: s.Now.Add(a.cfg.MoveDeadline),
			Reason: fmt.Sprintf("consolidation: %s moves to %s %s", mv.g.ID, mv.dst.m.Name, why)})
	}
}

// makeRoom finds a ready machine that would hold the pending gang g (one member) once some of
// its gangs move onto other machines' free cards, and moves them: the cheapest moves (cards
// times move cost), then the fewest cards, then the first machine; only moves that cost less
// than launching a machine of its pool (launch latency times its cards). A machine already
// freeing enough cards (gangs stopping on it) takes the gang with no move. It reports
// whether g got room.
func (a *Autoscaler) makeRoom(d *Decision, s *Snapshot, rooms []*room, g *Gang) bool {
	if g.Size != 1 || g.Member.GPUs <= 0 {
		return false
	}
	c := g.Member.GPUs
	// Moves only shift free cards between machines: without c free or freeing cards in all,
	// no machine can get c.
	total := 0
	for _, r := range rooms {
		total += r.cards + r.soon
	}
	if total < c {
		return false
	}
	var best *room
	var bestMoves []move
	bestCards := 0
	var bestCost time.Duration
	for _, r := range rooms {
		if !r.takes(g) || r.cards >= c || r.r.p.Shape.GPUs < c {
			// A machine with the cards free already is the scheduler's to use (it did not:
			// CPU, memory or islands are in the way).
			continue
		}
		if r.cards+r.soon >= c {
			r.soon -= c - r.cards
			r.cards = 0
			r.taken = true
			d.Waiting = append(d.Waiting, Verdict{Gang: g.ID, Reason: fmt.Sprintf("waits for gangs moving off %s", r.m.Name)})
			return true
		}
		// The fewest cards that free enough: the smallest gang that does alone, else the
		// largest ones until enough.
		need := c - r.cards - r.soon
		mv := slices.Clone(r.movable)
		slices.SortStableFunc(mv, func(x, y *Gang) int { return cmp.Compare(x.Size*x.Member.GPUs, y.Size*y.Member.GPUs) })
		var pick []*Gang
		if i := slices.IndexFunc(mv, func(x *Gang) bool { return x.Size*x.Member.GPUs >= need }); i >= 0 {
			pick = mv[i : i+1]
		} else {
			got := 0
			for k := len(mv) - 1; k >= 0 && got < need; k-- {
				pick = append(pick, mv[k])
				got += mv[k].Size * mv[k].Member.GPUs
			}
			if got < need {
				continue
			}
		}
		moved := 0
		for _, x := range pick {
			moved += x.Size * x.Member.GPUs
		}
		// The moves must cost less than the launch they save (the pool's launch latency on
		// all its cards).
		cost := cardTime(pick)
		if cost >= time.Duration(r.r.p.Shape.GPUs)*time.Duration(r.r.p.Spec.LaunchLatency) && cost > 0 {
			continue
		}
		if best != nil && (cost > bestCost || cost == bestCost && moved >= bestCards) {
			continue
		}
		moves, ok := planMoves(pick, r, rooms)
		if !ok {
			continue
		}
		best, bestMoves, bestCards, bestCost = r, moves, moved, cost
	}
	if best == nil {
		return false
	}
	a.commitMoves(d, s, best, bestMoves, "to make room for "+g.ID)
	best.soon += bestCards
	best.soon -= c - best.cards
	best.cards = 0
	best.taken = true
	d.Waiting = append(d.Waiting, Verdict{Gang: g.ID, Reason: fmt.Sprintf("waits for %d card(s) of gangs moving off %s", bestCards, best.m.Name)})
	return true
}

// consolidate empties partly used ready machines whose gangs all fit on the free capacity of
// the other ready machines: the machine is drained and its gangs move. Machines go emptiest
// first; a machine qualifies once settled, with every gang on it movable, its pool launching
// nothing in this decision, and its cards times the time since its gangs last changed at
// least what the moves cost (cards times move cost). It is called only while no gang is
// pending.
func (a *Autoscaler) consolidate(d *Decision, s *Snapshot, runs map[string]*poolRun, rooms []*room) {
	var cands []*room
	for _, r := range rooms {
		if r.settled && r.known && r.soon == 0 && len(r.m.Gangs) > 0 && len(r.movable) == len(r.m.Gangs) && len(r.r.launches) == 0 {
			cands = append(cands, r)
		}
	}
	var empty []*room
	for _, r := range cands {
		// Ski rental: emptying it gives back a whole machine's worth of unused cards (its
		// own free ones and those its gangs fill elsewhere); it pays once that worth, unused
		// since its gangs last changed, covers what moving them costs.
		if time.Duration(r.r.p.Shape.GPUs)*s.Now.Sub(r.m.Changed) >= cardTime(r.movable) {
			empty = append(empty, r)
		}
	}
	// The emptiest first (the fewest cards to move), then by name.
	slices.SortStableFunc(empty, func(x, y *room) int {
		if c := cmp.Compare(y.cards, x.cards); c != 0 {
			return c
		}
		return strings.Compare(x.m.Name, y.m.Name)
	})
	for _, c := range empty {
		if c.taken {
			continue
		}
		moves, ok := planMoves(c.movable, c, rooms)
		if !ok {
			continue
		}
		var to []string
		for _, mv := range moves {
			if !slices.Contains(to, mv.dst.m.Name) {
				to = append(to, mv.dst.m.Name)
			}
		}
		a.commitMoves(d, s, c, moves, "so that "+c.m.Name+" can be removed")
		c.cards, c.known, c.taken = 0, false, true // drained: it takes nothing more
		m := c.m
		d.Drains = append(d.Drains, Drain{Machine: m.Name, Pool: m.Pool, MoveObjects: m.LastCopies,
			Reason: fmt.Sprintf("consolidation: its gangs fit on the free cards of %s", strings.Join(to, ", "))})
	}
	a.backToSpot(s, cands, runs)
}

// backToSpot launches spot machines for the gangs of on-demand machines that could not be
// emptied (an on-demand fallback, taken when spot had no room): one spot machine of a pool
// with room, the cheapest per card, for each such machine whose gangs it holds, once the
// on-demand premium paid since its gangs last changed covers the spot machine's launch and
// the moves; spot capacity already launching counts first. Once the spot machine is ready,
// consolidation moves the gangs there and the on-demand machine goes.
func (a *Autoscaler) backToSpot(s *Snapshot, cands []*room, runs map[string]*poolRun) {
	flight := 0
	var spot []*poolRun
	for _, r := range runs {
		if r.p.Spec.Capacity != Spot {
			continue
		}
		spot = append(spot, r)
		for _, v := range r.flight {
			flight += v.total
		}
	}
	slices.SortFunc(spot, func(x, y *poolRun) int {
		if c := cmp.Compare(x.p.Spec.PricePerHour/float64(max(1, x.p.Shape.GPUs)), y.p.Spec.PricePerHour/float64(max(1, y.p.Shape.GPUs))); c != 0 {
			return c
		}
		return strings.Compare(x.p.Spec.Name, y.p.Spec.Name)
	})
	for _, c := range cands {
		if c.taken || c.r.p.Spec.Capacity == Spot {
			continue
		}
		used := c.r.p.Shape.GPUs - c.cards
		if flight >= used {
			flight -= used
			continue
		}
		for _, r := range spot {
			// Ski rental: the on-demand premium paid since the gangs last changed covers the
			// spot machine's launch and the moves.
			od := c.r.p.Spec.PricePerHour
			premium := (od - r.p.Spec.PricePerHour) * s.Now.Sub(c.m.Changed).Hours()
			switchCost := r.p.Spec.PricePerHour*time.Duration(r.p.Spec.LaunchLatency).Hours() +
				od/float64(max(1, c.r.p.Shape.GPUs))*cardTime(c.movable).Hours()
			ok := premium >= switchCost && r.p.Shape.GPUs >= used && !r.st.SpotUnavailable && r.blocked(1) == ""
			for _, g := range c.movable {
				ok = ok && r.p.Shape.hasModel(g.Member.Models) && g.Pool == "" &&
					(!g.SameIsland || len(r.p.Shape.Islands) == 1 && r.p.Shape.Islands[0] >= g.Size*g.Member.GPUs)
			}
			if !ok {
				continue
			}
			r.launch(1, launchKey{domain: r.nextDomain(1), replaces: c.m.Name}, "",
				fmt.Sprintf("back to spot: the gangs of on-demand %s move here once it is ready", c.m.Name))
			flight += r.p.Shape.GPUs - used
			break
		}
	}
}
