package poolsim

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// bounds are a run's reference figures, computed from the trace and the pools alone.
type bounds struct {
	discountPct  float64
	onDemandWork float64 // USD
	oracle       float64 // USD
	goodputBound float64 // percent
	noDelay      float64 // USD
}

// boundsOf computes the bounds:
//
//   - on-demand work: every job's cards (members × cards per member) times its duration, at
//     the cheapest on-demand price per GPU-hour among the pools whose machines hold one of its
//     members (the cheapest of any pool when no on-demand pool does);
//   - oracle: the same at the cheapest price per GPU-hour of any pool that holds a member,
//     spot included (every job tolerates interruption). A policy pays at least this: it
//     must hold those cards that long, and it pays nothing less per GPU-hour. The oracle
//     pays no launch, no idle card, no interruption and no restore, and may delay jobs to
//     fill whole machines: it is a bound, not a schedule;
//   - goodput bound: the useful GPU-hours over the fewest paid GPU-hours of a policy that
//     starts every job when it arrives and runs it without a stop: at every instant it holds
//     the cards of the jobs running then, rounded up to whole machines (to a multiple of the
//     greatest common divisor of the pools' card counts), with nothing paid for launches,
//     idle machines or moves;
//   - no-delay oracle: the oracle plus those rounding cards at the cheapest price per
//     GPU-hour of any pool: no policy that starts every job on arrival pays less;
//   - discount: the first spot pool's discount on the price per GPU-hour of the cheapest
//     on-demand pool of the same machine type.
func boundsOf(jobs []Job, set *pools.Set) (bounds, error) {
	var b bounds
	maxPer, gcdCards := 0, 0
	for _, p := range set.Pools {
		maxPer = max(maxPer, p.Shape.GPUs)
		gcdCards = gcd(gcdCards, p.Shape.GPUs)
	}
	if maxPer == 0 {
		return b, fmt.Errorf("poolsim: no pool has GPUs")
	}
	perGPUh := func(p *pools.Pool) float64 { return p.Spec.PricePerHour / float64(p.Shape.GPUs) }
	cheapest := math.Inf(1)
	for i := range set.Pools {
		if set.Pools[i].Shape.GPUs > 0 {
			cheapest = min(cheapest, perGPUh(&set.Pools[i]))
		}
	}
	held := 0.0 // card-hours the jobs hold
	type delta struct {
		at    time.Duration
		cards int
	}
	var deltas []delta
	useful := 0.0
	for _, j := range jobs {
		members, per := shapeOf(j.GPUs, maxPer)
		od, any := math.Inf(1), math.Inf(1)
		for i := range set.Pools {
			p := &set.Pools[i]
			if p.Shape.GPUs < per || p.Shape.GPUs == 0 {
				continue
			}
			any = min(any, perGPUh(p))
			if p.Spec.Capacity != pools.Spot {
				od = min(od, perGPUh(p))
			}
		}
		if math.IsInf(any, 1) {
			return b, fmt.Errorf("poolsim: job %s: %d GPUs a member, no pool holds it", j.ID, per)
		}
		if math.IsInf(od, 1) {
			od = any
		}
		cardH := float64(members*per) * j.Duration.Hours()
		b.onDemandWork += cardH * od
		b.oracle += cardH * any
		held += cardH
		useful += float64(j.GPUs) * j.Duration.Hours()
		deltas = append(deltas, delta{j.Submit, members * per}, delta{j.Submit + j.Duration, -members * per})
	}
	sort.SliceStable(deltas, func(x, y int) bool { return deltas[x].at < deltas[y].at })
	paid, cards := 0.0, 0
	for i, d := range deltas {
		if i > 0 && cards > 0 {
			span := (d.at - deltas[i-1].at).Hours()
			paid += float64((cards+gcdCards-1)/gcdCards*gcdCards) * span
		}
		cards += d.cards
	}
	if paid > 0 {
		b.goodputBound = 100 * useful / paid
	}
	b.noDelay = b.oracle + max(0, paid-held)*cheapest
	b.discountPct = discountOf(set)
	return b, nil
}

