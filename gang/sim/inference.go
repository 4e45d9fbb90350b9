package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// InferenceRequest is one request of an inference trace: when it arrived (from the
// trace's first request) and its prompt and output lengths in tokens.
type InferenceRequest struct {
	At        time.Duration
	Context   int
	Generated int
}

// Bounds of an inference trace's values.
const (
	MaxRequestTokens = 1 << 20
	inferenceLayout  = "2006-01-02 15:04:05.9999999"
)

// LoadInference reads an Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens;
// Azure/AzurePublicDataset, the Splitwise paper's data), sorted by arrival.
func LoadInference(path string, skipBad bool, sk *Skipper) ([]InferenceRequest, error) {
	t, err := readTable(path, skipBad, sk.add)
	if err != nil {
		return nil, err
	}
	if !has(t, "timestamp", "contexttokens", "generatedtokens") {
		return nil, fmt.Errorf("sim: %s: header %v is not an Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens): %w", path, t.header, ErrBadHeader)
	}
	type row struct {
		at   time.Time
		c, g int
	}
	var rows []row
	for i := range t.rows {
		ts, perr := time.Parse(inferenceLayout, t.str(i, "timestamp"))
		c, err1 := t.num(i, "contexttokens", math.NaN())
		g, err2 := t.num(i, "generatedtokens", math.NaN())
		err := firstErr(err1, err2)
		if perr != nil && err == nil {
			err = t.rowErr(i, "TIMESTAMP", t.str(i, "timestamp"), "want a time like 2023-11-16 18:17:03.9799600")
		}
		if err == nil && (math.IsNaN(c) || math.IsNaN(g)) {
			err = t.rowErr(i, "ContextTokens/GeneratedTokens", t.str(i, "contexttokens")+","+t.str(i, "generatedtokens"), "empty value")
		}
		if err == nil {
			err = firstErr(t.bounded(i, "contexttokens", c, 0, MaxRequestTokens, true), t.bounded(i, "generatedtokens", g, 0, MaxRequestTokens, true))
		}
		if err != nil {
			if skipBad {
				sk.add(err)
				continue
			}
			return nil, err
		}
		rows = append(rows, row{ts, int(c), int(g)})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("sim: %s: no requests: %w", path, ErrBadSpec)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].at.Before(rows[j].at) })
	out := make([]InferenceRequest, len(rows))
	for i, r := range rows {
		out[i] = InferenceRequest{At: r.at.Sub(rows[0].at), Context: r.c, Generated: r.g}
	}
	return out, nil
}

// ServiceSpec is an inference service: a gang of replicas of GPUsPerReplica GPUs each (on
// one machine), between MinReplicas and MaxReplicas, whose requests should see their first
// token within LatencySLO.
type ServiceSpec struct {
	Kind           string
	MinReplicas    int
	MaxReplicas    int
	GPUsPerReplica int
	// LatencySLO bounds a request's time to first token: its wait for a batch slot at its
	// replica plus its prefill.
	LatencySLO time.Duration
}

// ReplicaModel is the throughput model of one replica (docs/scheduler.md states the
// values and their source): continuous batching of up to Batch requests; a request's
// prefill takes Context / (PrefillTokensPerGPUSecond × GPUs) seconds, then each generated
// token DecodeTBT (time between tokens, flat up to Batch requests in the batch); a request
// holds its batch slot for both. Startup is a new replica's model load.
type ReplicaModel struct {
	PrefillTokensPerGPUSecond float64
	DecodeTBT                 time.Duration
	Batch                     int
	Startup                   time.Duration
}

// DefaultReplicaModel: Llama-2-70B, tensor-parallel over the 8 H100 of a DGX H100, the
// Splitwise paper's setting (docs/scheduler.md): 2,500 prompt tokens per GPU-second (a
// 1,500-token prompt in 75 ms), 40 ms between tokens up to a batch of 64, a minute to load.
func DefaultReplicaModel() ReplicaModel {
	return ReplicaModel{PrefillTokensPerGPUSecond: 2500, DecodeTBT: 40 * time.Millisecond, Batch: 64, Startup: time.Minute}
}

// DefaultServiceSpec: the model above on whole DGX H100 machines, 1..8 replicas, first
// token within 1 s.
func DefaultServiceSpec() ServiceSpec {
	return ServiceSpec{Kind: "llm", MinReplicas: 1, MaxReplicas: 8, GPUsPerReplica: 8, LatencySLO: time.Second}
}

