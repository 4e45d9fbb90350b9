// Package digits is Atoll's main job, run by `atoll demo` and by `go run ./examples/digits`:
// data-parallel training of a small MLP on the UCI handwritten digits data set (shipped in
// data/, CC BY 4.0) by a gang of 8 workers placed inside one NVLink island of the embedded
// default cluster (simulated GPUs). Each step every worker computes a gradient on its shard,
// the gang AllReduces it, and every worker applies it; the gang checkpoints every 25 steps,
// one worker is crashed part-way, and the gang restarts from its newest checkpoint.
package digits
