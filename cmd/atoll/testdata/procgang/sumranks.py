#!/usr/bin/env python3
"""A process gang member, standard library only (TestClusterProcessGang).

Each member checks the environment Atoll gives it (torchrun's variables, its GPUs, Atoll's
own), the members meet at MASTER_ADDR:MASTER_PORT and sum their ranks over TCP, and rank
0 writes the sum. Then it "trains" (counts steps) until a notice: on the notice signal it
reads the notice file, checkpoints its step to a file and exits with the yield code. A
member that starts with a checkpoint continues from it, takes a few more steps and exits
0, which completes the gang.

With --elastic (TestClusterProcessGangResize) every generation trains until a notice, at
whatever world size it was started with, and a member exits 0 once DIR/stop exists.

usage: sumranks.py --out DIR --gpus N [--elastic]
Everything it learns goes to DIR as JSON files the test reads.
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

PERMANENT = 78  # Atoll's "a restart cannot help": a wrong environment fails the gang at once

noticed = False


def on_notice(signum, frame):
    global noticed
    noticed = True


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def fail(msg):
    print("sumranks: " + msg, file=sys.stderr, flush=True)
    sys.exit(PERMANENT)


def check_env(gpus):
    env = os.environ
    need = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES", "ATOLL_JOB", "ATOLL_GANG", "ATOLL_RANK", "ATOLL_GENERATION", "ATOLL_NOTICE_FILE",
            "ATOLL_YIELD_EXIT_CODE"]
    missing = [n for n in need if n not in env]
    if missing:
        fail("missing environment: %s" % missing)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    if not (0 <= rank < world and 0 <= local < local_world <= world and 0 <= int(env["GROUP_RANK"]) < world):
        fail("inconsistent ranks: RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d GROUP_RANK=%s"
             % (rank, world, local, local_world, env["GROUP_RANK"]))
    if int(env["ATOLL_RANK"]) != rank:
        fail("ATOLL_RANK %s is not RANK %d" % (env["ATOLL_RANK"], rank))
    port = int(env["MASTER_PORT"])
    if not 0 < port < 65536:
        fail("MASTER_PORT %d out of range" % port)
    devices = [d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d]
    if len(devices) != gpus or len(set(devices)) != gpus:
        fail("CUDA_VISIBLE_DEVICES %r: want %d distinct GPUs" % (env["CUDA_VISIBLE_DEVICES"], gpus))
    return rank, world


HELLO = "sumranks-peer"


def allreduce_ranks(rank, world, deadline):
    """Sums the ranks: every rank sends its own to rank 0, which answers the sum."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))
        srv.listen(world)
        srv.settimeout(max(1.0, deadline - time.time()))
        peers, total = {}, 0
        while len(peers) < world - 1:
            conn, _ = srv.accept()
            conn.settimeout(30)
            # A peer says who it is; anything else on the port (a stray client of a port
            # that was another process's a moment ago) is dropped, as a rendezvous store
            # drops what is not its protocol.
            try:
                magic, peer = conn.makefile().readline().split()
                peer = int(peer)
            except (OSError, ValueError):
                magic, peer = "", -1
            if magic != HELLO or not 0 < peer < world or peer in peers:
                print("rank 0: dropped a connection that is not a peer's", flush=True)
                conn.close()
                continue
            total += peer
            peers[peer] = conn
        peers = list(peers.values())
        total += rank
        for conn in peers:
            conn.sendall(b"%d\n" % total)
            conn.close()
        srv.close()
        return total
    while True:  # rank 0 may not listen yet
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.settimeout(max(1.0, deadline - time.time()))
    conn.sendall(b"%s %d\n" % (HELLO.encode(), rank))
    total = int(conn.makefile().readline())
    conn.close()
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--elastic", action="store_true")
    args = p.parse_args()
    signal.signal(signal.SIGUSR1, on_notice)
    rank, world = check_env(args.gpus)
    gen = int(os.environ["ATOLL_GENERATION"])
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES", "ATOLL_JOB", "ATOLL_GANG", "ATOLL_RANK", "ATOLL_MEMBER", "ATOLL_GENERATION",
            "ATOLL_MACHINE", "ATOLL_NOTICE_FILE", "ATOLL_SIMULATED_GPUS"]
    write_json(os.path.join(args.out, "env-%d-g%d.json" % (rank, gen)), {k: os.environ.get(k, "") for k in keys})
    print("rank %d of %d, generation %d, on %s (GPUs %s)" % (rank, world, gen, os.environ.get("ATOLL_MACHINE"),
                                                            os.environ["CUDA_VISIBLE_DEVICES"]), flush=True)

    ckpt = os.path.join(args.out, "ckpt-%d.json" % rank)
    step, resumed = 0, None
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            step = resumed = json.load(f)["step"]
        print("rank %d resumes from its checkpoint at step %d" % (rank, step), flush=True)

    total = allreduce_ranks(rank, world, time.time() + 120)
    if rank == 0:
        write_json(os.path.join(args.out, "sum-g%d.json" % gen), {"sum": total, "world": world, "generation": gen})
    print("rank %d: the sum of the ranks is %d" % (rank, total), flush=True)

    if resumed is not None and not args.elastic:
        step += 5  # the rest of the work
        write_json(os.path.join(args.out, "resumed-%d-g%d.json" % (rank, gen)), {"from_step": resumed, "step": step})
        print("rank %d done at step %d" % (rank, step), flush=True)
        return 0

    end = time.time() + 600  # never outlive a broken test by long
    stop = os.path.join(args.out, "stop")
    while not noticed and time.time() < end:
        step += 1
        time.sleep(0.05)
        if args.elastic and os.path.exists(stop):
            print("rank %d of %d stops at step %d" % (rank, world, step), flush=True)
            return 0
    if not noticed:
        fail("no notice within 600 s")
    with open(os.environ["ATOLL_NOTICE_FILE"]) as f:
        notice = json.load(f)
    write_json(ckpt, {"step": step, "generation": gen})
    write_json(os.path.join(args.out, "yield-%d-g%d.json" % (rank, gen)), {"step": step, "notice": notice})
    code = int(os.environ["ATOLL_YIELD_EXIT_CODE"])
    print("rank %d: %s notice, checkpointed step %d, yields with %d" % (rank, notice["kind"], step, code), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
