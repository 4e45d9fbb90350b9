// Package sim drives the gang scheduler core with real cluster traces (Alibaba openb,
// Microsoft ITP, Philly) and reports packing, utilisation, queueing delay and JCT. It holds
// the scheduler throughput benchmark. (The topology adapters live in gang/topoadapt;
// SnapshotFromTopology and TopologyModel here are deprecated aliases.)
//
// The experiments, each behind an `atoll` command:
//   - RunFGD: the static packing protocol of the FGD paper (ATC'23): seeded arrivals until
//     the requested GPUs reach a share of the cluster, no departures; policies random,
//     dotprod, clustering, packing, bestfit, fgd (re-implemented from the paper's simulator)
//     and atoll (every pod submitted to the gang core as a one-member gang).
//   - RunDynamic: ITP or Philly jobs arrive and finish on a topology-described cluster under
//     fifo, volcano, kueue, tiresias, srtf (the oracle) and atoll, all configurations of the
//     same core; optionally with elastic jobs and arrivals compressed to saturate it.
//   - RunMixed: the same jobs beside an LLM inference service driven by the Azure LLM
//     inference trace (LoadInference), under a static split, a Volcano-like priority
//     policy and atoll (MixedPolicies); SLO attainment, training JCT, utilisation.
//   - Tune: successive halving over the atoll policy's weights (gang.SchedulerWeights) on
//     job traces, checked on a held-out trace (`atoll tune`).
//   - RunSchedBench: placement throughput and cycle latency on 10,000 machines.
//
// Usage sketch:
//
//	nodes, err := sim.LoadOpenbNodes("openb_node_list_gpu_node.csv", false, nil)
//	pods, err := sim.LoadOpenbPods("openb_pod_list_default.csv", false, nil)
//	res, err := sim.RunFGD(ctx, nodes, pods, sim.FGDOptions{Loads: []float64{1, 1.3}, Seeds: 10})
//
//	res, err := sim.RunDynamicFiles(ctx, "cluster04.csv", "64xdgx-h100/8", false, nil,
//		sim.DynamicOptions{MaxJobs: 4000, PrioritySeed: 1})
package sim
