package gang

import (
	"strings"
)

// queue is one node of the hierarchical queue tree.
type queue struct {
	name     string
	parent   *queue
	children []*queue
	weight   float64
	quota    int // whole GPUs, 0 = none
	sens     float64
	leaf     bool

	usedMilli, usedCPU, usedMem int64 // leaf: own use; inner: subtree sum
	pending                     int   // subtree pending gangs
	fair                        float64
}

// queueTree holds the queues by path.
type queueTree struct {
	root   *queue
	byName map[string]*queue
}

func newQueueTree(cfgs []QueueConfig) *queueTree {
	t := &queueTree{root: &queue{name: "", weight: 1}, byName: map[string]*queue{}}
	for _, qc := range cfgs {
		q := t.ensure(qc.Name)
		q.weight, q.quota, q.sens = qc.Weight, qc.Quota, qc.Sensitivity
		q.leaf = true
	}
	return t
}

func (t *queueTree) ensure(path string) *queue {
	if q, ok := t.byName[path]; ok {
		return q
	}
	parent := t.root
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		parent = t.ensure(path[:i])
	}
	q := &queue{name: path, parent: parent, weight: 1}
	parent.children = append(parent.children, q)
	t.byName[path] = q
	return q
}

// charge adds (sign +1) or removes (sign -1) a gang's use along the queue's path.
func (t *queueTree) charge(q *queue, milli, cpu, mem int64, sign int64) {
	for ; q != nil; q = q.parent {
		q.usedMilli += sign * milli
		q.usedCPU += sign * cpu
		q.usedMem += sign * mem
	}
}

func (t *queueTree) addPending(q *queue, d int) {
	for ; q != nil; q = q.parent {
		q.pending += d
	}
}

// computeFair splits the cluster among active queues by weight, level by level
// (hierarchical weighted fair share; DRF compares dominant shares against it).
func (t *queueTree) computeFair() {
	t.root.fair = 1
	var walk func(q *queue)
	walk = func(q *queue) {
		sum := 0.0
		for _, c := range q.children {
			if c.active() {
				sum += c.weight
			}
		}
		for _, c := range q.children {
			if sum > 0 && c.active() {
				c.fair = q.fair * c.weight / sum
			} else {
				c.fair = 0
			}
			walk(c)
		}
	}
	walk(t.root)
}

// active says the queue takes part in the split: it has gangs waiting or holds resources.
func (q *queue) active() bool { return q.pending > 0 || q.usedMilli > 0 || q.usedCPU > 0 }

// fairNow is q's fair share as computeFair would set it now, without setting it (q.fair is
// the cycle's: it stays as the last cycle computed it while no cycle runs).
func (t *queueTree) fairNow(q *queue) float64 {
	if q == t.root {
		return 1
	}
	if !q.active() {
		return 0
	}
	sum := 0.0
	for _, c := range q.parent.children {
		if c.active() {
			sum += c.weight
		}
	}
	return t.fairNow(q.parent) * q.weight / sum
}

// dominantShare is the queue's DRF dominant share of the cluster (GPU, CPU, memory).
func (q *queue) dominantShare(c *cluster) float64 {
	d := 0.0
	if c.totalMilli > 0 {
		d = max(d, float64(q.usedMilli)/float64(c.totalMilli))
	}
	if c.totalCPU > 0 {
		d = max(d, float64(q.usedCPU)/float64(c.totalCPU))
	}
	if c.totalMem > 0 {
		d = max(d, float64(q.usedMem)/float64(c.totalMem))
	}
	return d
}

// ratio is dominant share over fair share: < 1 means under share, > 1 borrowing.
func (q *queue) ratio(c *cluster) float64 {
	ds := q.dominantShare(c)
	if q.fair <= 0 {
		if ds == 0 {
			return 0
		}
		return 1e9
	}
	return ds / q.fair
}
