"""Overtaking: how long an urgent 4 KiB allreduce (priority 0) takes when it is issued while a big
low-priority broadcast, allgather, alltoall or Adasum allreduce is on the wire. One JSON line per
rank and op, with the big collective's time, the urgent allreduce's time from its issue, and which
finished first.

    python benchmarks/overtake.py --link 2gbit [--np 2] [--mib 128] [--delay-ms 30]
    mpiexec -n 2 python benchmarks/overtake.py            # as it is, e.g. on shared memory

Each op runs in turn: every rank starts the big collective (128 MiB input per rank, priority 100)
on a thread, waits --delay-ms, then calls the urgent allreduce and records when it returns.
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlsl_tf
import netlink  # noqa: E402

OPS = ("broadcast", "allgather", "alltoall", "adasum")  # adasum: a power-of-two --np


def big_op(hvd, op, tensor):
    if op == "broadcast":
        return hvd.broadcast(tensor, root_rank=0, name="big.broadcast", priority=100)
    if op == "allgather":
        return hvd.allgather(tensor, name="big.allgather", priority=100)
    if op == "adasum":
        return hvd.allreduce(tensor, name="big.adasum", op=hvd.Adasum, priority=100)
    return hvd.alltoall(tensor, name="big.alltoall", priority=100)


def measure(hvd, tf, op, big, small, delay_s, rep):
    """(big_s, urgent_s, urgent_first) on this rank for one run of `op`."""
    hvd.allreduce(tf.zeros([1]), name=f"sync.{op}.{rep}")  # everyone starts together
    times = {}

    def run_big():
        t = time.perf_counter()
        big_op(hvd, op, big)
        times["big_done"] = time.perf_counter()
        times["big_s"] = times["big_done"] - t

    thread = threading.Thread(target=run_big)
    thread.start()
    time.sleep(delay_s)
    t = time.perf_counter()
    out = hvd.allreduce(small, name="urgent", priority=0, op=hvd.Sum)
    urgent_done = time.perf_counter()
    thread.join()
    expect = float(sum(range(hvd.size())))
    assert float(out.numpy()[0]) == expect, (out.numpy()[:4], expect)
    return times["big_s"], urgent_done - t, urgent_done < times["big_done"]


def ranks_main(ns):
    import tensorflow as tf
    import mlsl_tf as hvd
    hvd.init()
    n = hvd.size()
    rows = (ns.mib << 20) // 4 // 1024
    rows -= rows % n  # alltoall: an equal split
    big = tf.ones([rows, 1024], tf.float32)
    small = tf.fill([1024], float(hvd.rank()))  # 4 KiB
    ops = ns.ops.split(",")
    for op in ops:  # warm: communicators, names, allocations
        big_op(hvd, op, tf.ones([n * 2, 1024]))
        hvd.allreduce(small, name="urgent", priority=0)
    for op in ops:
        for rep in range(ns.reps):
            big_s, urgent_s, first = measure(hvd, tf, op, big, small, ns.delay_ms / 1e3, rep)
            print(json.dumps({"rank": hvd.rank(), "size": n, "op": op, "rep": rep, "mib": ns.mib,
                              "link": ns.link_name or "as launched", "big_ms": round(big_s * 1e3, 1),
                              "urgent_ms": round(urgent_s * 1e3, 1),
                              "urgent_share_of_big": round(urgent_s / big_s, 3),
                              "urgent_first": first}), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=128, help="big collective's input per rank (MiB)")
    p.add_argument("--delay-ms", type=float, default=30.0, help="urgent allreduce issued this long after")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--ops", default=",".join(OPS), help="which big collectives, comma-separated")
    p.add_argument("--link", help="emulate a link of this rate (netlink.py), e.g. 2gbit")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--link-name", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.link or not netlink.under_mpiexec():
        return netlink.relaunch(__file__, sys.argv[1:] if argv is None else argv, ns.np, ns.link)
    ranks_main(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
