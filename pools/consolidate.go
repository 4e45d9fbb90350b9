package pools

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// room is what a ready machine has free during a consolidation.
type room struct {
	m     *Machine
	r     *poolRun
	cards int
	cpu   int64
	mem   int64
	// taken says the machine receives a moved gang in this decision: it is not emptied too.
	taken bool
}

// consolidate empties partly used ready machines whose gangs all fit on the free capacity of
// the other ready machines: the machine is drained and its gangs are preempted (checkpoint,
// stop, placed again by the scheduler on the free cards). Machines go emptiest first; a
// machine qualifies once its gangs have not changed for its pool's idle timeout, every gang
// on it is known (Snapshot.Running), tolerates interruption, has all its members there and
// is not already stopping, and its pool launches nothing in this decision. Targets are ready
// machines that nothing drains, without a notice; a gang pinned to a pool moves only within
// it, a same-island gang only to machines of one island. It is called only while no gang is pending: pending gangs are scaled for, and capacity
// freed here would be theirs.
func (a *Autoscaler) consolidate(d *Decision, s *Snapshot, runs map[string]*poolRun, drainingNow map[string]bool) {
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
	var cands []*room
	for i := range s.Machines {
		m := &s.Machines[i]
		r := runs[m.Pool]
		if m.State != Ready || drained[m.Name] || !m.Notice.IsZero() {
			continue
		}
		sh := r.p.Shape
		rm := &room{m: m, r: r, cards: sh.GPUs, cpu: sh.CPUMilli, mem: sh.MemMiB}
		movable := len(m.Gangs) > 0 && !m.Changed.IsZero() && len(r.launches) == 0 &&
			s.Now.Sub(m.Changed) >= time.Duration(r.p.Spec.IdleTimeout)
		for _, h := range m.Gangs {
			g := running[h.Gang]
			if g == nil {
				// Unknown use: the machine keeps what it has and takes nothing.
				rm.cards, movable = 0, false
				break
			}
			rm.cards -= h.Members * g.Member.GPUs
			rm.cpu -= int64(h.Members) * g.Member.CPUMilli
			rm.mem -= int64(h.Members) * g.Member.MemMiB
			if !g.Tolerant || h.Stopping || h.Members != g.Size {
				movable = false
			}
		}
		rooms = append(rooms, rm)
		if movable {
			cands = append(cands, rm)
		}
	}
	// Emptiest first, then by name.
	slices.SortStableFunc(cands, func(x, y *room) int {
		if c := cmp.Compare(y.cards, x.cards); c != 0 {
			return c
		}
		return strings.Compare(x.m.Name, y.m.Name)
	})
	for _, c := range cands {
		if c.taken {
			continue
		}
		moves, ok := planMoves(c, rooms, running)
		if !ok {
			continue
		}
		var to []string
		for _, mv := range moves {
			mv.dst.cards -= mv.g.Size * mv.g.Member.GPUs
			mv.dst.cpu -= int64(mv.g.Size) * mv.g.Member.CPUMilli
			mv.dst.mem -= int64(mv.g.Size) * mv.g.Member.MemMiB
			mv.dst.taken = true
			if !slices.Contains(to, mv.dst.m.Name) {
				to = append(to, mv.dst.m.Name)
			}
		}
		c.cards = 0 // drained: it takes nothing more
		c.taken = true
		m := c.m
		d.Drains = append(d.Drains, Drain{Machine: m.Name, Pool: m.Pool, MoveObjects: m.LastCopies,
			Reason: fmt.Sprintf("consolidation: its gangs fit on the free cards of %s", strings.Join(to, ", "))})
		for _, mv := range moves {
			d.Preemptions = append(d.Preemptions, Preempt{Gang: mv.g.ID, Machine: m.Name, Deadline: s.Now.Add(a.cfg.PreemptDeadline),
				Reason: fmt.Sprintf("consolidation: %s moves to %s so that %s can be removed", mv.g.ID, mv.dst.m.Name, m.Name)})
		}
	}
}

type move struct {
	g   *Gang
	dst *room
}

// planMoves finds a machine for each gang of c among the other rooms (largest gang first,
// each on the room with the least free cards that holds it whole), without changing the
// rooms; false when one does not fit.
func planMoves(c *room, rooms []*room, running map[string]*Gang) ([]move, bool) {
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
	gangs := make([]*Gang, 0, len(c.m.Gangs))
	for _, h := range c.m.Gangs {
		gangs = append(gangs, running[h.Gang])
	}
	slices.SortStableFunc(gangs, func(x, y *Gang) int {
		return cmp.Compare(y.Size*y.Member.GPUs, x.Size*x.Member.GPUs)
	})
	var out []move
	for _, g := range gangs {
		cards := g.Size * g.Member.GPUs
		cpu, mem := int64(g.Size)*g.Member.CPUMilli, int64(g.Size)*g.Member.MemMiB
		var best *room
		for _, r := range rooms {
			sh := r.r.p.Shape
			if r == c || (g.Pool != "" && r.m.Pool != g.Pool) || !sh.hasModel(g.Member.Models) {
				continue
			}
			// Free cards per island are not known on a ready machine: a same-island gang
			// moves only to machines of one island.
			f := free(r)
			if f.cards < cards || f.cpu < cpu || f.mem < mem || (g.SameIsland && (len(sh.Islands) != 1 || sh.Islands[0] < cards)) {
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