// Validate checks the spec.
func (s ServiceSpec) Validate() error {
	switch {
	case s.MinReplicas < 1 || s.MaxReplicas < s.MinReplicas || s.MaxReplicas > 10_000:
		return fmt.Errorf("sim: service replicas %d..%d: want 1 <= min <= max <= 10000: %w", s.MinReplicas, s.MaxReplicas, ErrBadSpec)
	case s.GPUsPerReplica < 1 || s.GPUsPerReplica > MaxMachineGPUs:
		return fmt.Errorf("sim: service GPUs per replica %d outside [1, %d] (a replica is on one machine): %w", s.GPUsPerReplica, MaxMachineGPUs, ErrBadSpec)
	case s.LatencySLO <= 0:
		return fmt.Errorf("sim: service latency SLO %s: want > 0: %w", s.LatencySLO, ErrBadSpec)
	}
	return nil
}

// Validate checks the model.
func (m ReplicaModel) Validate() error {
	switch {
	case !(m.PrefillTokensPerGPUSecond > 0) || math.IsInf(m.PrefillTokensPerGPUSecond, 0):
		return fmt.Errorf("sim: prefill rate %v tokens/GPU-s: want a positive number: %w", m.PrefillTokensPerGPUSecond, ErrBadSpec)
	case m.DecodeTBT <= 0 || m.Batch < 1 || m.Batch > 4096 || m.Startup < 0:
		return fmt.Errorf("sim: replica model TBT %s, batch %d, startup %s: want TBT > 0, batch in [1, 4096], startup >= 0: %w", m.DecodeTBT, m.Batch, m.Startup, ErrBadSpec)
	}
	return nil
}

// AutoscaleConfig is the service autoscaler every sharing policy is given, a model of the
// Kubernetes Horizontal Pod Autoscaler's algorithm (docs/scheduler.md): every Interval,
// desired = ceil(mean requests in flight over the interval / (Batch × TargetUtil)), one more
// than are placed when more than 0.1% of the interval's requests missed the SLO (the error
// budget of a 99.9% target); scale-down only to
// the highest recommendation of the last DownWindow.
type AutoscaleConfig struct {
	Interval   time.Duration
	TargetUtil float64
	DownWindow time.Duration
}

// DefaultAutoscaleConfig: HPA's defaults (a 15 s sync period, a 300 s scale-down
// stabilisation window) and a target of 80% of the batch slots.
func DefaultAutoscaleConfig() AutoscaleConfig {
	return AutoscaleConfig{Interval: 15 * time.Second, TargetUtil: 0.8, DownWindow: 5 * time.Minute}
}

// Validate checks the config.
func (a AutoscaleConfig) Validate() error {
	if a.Interval < time.Second || !(a.TargetUtil > 0 && a.TargetUtil <= 1) || a.DownWindow < 0 {
		return fmt.Errorf("sim: autoscaler interval %s, target %v, down window %s: want interval >= 1s, target in (0, 1], window >= 0: %w", a.Interval, a.TargetUtil, a.DownWindow, ErrBadSpec)
	}
	return nil
}

// InferenceLoad maps a short inference trace onto a training trace's span: the trace is
// repeated back to back, each repetition's arrival rate scaled by
// Scale × (1 − Diurnal·cos(2π·t/24h)) (t from the training trace's first arrival: the
// trough at t = 0, the peak 12 h later). A rate of f is made of ceil(f) copies of the
// repetition, copy c shifted by c/ceil(f) of its length (wrapping round) and keeping each
// request with probability min(1, f − c), seeded.
type InferenceLoad struct {
	Scale   float64
	Diurnal float64
	Seed    uint64
}

// Validate checks the load.
func (l InferenceLoad) Validate() error {
	if !(l.Scale > 0 && l.Scale <= 1000) || !(l.Diurnal >= 0 && l.Diurnal < 1) {
		return fmt.Errorf("sim: inference scale %v, diurnal amplitude %v: want scale in (0, 1000], amplitude in [0, 1): %w", l.Scale, l.Diurnal, ErrBadSpec)
	}
	return nil
}

// rate is the load's factor at t.
func (l InferenceLoad) rate(t time.Duration) float64 {
	return l.Scale * (1 - l.Diurnal*math.Cos(2*math.Pi*t.Hours()/24))
}

// arrivals streams the mapped requests in arrival order, from `from` (the training
// trace's first arrival) up to `until`.
type arrivals struct {
	tmpl   []InferenceRequest
	length time.Duration // of one repetition
	load   InferenceLoad
	from   time.Duration
	until  time.Duration
	rep    int
	buf    []InferenceRequest
	pos    int
}

