#!/usr/bin/env bash
# Device check for process gangs on a real GPU machine: a cluster of processes whose agent
# discovers the machine (NVML), a process gang of one member per GPU, each checking through
# the CUDA driver API that it sees exactly its own GPU, and the CUDA context's cost.
# Writes everything under $OUT. Layout expected next to this script (built on a CPU
# machine, carried over; see docs/device-checks/README.md):
#   go build -tags nvml -o DIR/atoll ./cmd/atoll
#   cp scripts/procgang-devcheck.sh scripts/gpucheck.py DIR/
# then on the GPU machine: OUT=/some/dir bash DIR/procgang-devcheck.sh
# It needs python3 there (standard library only) and the NVIDIA driver.
set -u
cd "$(dirname "$0")"
D=$(mktemp -d)
N=$(nvidia-smi -L | grep -c '^GPU ')
{
  echo "== nvidia-smi"; timeout 60 nvidia-smi -L
  echo "== up"; timeout 180 ./atoll up --dir "$D/c" --machine discover --agents 1; echo "rc=$?"
  echo "== status"; timeout 60 ./atoll status --dir "$D/c"
  echo "== submit: $N members, one GPU each"
  timeout 300 ./atoll submit --dir "$D/c" --name gpucheck --workers "$N" --gpus-per-worker 1 --wait -- python3 "$PWD/gpucheck.py" --out "$OUT"; echo "rc=$?"
  for r in $(seq 0 $((N - 1))); do echo "== logs rank $r"; timeout 30 ./atoll logs gpucheck --dir "$D/c" --rank "$r" | tail -5; done
  echo "== down"; timeout 60 ./atoll down --dir "$D/c"
} > "$OUT/procgang.txt" 2>&1
cp "$D"/c/logs/*.log "$OUT/" 2>/dev/null
# The verdict: every member saw exactly one device, and no two the same.
python3 - "$OUT" "$N" > "$OUT/verdict.txt" <<'PY'
import glob, json, sys
out, n = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f)) for f in sorted(glob.glob(out + "/gpucheck-*.json"))]
seen = [r.get("uuids", []) for r in rs]
ok = len(rs) == n and all(len(s) == 1 for s in seen) and len({s[0] for s in seen if s}) == n
for r in rs:
    print(r)
print("members %d of %d; each sees one GPU, all different: %s" % (len(rs), n, "PASS" if ok else "FAIL"))
ctx = [r["ctx_create_s"] for r in rs if "ctx_create_s" in r]
if ctx:
    print("CUDA context create: min %.3f s, max %.3f s" % (min(ctx), max(ctx)))
PY
tail -3 "$OUT/verdict.txt"
rm -rf "$D"
