package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/atoll-run/atoll/runtime/api"
)

// TestProcessEnv checks a process gang member's torchrun environment: ranks in the world's
// order, local ranks and machine groups, rank 0's rendezvous address, GPUs as indices on
// simulated machines and UUIDs on real ones.
func TestProcessEnv(t *testing.T) {
	p := api.Placement{Members: []api.Member{
		{Machine: "a", GPUs: []int{0, 1}, UUIDs: []string{"GPU-a0", "GPU-a1"}},
		{Machine: "b", GPUs: []int{0, 1}, UUIDs: []string{"GPU-b0", "GPU-b1"}},
		{Machine: "a", GPUs: []int{2, 3}, UUIDs: []string{"GPU-a2", "GPU-a3"}},
		{Machine: "b", GPUs: []int{4}, UUIDs: []string{"GPU-b4"}, Removed: true},
	}}
	proc := &api.ProcessSpec{Command: []string{"x"}, YieldExitCode: 75}
	for _, tc := range []struct {
		name      string
		rank      int
		world     []int
		simulated bool
		want      []string
		err       string
	}{
		{name: "rank 0", rank: 0, simulated: true, want: []string{"RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=3", "LOCAL_WORLD_SIZE=2",
			"GROUP_RANK=0", "GROUP_WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "CUDA_VISIBLE_DEVICES=0,1",
			"ATOLL_SIMULATED_GPUS=GPU-a0,GPU-a1", "ATOLL_RANK=0", "ATOLL_MEMBER=0", "ATOLL_GENERATION=3", "ATOLL_NOTICE_FILE=/n"}},
		{name: "second member on its machine", rank: 2, simulated: true, want: []string{"RANK=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
			"GROUP_RANK=0", "CUDA_VISIBLE_DEVICES=2,3", "ATOLL_YIELD_EXIT_CODE=75"}},
		{name: "real GPUs by UUID", rank: 1, want: []string{"RANK=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=1",
			"CUDA_VISIBLE_DEVICES=GPU-b0,GPU-b1", "ATOLL_GPUS=0,1", "CUDA_DEVICE_ORDER=PCI_BUS_ID"}},
		{name: "a world in another order", rank: 0, world: []int{2, 0}, simulated: true, want: []string{"RANK=1", "LOCAL_RANK=1",
			"WORLD_SIZE=2", "ATOLL_MEMBER=0"}},
		{name: "not in its world", rank: 1, world: []int{0, 2}, err: "not in its world"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := api.WorkerSpec{Job: "j", Gang: "g", Rank: tc.rank, Generation: 3, Machine: p.Members[tc.rank].Machine,
				Member: p.Members[tc.rank], Placement: p, World: tc.world, Simulated: tc.simulated, Process: proc, Master: "10.0.0.1:29500"}
			env, err := processEnv(s, "/n")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !slices.Contains(env, w) {
					t.Errorf("no %s in %v", w, env)
				}
			}
		})
	}
}