// fill writes the bounds into a result, with the result's saving against them.
func (b bounds) fill(r *Result) {
	r.SpotDiscountPct = b.discountPct
	r.OnDemandWorkUSD = b.onDemandWork
	r.OracleCostUSD = b.oracle
	r.GoodputBoundPct = b.goodputBound
	r.NoDelayOracleUSD = b.noDelay
	if b.onDemandWork > 0 {
		r.MaxSavingPct = 100 * (1 - b.oracle/b.onDemandWork)
		r.MaxSavingNoDelayPct = 100 * (1 - b.noDelay/b.onDemandWork)
		r.SavingPct = 100 * (1 - r.Cost/b.onDemandWork)
	}
	if r.MaxSavingPct > 0 {
		r.SavingOfMaxPct = 100 * r.SavingPct / r.MaxSavingPct
	}
	if r.MaxSavingNoDelayPct > 0 {
		r.SavingOfNoDelayMaxPct = 100 * r.SavingPct / r.MaxSavingNoDelayPct
	}
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// onDemandOf returns the cheapest (per GPU-hour) on-demand pool of the same machine type as
// p, or nil.
func onDemandOf(set *pools.Set, p *pools.Pool) *pools.Pool {
	var best *pools.Pool
	for i := range set.Pools {
		o := &set.Pools[i]
		if o.Spec.Capacity == pools.Spot || o.Shape.Type != p.Shape.Type || o.Shape.GPUs == 0 {
			continue
		}
		if best == nil || o.Spec.PricePerHour/float64(o.Shape.GPUs) < best.Spec.PricePerHour/float64(best.Shape.GPUs) {
			best = o
		}
	}
	return best
}

// discountOf is the first spot pool's discount, in percent, on its on-demand counterpart
// (0 when there is none).
func discountOf(set *pools.Set) float64 {
	for i := range set.Pools {
		p := &set.Pools[i]
		if p.Spec.Capacity != pools.Spot || p.Shape.GPUs == 0 {
			continue
		}
		if od := onDemandOf(set, p); od != nil && od.Spec.PricePerHour > 0 {
			spot := p.Spec.PricePerHour / float64(p.Shape.GPUs)
			return 100 * (1 - spot/(od.Spec.PricePerHour/float64(od.Shape.GPUs)))
		}
	}
	return 0
}

// WithSpotDiscount returns a copy of the set whose spot pools cost pct percent less per
// GPU-hour than the cheapest on-demand pool of the same machine type. It refuses a discount
// outside [0, 100) and a spot pool without an on-demand counterpart.
func WithSpotDiscount(set *pools.Set, pct float64) (*pools.Set, error) {
	if !(pct >= 0 && pct < 100) {
		return nil, fmt.Errorf("poolsim: spot discount %v%%: want 0 ≤ discount < 100", pct)
	}
	out := &pools.Set{Pools: make([]pools.Pool, len(set.Pools))}
	copy(out.Pools, set.Pools)
	for i := range out.Pools {
		p := &out.Pools[i]
		if p.Spec.Capacity != pools.Spot {
			continue
		}
		od := onDemandOf(set, &set.Pools[i])
		if od == nil {
			return nil, fmt.Errorf("poolsim: spot pool %s: no on-demand pool of machine type %s to discount from", p.Spec.Name, p.Shape.Type)
		}
		p.Spec.PricePerHour = od.Spec.PricePerHour / float64(od.Shape.GPUs) * float64(p.Shape.GPUs) * (1 - pct/100)
		p.Spec.Source = fmt.Sprintf("%.0f%% below on-demand pool %s (spot discount set for the study)", pct, od.Spec.Name)
	}
	return out, nil
}
