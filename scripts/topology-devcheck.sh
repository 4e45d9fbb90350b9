#!/usr/bin/env bash
# Device check for topology discovery on a real GPU machine. Writes everything under $OUT.
# Layout expected next to this script (built on a CPU machine, carried to the GPU machine;
# see docs/device-checks/README.md):
#   go build -tags nvml -o DIR/atoll ./cmd/atoll          # GPU machines' build: cgo + go-nvml
#   go build -o DIR/atoll-nonvml ./cmd/atoll              # the default build: no NVML
#   go test -tags nvml -c -o DIR/topology.test ./topology
#   mkdir -p DIR/topology; cp -a topology/testdata DIR/topology/ ; cp scripts/topology-devcheck.sh DIR/devcheck.sh
# then on the GPU machine: OUT=/some/dir bash DIR/devcheck.sh
set -u
cd "$(dirname "$0")"
{
  echo "== nvidia-smi"; timeout 60 nvidia-smi -L; timeout 60 nvidia-smi topo -m
  timeout 60 nvidia-smi --query-gpu=name,memory.total,pci.bus_id,compute_cap,mig.mode.current --format=csv
  timeout 60 nvidia-smi nvlink --status 2>&1 | head -40
  echo "== ldd"; ldd ./atoll | grep -i -E "libc|not found"
} > "$OUT/nvidia-smi.txt" 2>&1
timeout 120 ./atoll topology --discover > "$OUT/discover.txt" 2>&1; echo "rc=$?" >> "$OUT/discover.txt"
timeout 120 ./atoll topology --discover --json > "$OUT/discover.json" 2> "$OUT/discover-json.err"; echo "rc=$?" >> "$OUT/discover-json.err"
timeout 120 ./atoll-nonvml topology --discover > "$OUT/discover-nonvml.txt" 2>&1; echo "rc=$?" >> "$OUT/discover-nonvml.txt"
(cd topology && ATOLL_EXPECT_GPU=1 timeout 300 ../topology.test -test.v -test.count=1 -test.run 'Discover|Sysfs' > "$OUT/test.txt" 2>&1; echo "rc=$?" >> "$OUT/test.txt")
tail -5 "$OUT/test.txt"; head -40 "$OUT/discover.txt"
