// Package transfer is the data plane between object stores: pull-based, chunked and
// pipelined transfers with per-chunk fingerprints behind an RDMA-shaped API.
package transfer
