package sim

import (
	"fmt"
	"math"
	"strings"

	"github.com/atoll-run/atoll/gang"
)

// Pod is one row of an openb pod list.
type Pod struct {
	Name     string
	CPUMilli int64
	MemMiB   int64
	NumGPU   int
	GPUMilli int      // per card; 1000 for whole cards
	Models   []string // gpu_spec, empty = any
	Line     int
}

// GPUMilliTotal is the pod's GPU request in milli-GPU.
func (p Pod) GPUMilliTotal() int64 { return int64(p.NumGPU) * int64(p.GPUMilli) }

// LoadOpenbNodes reads an openb node list (sn,cpu_milli,memory_mib,gpu,model). Nodes have
// no topology in this trace: each node is its own island and rack.
func LoadOpenbNodes(path string, skipBad bool, sk *Skipper) ([]gang.Node, error) {
	t, err := readTable(path, skipBad, sk.add)
	if err != nil {
		return nil, err
	}
	for _, c := range []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"} {
		if _, ok := t.col[c]; !ok {
			return nil, fmt.Errorf("sim: %s: node list lacks column %q: %w", path, c, ErrBadHeader)
		}
	}
	var nodes []gang.Node
	gpus := 0
	for i := range t.rows {
		cpu, err1 := t.num(i, "cpu_milli", 0)
		mem, err2 := t.num(i, "memory_mib", 0)
		ngpu, err3 := t.num(i, "gpu", 0)
		err := firstErr(err1, err2, err3)
		if err == nil {
			err = firstErr(t.bounded(i, "cpu_milli", cpu, 0, MaxMachineCPU, true),
				t.bounded(i, "memory_mib", mem, 0, MaxMachineMemMiB, true),
				t.bounded(i, "gpu", ngpu, 0, MaxMachineGPUs, true))
		}
		if err == nil && gpus+int(ngpu) > MaxClusterGPUs {
			err = t.rowErr(i, "gpu", t.str(i, "gpu"), fmt.Sprintf("the node list would hold more than %d GPUs", MaxClusterGPUs))
		}
		if err != nil {
			if skipBad {
				sk.add(err)
				continue
			}
			return nil, err
		}
		n := gang.Node{Name: t.str(i, "sn"), Rack: len(nodes), CPUMilli: int64(cpu), MemMiB: int64(mem), FreeCPU: int64(cpu), FreeMem: int64(mem)}
		for g := 0; g < int(ngpu); g++ {
			n.GPUs = append(n.GPUs, gang.GPU{Model: t.str(i, "model"), Island: len(nodes), FreeMilli: gang.Milli})
		}
		gpus += len(n.GPUs)
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// LoadOpenbPods reads an openb pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli and,
// when present, gpu_spec).
func LoadOpenbPods(path string, skipBad bool, sk *Skipper) ([]Pod, error) {
	t, err := readTable(path, skipBad, sk.add)
	if err != nil {
		return nil, err
	}
	for _, c := range []string{"cpu_milli", "memory_mib", "num_gpu", "gpu_milli"} {
		if _, ok := t.col[c]; !ok {
			return nil, fmt.Errorf("sim: %s: pod list lacks column %q: %w", path, c, ErrBadHeader)
		}
	}
	var pods []Pod
	for i := range t.rows {
		cpu, err1 := t.num(i, "cpu_milli", 0)
		mem, err2 := t.num(i, "memory_mib", 0)
		ng, err3 := t.num(i, "num_gpu", 0)
		gm, err4 := t.num(i, "gpu_milli", 0)
		err := firstErr(err1, err2, err3, err4)
		if err == nil {
			err = firstErr(t.bounded(i, "cpu_milli", cpu, 0, MaxMachineCPU, true),
				t.bounded(i, "memory_mib", mem, 0, MaxMachineMemMiB, true),
				t.bounded(i, "num_gpu", ng, 0, MaxMachineGPUs, true),
				t.bounded(i, "gpu_milli", gm, 0, gang.Milli, true))
		}
		if err == nil && ng > 0 && (gm <= 0 || gm > gang.Milli) {
			err = t.rowErr(i, "gpu_milli", t.str(i, "gpu_milli"), "must be in (0, 1000] when num_gpu > 0")
		}
		if err == nil && ng > 1 && gm < gang.Milli {
			err = t.rowErr(i, "gpu_milli", t.str(i, "gpu_milli"), "a share of several cards")
		}
		if err != nil {
			if skipBad {
				sk.add(err)
				continue
			}
			return nil, err
		}
		p := Pod{Name: t.str(i, "name"), CPUMilli: int64(cpu), MemMiB: int64(mem), NumGPU: int(ng), GPUMilli: int(gm), Line: t.lines[i]}
		if ng == 0 {
			p.GPUMilli = 0
		}
		if spec := t.str(i, "gpu_spec"); spec != "" && !strings.EqualFold(spec, "nan") {
			p.Models = strings.Split(spec, "|")
		}
		pods = append(pods, p)
	}
	return pods, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func (s *Skipper) add(err error) {
	if s != nil {
		s.Add(err)
	}
}

// TypicalWorkload returns the pod shapes that make up 95% of the pods, by popularity, as
// the FGD paper's "typical pods" (the target workload fragmentation is measured against).
//
// With byGPU set (Atoll's variant) a shape's weight is its count times the GPUs it asks
// (a CPU-only shape counts as a tenth of a GPU) and no shape is cut: a rare 8-GPU pod then
// weighs what its GPUs weigh, so whole idle machines are kept for it.
func TypicalWorkload(pods []Pod, byGPU bool) gang.Workload {
	if byGPU {
		return typicalWorkload(pods, 1, false)
	}
	return typicalWorkload(pods, 0, true)
}

// typicalWorkload weighs each pod by (its GPUs)^exp (CPU-only pods by 0.1^exp); exp 0 is
// FGD's count weighting; cut drops the rarest shapes beyond 99.9% of the weight.
func typicalWorkload(pods []Pod, exp float64, cut bool) gang.Workload {
	byGPU := exp != 0
	type key struct {
		n, milli int
		cpu, mem int64
		models   string
	}
	counts := map[key]float64{}
	var order []key
	for _, p := range pods {
		k := key{p.NumGPU, p.GPUMilli, p.CPUMilli, p.MemMiB, strings.Join(p.Models, "|")}
		if counts[k] == 0 {
			order = append(order, k)
		}
		wt := 1.0
		if byGPU {
			wt = math.Pow(max(float64(p.GPUMilliTotal())/gang.Milli, 0.1), exp)
		}
		counts[k] += wt
	}
	// Stable: by count desc, first appearance on ties.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && counts[order[j]] > counts[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	var w gang.Workload
	var cum, total float64
	for _, k := range order {
		total += counts[k]
	}
	for _, k := range order {
		if cut && cum >= 0.999*total {
			break
		}
		var models []string
		if k.models != "" {
			models = strings.Split(k.models, "|")
		}
		w = append(w, gang.Shape{GPUs: k.n, Milli: k.milli, CPUMilli: k.cpu, MemMiB: k.mem, Models: models, Freq: counts[k]})
		cum += counts[k]
	}
	for i := range w {
		w[i].Freq /= cum
	}
	return w
}

// AtollWorkload is the atoll policy's target workload, learnt from the pods given (in the
// simulator: the arrivals so far): every shape seen, weighted by its count, and each shape
// restricted to some GPU models further weighted by its scarcity, cluster GPUs / GPUs of its
// allowed models: a T4-only pod can use only the T4 nodes, so its demand on them is that
// much more concentrated. Without the scarcity factor small nodes look like pure fragments
// to the shapes that cannot use them and fill with unconstrained pods, starving the pods
// that can run nowhere else.
func AtollWorkload(pods []Pod, nodes []gang.Node) gang.Workload {
	w := typicalWorkload(pods, 0, false)
	perModel := map[string]float64{}
	total := 0.0
	for _, n := range nodes {
		for _, g := range n.GPUs {
			perModel[g.Model]++
			total++
		}
	}
	sum := 0.0
	for i := range w {
		if len(w[i].Models) > 0 {
			allowed := 0.0
			for _, m := range w[i].Models {
				allowed += perModel[m]
			}
			if allowed > 0 {
				w[i].Freq *= total / allowed
			}
		}
		sum += w[i].Freq
	}
	for i := range w {
		w[i].Freq /= sum
	}
	return w
}
