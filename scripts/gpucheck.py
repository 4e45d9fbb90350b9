#!/usr/bin/env python3
"""A process gang member for the device check (scripts/procgang-devcheck.sh), standard
library only: through the CUDA driver API (ctypes, libcuda.so.1), which honours
CUDA_VISIBLE_DEVICES, it counts the devices this member sees and names them, and times
cuInit, a context's creation and its destruction (what a preemption pays to save and
restore a CUDA context, beside the state itself). It writes DIR/gpucheck-RANK.json.

usage: gpucheck.py --out DIR
"""

import argparse
import ctypes
import json
import os
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "-1"))
    res = {"rank": rank, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
           "atoll_gpus": os.environ.get("ATOLL_GPUS", ""), "machine": os.environ.get("ATOLL_MACHINE", "")}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        t0 = time.perf_counter()
        rc = cuda.cuInit(0)
        res["init_s"] = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError("cuInit: %d" % rc)
        n = ctypes.c_int()
        cuda.cuDeviceGetCount(ctypes.byref(n))
        res["devices"] = n.value
        uuids = []
        for i in range(n.value):
            dev = ctypes.c_int()
            cuda.cuDeviceGet(ctypes.byref(dev), i)
            u = (ctypes.c_ubyte * 16)()
            cuda.cuDeviceGetUuid(u, dev)
            h = bytes(u).hex()
            uuids.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
        res["uuids"] = uuids
        if n.value > 0:
            dev = ctypes.c_int()
            cuda.cuDeviceGet(ctypes.byref(dev), 0)
            ctx = ctypes.c_void_p()
            t1 = time.perf_counter()
            rc = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
            t2 = time.perf_counter()
            if rc != 0:
                raise RuntimeError("cuCtxCreate: %d" % rc)
            cuda.cuCtxDestroy_v2(ctx)
            t3 = time.perf_counter()
            res["ctx_create_s"], res["ctx_destroy_s"] = t2 - t1, t3 - t2
    except Exception as e:  # the result says what failed
        res["error"] = repr(e)
    with open(os.path.join(args.out, "gpucheck-%d.json" % rank), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