func newArrivals(tmpl []InferenceRequest, load InferenceLoad, from, until time.Duration) *arrivals {
	length := tmpl[len(tmpl)-1].At + time.Second // one second past the last request
	return &arrivals{tmpl: tmpl, length: length, load: load, from: from, until: until}
}

// peek returns the next request without taking it; ok is false past until.
func (a *arrivals) peek() (InferenceRequest, bool) {
	for a.pos >= len(a.buf) {
		start := a.from + time.Duration(a.rep)*a.length
		if start >= a.until {
			return InferenceRequest{}, false
		}
		a.fill(start)
		a.rep++
	}
	r := a.buf[a.pos]
	if r.At >= a.until {
		return InferenceRequest{}, false
	}
	return r, true
}

func (a *arrivals) next() { a.pos++ }

// fill makes the repetition starting at start.
func (a *arrivals) fill(start time.Duration) {
	f := a.load.rate(start - a.from + a.length/2)
	n := int(math.Ceil(f))
	rng := rand.New(rand.NewPCG(a.load.Seed, uint64(a.rep)))
	a.buf, a.pos = a.buf[:0], 0
	for c := 0; c < n; c++ {
		keep := min(1, f-float64(c))
		shift := time.Duration(c) * a.length / time.Duration(n)
		for _, r := range a.tmpl {
			if rng.Float64() >= keep {
				continue
			}
			r.At = start + (r.At+shift)%a.length
			a.buf = append(a.buf, r)
		}
	}
	slices.SortStableFunc(a.buf, func(x, y InferenceRequest) int { return int(x.At - y.At) })
}

// Replica states.
const (
	repPending  = iota // submitted, not placed
	repStarting        // placed, loading the model
	repReady           // serving
	repDraining        // taking no new requests; released when its batch empties
)

type replica struct {
	id        string
	state     int
	slots     slotHeap // batch slots' free times
	busyUntil time.Duration
	readyAt   time.Duration
	asked     time.Duration // submitted at
	drainGen  int
}

type slotHeap []time.Duration

