"""bf16 collectives: bandwidth under an emulated cluster link, and error vs the number of ranks.

    python benchmarks/bf16.py [--rate 2gbit] [--reps 5] [--max-ranks 8] [--out benchmarks/results]

Part 1 (needs root for the link, see netlink.py): 2 ranks over a `--rate` loopback with MPICH
on TCP. For float32 allreduces of 1-64 MiB, the time of the TF op in tf.function with
compression none vs Compression.bf16, and of raw mpi4py Allreduce; effective algbw = float32
bytes / time; median of --reps runs.
Part 2 (shared memory, oversubscribed): for 2..--max-ranks ranks, the error vs an fp64 reference
of this scheme (one rounding in, one out) and of per-hop rounding (a bfloat16 tensor reduced by
MPI, every partial sum rounded), as max and mean of |y - s| / sum_r |x_r|.
Prints JSON lines; writes bf16.json and bf16.png into --out.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

SIZES_MIB = [1, 4, 16, 64]


def emit(record):
    print(json.dumps(record), flush=True)


def worker_bandwidth(reps):
    from mpi4py import MPI
    import numpy as np
    import tensorflow as tf
    import mlsl_tf as hvd
    hvd.init()
    comm = MPI.COMM_WORLD
    for mib in SIZES_MIB:
        n = mib * 2**20 // 4
        x = tf.constant(np.random.default_rng(hvd.rank()).standard_normal(n).astype(np.float32))
        fns = {
            "fp32": tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"fp32_{mib}")),
            "bf16": tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"bf16_{mib}",
                                                        compression=hvd.Compression.bf16)),
        }
        buf = x.numpy()
        out = np.empty_like(buf)
        times = {k: [] for k in ("fp32", "bf16", "mpi")}
        for k, fn in fns.items():
            fn(x).numpy()  # trace + warm up
        comm.Allreduce(buf, out)
        for _ in range(reps):
            for k, fn in fns.items():
                comm.Barrier()
                t0 = time.perf_counter()
                fn(x).numpy()
                times[k].append(time.perf_counter() - t0)
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(buf, out)
            times["mpi"].append(time.perf_counter() - t0)
        # every rank's max is what the collective cost
        med = {k: statistics.median([comm.allreduce(v, op=MPI.MAX) for v in ts]) for k, ts in times.items()}
        if hvd.rank() == 0:
            nbytes = n * 4
            emit({"bench": "bf16_bandwidth", "size_bytes": nbytes, "ranks": hvd.size(), "reps": reps,
                  "fp32_s": med["fp32"], "bf16_s": med["bf16"], "mpi_fp32_s": med["mpi"],
                  "fp32_algbw_GBps": nbytes / med["fp32"] / 1e9, "bf16_algbw_GBps": nbytes / med["bf16"] / 1e9,
                  "mpi_algbw_GBps": nbytes / med["mpi"] / 1e9,
                  "bf16_vs_fp32": med["fp32"] / med["bf16"], "bf16_vs_mpi": med["mpi"] / med["bf16"]})


def worker_error(n_elems):
    import numpy as np
    import tensorflow as tf
    import mlsl_tf as hvd
    hvd.init()
    p, r = hvd.size(), hvd.rank()
    xs = [(np.random.default_rng(q).standard_normal(n_elems)).astype(np.float32) for q in range(p)]
    exact = np.sum(np.array(xs, np.float64), axis=0)
    scale = np.sum(np.abs(np.array(xs, np.float64)), axis=0)
    ours = hvd.allreduce(tf.constant(xs[r]), op=hvd.Sum, compression=hvd.Compression.bf16, name="ours").numpy()
    hop = tf.cast(hvd.allreduce(tf.cast(xs[r], tf.bfloat16), op=hvd.Sum, name="hop"), tf.float32).numpy()
    if r == 0:
        rec = {"bench": "bf16_error", "ranks": p, "elements": n_elems}
        for k, y in (("scheme", ours), ("per_hop", hop)):
            e = np.abs(y.astype(np.float64) - exact) / scale
            rec[f"{k}_max"] = float(e.max())
            rec[f"{k}_mean"] = float(e.mean())
        rec["bound_2u"] = 2 * 2.0 ** -8
        emit(rec)


def run_json(argv, env):
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise RuntimeError(f"{argv[:4]}... failed with {res.returncode}")
    out = []
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            print(line, flush=True)
            out.append(rec)
    return out


def plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bw = [r for r in records if r["bench"] == "bf16_bandwidth"]
    er = [r for r in records if r["bench"] == "bf16_error"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    if bw:
        mib = [r["size_bytes"] / 2**20 for r in bw]
        for key, label in (("fp32_algbw_GBps", "mlsl_tf fp32"), ("bf16_algbw_GBps", "mlsl_tf bf16"),
                           ("mpi_algbw_GBps", "raw MPI fp32")):
            axes[0].plot(mib, [r[key] for r in bw], marker="o", label=label)
        axes[0].set_xscale("log", base=2)
        axes[0].set_xlabel("allreduce size (MiB of float32)")
        axes[0].set_ylabel("effective algbw (GB/s, float32 bytes / time)")
        axes[0].set_title(f"2 ranks, emulated link; median of {bw[0]['reps']}")
        axes[0].legend()
    if er:
        ranks = [r["ranks"] for r in er]
        for key, label in (("scheme_max", "one rounding in + out (max)"), ("per_hop_max", "per-hop rounding (max)"),
                           ("scheme_mean", "one rounding in + out (mean)"), ("per_hop_mean", "per-hop (mean)")):
            axes[1].plot(ranks, [r[key] for r in er], marker="o", label=label)
        axes[1].axhline(er[0]["bound_2u"], color="grey", ls="--", label="2u = 2^-7")
        axes[1].set_yscale("log")
        axes[1].set_xlabel("ranks")
        axes[1].set_ylabel("|y - s| / sum|x|")
        axes[1].set_title("bf16 allreduce error vs fp64")
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="2gbit")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-ranks", type=int, default=8)
    ap.add_argument("--elements", type=int, default=200_000)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--skip-bandwidth", action="store_true")
    ap.add_argument("--skip-error", action="store_true")
    ap.add_argument("--worker", choices=["bandwidth", "error"], help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.worker == "bandwidth":
        return worker_bandwidth(ns.reps)
    if ns.worker == "error":
        return worker_error(ns.elements)

    import netlink
    py = sys.executable
    mpiexec = netlink.mpiexec_next_to(py) or "mpiexec"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    records = []
    if not ns.skip_bandwidth:
        with netlink.Link(ns.rate) as link:
            argv = link.wrap([mpiexec, "-n", "2", py, __file__, "--worker", "bandwidth", "--reps", str(ns.reps)])
            recs = run_json(argv, link.env(env))
            for r in recs:
                r["link"] = ns.rate
            records += recs
    if not ns.skip_error:
        for p in range(2, ns.max_ranks + 1):
            records += run_json([mpiexec, "-n", str(p), py, __file__, "--worker", "error",
                                 "--elements", str(ns.elements)], env)
    emit({"bench": "horovod", "skipped": True,
          "why": "Horovod 0.28.1 does not build against TensorFlow 2.21 and has no bf16 wire type "
                 "(its Compression.fp16 casts in Python); nothing to compare"})
    os.makedirs(ns.out, exist_ok=True)
    with open(os.path.join(ns.out, "bf16.json"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    plot(records, os.path.join(ns.out, "bf16.png"))
    print(f"wrote {ns.out}/bf16.json and bf16.png", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