func (h slotHeap) Len() int           { return len(h) }
func (h slotHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h slotHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *slotHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *slotHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// serviceSide serves the mapped requests on the service's replicas and keeps the
// accounts: SLO attainment, time to first token, the GPU-time replicas were held and busy.
type serviceSide struct {
	spec  ServiceSpec
	model ReplicaModel
	as    AutoscaleConfig
	arr   *arrivals
	reps  []*replica
	ids   int
	end   time.Duration // accounting window end (the training trace's last arrival)

	served, within, unserved int
	ttftHist                 []int // 1 ms buckets; the last holds everything above
	e2eMax                   time.Duration

	// this interval's load (autoscaler input)
	sumLatency         time.Duration
	ivServed, ivMissed int
	recs               []rec // recommendations of the down window

	// GPU-seconds in the accounting window: replicas serving at least one request
	// (busyGPUSeconds), held (heldGPUSeconds), and the batch slots' occupancy times the
	// GPUs (workGPUSeconds: a replica serving Batch requests does its GPUs' full work).
	busyGPUSeconds, heldGPUSeconds, workGPUSeconds float64
	lastHeld                                       time.Duration
	scaleUps, scaleDowns                           int
	upDelays                                       []float64
	peakReplicas                                   int
}

type rec struct {
	at time.Duration
	n  int
}

func newServiceSide(spec ServiceSpec, model ReplicaModel, as AutoscaleConfig, arr *arrivals, end time.Duration) *serviceSide {
	return &serviceSide{spec: spec, model: model, as: as, arr: arr, end: end, ttftHist: make([]int, 60_001)}
}

func (s *serviceSide) newReplica(now time.Duration) *replica {
	s.ids++
	r := &replica{id: fmt.Sprintf("svc-%d", s.ids), state: repPending, asked: now, slots: make(slotHeap, s.model.Batch)}
	for i := range r.slots {
		r.slots[i] = now
	}
	s.reps = append(s.reps, r)
	return r
}

// ready marks r serving from now.
func (s *serviceSide) ready(r *replica, now time.Duration) {
	r.state, r.readyAt, r.busyUntil = repReady, now, now
	for i := range r.slots {
		r.slots[i] = now
	}
	s.upDelays = append(s.upDelays, (now - r.asked).Seconds())
}

// held accounts the GPUs replicas hold (placed, in any state) up to now.
func (s *serviceSide) held(now time.Duration) {
	if now <= s.lastHeld {
		return
	}
	n := 0
	for _, r := range s.reps {
		if r.state != repPending {
			n++
		}
	}
	a, b := s.lastHeld, min(now, s.end)
	if b > a {
		s.heldGPUSeconds += float64(n*s.spec.GPUsPerReplica) * (b - a).Seconds()
	}
	s.lastHeld = now
}

// serve routes every request that arrives before `to` to the ready replica whose batch
// frees a slot first (least loaded), and accounts it.
func (s *serviceSide) serve(to time.Duration) {
	for {
		q, ok := s.arr.peek()
		if !ok || q.At >= to {
			return
		}
		s.arr.next()
		var best *replica
		for _, r := range s.reps {
			if r.state == repReady && (best == nil || r.slots[0] < best.slots[0]) {
				best = r
			}
		}
		if best == nil {
			s.unserved++
			s.served++
			continue
		}
		prefill := time.Duration(float64(q.Context) / (s.model.PrefillTokensPerGPUSecond * float64(s.spec.GPUsPerReplica)) * float64(time.Second))
		start := max(q.At, best.slots[0])
		ttft := start - q.At + prefill
		done := start + prefill + time.Duration(q.Generated)*s.model.DecodeTBT
		best.slots[0] = done
		heap.Fix(&best.slots, 0)
		// Starts at one replica never decrease (the heap's minimum only grows), so the
		// union of its busy intervals is kept with one running end.
		from := max(start, best.busyUntil)
		if a, b := from, min(done, s.end); b > a {
			s.busyGPUSeconds += float64(s.spec.GPUsPerReplica) * (b - a).Seconds()
		}
		best.busyUntil = max(best.busyUntil, done)
		if a, b := start, min(done, s.end); b > a {
			s.workGPUSeconds += float64(s.spec.GPUsPerReplica) * (b - a).Seconds() / float64(s.model.Batch)
		}
		s.served++
		if ttft <= s.spec.LatencySLO {
			s.within++
		}
		s.ttftHist[min(int(ttft/time.Millisecond), len(s.ttftHist)-1)]++
		s.e2eMax = max(s.e2eMax, done-q.At)
		s.sumLatency += done - q.At
		s.ivServed++
		if ttft > s.spec.LatencySLO {
			s.ivMissed++
		}
	}
}

// active counts the replicas not draining.
func (s *serviceSide) active() int {
	n := 0
	for _, r := range s.reps {
		if r.state != repDraining {
			n++
		}
	}
	return n
}

// desired is the autoscaler's decision at now from the interval's load, and resets it.
func (s *serviceSide) desired(now time.Duration) int {
	inflight := s.sumLatency.Seconds() / s.as.Interval.Seconds() // Little's law
	need := int(math.Ceil(inflight / (float64(s.model.Batch) * s.as.TargetUtil)))
	if s.ivMissed*1000 > s.ivServed {
		need = max(need, s.placed()+1) // one more than hold GPUs: pending ones do not serve yet
	}
	need = min(max(need, s.spec.MinReplicas), s.spec.MaxReplicas)
	s.sumLatency, s.ivServed, s.ivMissed = 0, 0, 0
	s.recs = append(s.recs, rec{now, need})
	k := 0
	for k < len(s.recs) && s.recs[k].at < now-s.as.DownWindow {
		k++
	}
	s.recs = s.recs[k:]
	d := 0
	for _, r := range s.recs {
		d = max(d, r.n)
	}
	return d
}

// placed counts the replicas holding GPUs and not draining.
func (s *serviceSide) placed() int {
	n := 0
	for _, r := range s.reps {
		if r.state == repStarting || r.state == repReady {
			n++
		}
	}
	return n
}

// drainAt is when r's batch empties.
func (r *replica) drainAt() time.Duration { return slices.Max(r.slots) }

// remove drops r from the replica list.
func (s *serviceSide) remove(r *replica) {
	s.reps = slices.DeleteFunc(s.reps, func(x *replica) bool { return x == r })
}

// ttftP99 is the 99th percentile time to first token in seconds (1 ms resolution).
func (s *serviceSide) ttftP99() float64 {
	if s.served == 0 {
		return 0
	}
	want := int(math.Ceil(0.99 * float64(s.served)))
	n := s.unserved
	for i, c := range s.ttftHist {
		if n += c; n >= want {
			return float64(i+1) / 1000
		}
	}
	return math.Inf(1)
}
