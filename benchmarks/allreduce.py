"""Allreduce latency and bandwidth: mlsl_tf against raw MPI (mpi4py) measured in the same run on
the same ranks, and Horovod where it can be run. One JSON line per message size, then a summary.

    mpiexec -n 2 python benchmarks/allreduce.py [--sizes 4096,1048576] [--reps 5] [--plot out.png]
    python benchmarks/allreduce.py --np 2,3,4                 # one mlslrun job per rank count, shared memory
    python benchmarks/allreduce.py --link 2gbit [--np 2]      # launches itself under netlink.py
    ... --horovod-python /path/to/hvd-venv/bin/python         # Horovod as a separate MPI job

Each repetition times one call of a tf.function holding a chain of K dependent allreduces, so
Python and tf.function call overhead is amortised over K. Latency = max-over-ranks time of a
repetition / K, median over repetitions; algbw = message bytes / latency.

--mode fresh (the default: what training does): x = allreduce(x, Sum) * (1/size), so every
allreduce's input is a tensor just computed and its result lands in a new tensor; raw MPI runs
MPI_Allreduce in place on its buffer and scales it with numpy, also in place (the best MPI
itself can do). --mode chain: x = allreduce(x) on zeros with no op between, where TensorFlow may
hand each result straight to the next allreduce; MPI runs the same K in-place calls.

--resnet50 adds one line: ResNet-50's gradients (float32, their real sizes) made as fresh
tensors (g * 1/size) and allreduced together in one tf.function, against one mpi4py Allreduce
of the same total bytes. The step also produces the 102 MB of fresh gradients, which the MPI
call does not: produce_s times the same function without the allreduces, and
collective_over_mpi = (mlsl_s - produce_s) / mpi_one_allreduce_s. Horovod, when run, times the
same step (horovod_s), so horovod_over_mlsl compares like with like.

CPU cost: *_core_s_per_GB = the process CPU time (all threads, user + system: time.process_time)
of every rank inside the timed calls, summed over the ranks, divided by the GB (1e9 bytes) of
messages those calls reduced (each allreduce's message counted once). It includes whatever the
library's threads and the caller's thread burn while waiting (MPICH polls) and the kernel's TCP
work done in the ranks' syscalls; not softirq work in ksoftirqd (benchmarks/cpu_cost.py) nor
anything before or after the calls. core_s_ratio = mlsl's / MPI's. ResNet-50's line gives it
for the whole step (produce_core_s_per_GB: the gradients' production alone, so
collective_core_s_per_GB = mlsl's - produce's).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlsl_tf
import netlink  # noqa: E402

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
CHAIN_BYTES = 256 << 20  # K = CHAIN_BYTES / size, clamped to [K_MIN, K_MAX]
K_MIN, K_MAX = 4, 1000
BANDWIDTH_FROM, BANDWIDTH_TARGET = 1 << 20, 0.95  # mlsl algbw >= 0.95x MPI's at >= 1 MiB (issue #13)
LATENCY_AT, LATENCY_TARGET = 4 << 10, 3.0  # mlsl 4 KiB latency <= 3x MPI's (issue #13)
LAUNCHER_ENV = ("PMI_", "PMIX_", "HYD", "MPI_LOCAL", "OMPI_")  # what a nested mpiexec must not inherit


def chain_length(nbytes):
    return max(K_MIN, min(K_MAX, CHAIN_BYTES // nbytes))


class Timer:
    """One sample: fn() run between a barrier and a max-over-ranks reduction, divided by k. With
    a key, this rank's process CPU time (all its threads, user + system) inside fn() adds to
    cpu[key]."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.comm, self.max, self.sum = comm, MPI.MAX, MPI.SUM
        self.cpu = {}

    def sample(self, fn, k, key=None):
        self.comm.Barrier()
        c, t = time.process_time(), time.perf_counter()
        fn()
        elapsed, cpu = time.perf_counter() - t, time.process_time() - c
        if key is not None:
            self.cpu[key] = self.cpu.get(key, 0.0) + cpu
        return self.comm.allreduce(elapsed, op=self.max) / k

    def core_s_per_gb(self, key, nbytes):
        """Collective: CPU seconds under `key` summed over the ranks, per GB (1e9 bytes) of
        `nbytes` -- the bytes of the messages those samples reduced (one message counted once,
        not per rank)."""
        return self.comm.allreduce(self.cpu.get(key, 0.0), op=self.sum) / (nbytes / 1e9)


def hvd_chain(hvd, tf, nbytes, k, tag, fresh):
    """A thunk running one tf.function call of k dependent allreduces (checked once for a Sum);
    fresh: each result is scaled by 1/size, so the next input is a newly computed tensor."""
    n = nbytes // 4
    check = hvd.allreduce(tf.ones([n]), op=hvd.Sum, name=f"{tag}_check_{nbytes}")
    if float(tf.reduce_min(check)) != hvd.size():
        raise RuntimeError(f"{tag}: allreduce of ones gave {float(tf.reduce_min(check))}, not {hvd.size()}")
    scale = tf.constant(1.0 / hvd.size(), tf.float32)

    @tf.function
    def chain(x):
        for i in range(k):
            x = hvd.allreduce(x, op=hvd.Sum, name=f"{tag}_{nbytes}_{i}")
            if fresh:
                x = x * scale
        return x

    x0 = tf.ones([n], tf.float32) if fresh else tf.zeros([n], tf.float32)
    out = chain(x0)  # trace, negotiate, warm up
    if fresh and float(tf.reduce_max(tf.abs(out - 1.0))) > 1e-6:
        raise RuntimeError(f"{tag}: the fresh chain of ones drifted to {float(tf.reduce_max(out))}")
    return lambda: chain(x0)


def mpi_chain(comm, nbytes, k, fresh):
    import numpy as np
    from mpi4py import MPI
    buf = np.ones(nbytes // 4, np.float32) if fresh else np.zeros(nbytes // 4, np.float32)
    msg = [buf, MPI.FLOAT]
    scale = np.float32(1.0 / comm.size)

    def run():
        for _ in range(k):
            comm.Allreduce(MPI.IN_PLACE, msg, op=MPI.SUM)
            if fresh:
                np.multiply(buf, scale, out=buf)
    run()
    return run


def resnet50_gradient_sizes():
    """Element counts of ResNet-50's 161 trainable variables (keras.applications, 1000 classes)."""
    import keras
    model = keras.applications.ResNet50(weights=None)
    return [int(v.numpy().size) for v in model.trainable_variables]


def resnet50_step(hvd, tf, sizes, tag, reduce=True):
    """A thunk: all gradients as fresh tensors (g * 1/size) allreduced in one tf.function, forward
    order as priority, as DistributedOptimizer does (checked once). reduce=False: the same
    function producing the fresh gradients only, the compute part of the step."""
    import inspect
    grads = [tf.ones([n], tf.float32) for n in sizes]
    scale = tf.constant(1.0 / hvd.size(), tf.float32)
    ranked = "priority" in inspect.signature(hvd.allreduce).parameters  # Horovod has no priority

    @tf.function
    def step(grads):
        fresh = [g * scale for g in grads]
        if not reduce:
            return fresh
        return [hvd.allreduce(g, op=hvd.Sum, name=f"{tag}_rn50_{i}", **({"priority": len(grads) - i} if ranked else {}))
                for i, g in enumerate(fresh)]

    out = step(grads)
    want = 1.0 if reduce else 1.0 / hvd.size()
    if any(float(tf.reduce_max(tf.abs(o - want))) > 1e-6 for o in out):
        raise RuntimeError(f"{tag}: resnet50 gradients: wrong values")
    return lambda: step(grads)


def mpi_one_allreduce(comm, sizes):
    """A thunk: one in-place mpi4py Allreduce of all the gradients' bytes."""
    import numpy as np
    from mpi4py import MPI
    buf = np.ones(sum(sizes), np.float32)

    def mpi():
        comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
    mpi()
    return mpi


def time_alternating(thunks, reps, timer):
    """{name: median seconds of one call}, the thunks alternating within each repetition."""
    samples = {name: [] for name in thunks}
    for _ in range(reps):
        for name, fn in thunks.items():
            samples[name].append(timer.sample(fn, 1, key=("step", name)))
    return {name: statistics.median(v) for name, v in samples.items()}


def measure(impls, sizes, reps, timer):
    """{name: {size: median latency (s)}} for thunk factories impls[name](nbytes, k); the
    implementations alternate within each repetition so they share the machine's noise."""
    out = {name: {} for name in impls}
    for nbytes in sizes:
        k = chain_length(nbytes)
        thunks = {name: make(nbytes, k) for name, make in impls.items()}
        samples = {name: [] for name in impls}
        for _ in range(reps):
            for name, fn in thunks.items():
                samples[name].append(timer.sample(fn, k, key=(name, nbytes)))
        for name in impls:
            out[name][nbytes] = statistics.median(samples[name])
            out[name][("core_s_per_GB", nbytes)] = timer.core_s_per_gb((name, nbytes), nbytes * k * reps)
    return out


def horovod_inprocess(sizes, reps, timer, fresh, resnet50=False):
    """({size: latency}, ResNet-50 step seconds or None), Horovod in this process."""
    import horovod.tensorflow as hvd_hvd
    import tensorflow as tf
    hvd_hvd.init()
    if hvd_hvd.size() != timer.comm.size:  # Horovod's MPI is not the launcher's: singletons
        raise SystemExit(f"allreduce.py: Horovod sees {hvd_hvd.size()} rank(s), MPI {timer.comm.size}: launch it "
                         "with the mpiexec of the MPI Horovod was built with (--horovod-mpiexec)")
    lat = measure({"horovod": lambda b, k: hvd_chain(hvd_hvd, tf, b, k, "hvd", fresh)}, sizes, reps,
                  timer)["horovod"]
    rn50 = None
    if resnet50:
        sizes50 = resnet50_gradient_sizes()
        step = resnet50_step(hvd_hvd, tf, sizes50, "hvd")
        rn50 = time_alternating({"horovod": step}, reps, timer)["horovod"]
        lat["rn50_core_s_per_GB"] = timer.core_s_per_gb(("step", "horovod"), 4 * sum(sizes50) * reps)
    return lat, rn50


def horovod_subprocess(python, sizes, reps, nranks, mode, resnet50=False, mpiexec=None):
    """Runs this file under `python`'s venv (mpiexec next to it, or the given launcher of the MPI
    Horovod was built with) in --impl horovod mode; returns ({size: latency}, ResNet-50 step
    seconds or None, note)."""
    mpiexec = mpiexec or (netlink.mpiexec_next_to(python) if os.access(python, os.X_OK) else None)
    if not mpiexec:
        return {}, None, f"skipped: {python} or an mpiexec next to it is missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_ENV)}
    flags = []
    if "Open MPI" in subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout:
        flags = (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["--oversubscribe", "--bind-to", "none"]
    cmd = [mpiexec, "-n", str(nranks)] + flags + [python, os.path.abspath(__file__), "--impl", "horovod",
                                                  "--sizes", ",".join(map(str, sizes)), "--reps", str(reps),
                                                  "--mode", mode, "--expect-ranks", str(nranks)] + \
        (["--resnet50"] if resnet50 else [])
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        return {}, None, "failed: the Horovod job timed out"
    rows = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {}, None, f"failed (exit {proc.returncode}): {tail[0]}"
    rn50 = next((r["resnet50_s"] for r in rows if "resnet50_s" in r), None)
    lat = {r["size_bytes"]: r["latency_s"] for r in rows if "size_bytes" in r}
    lat.update({("core_s_per_GB", r["size_bytes"]): r["core_s_per_GB"] for r in rows if "core_s_per_GB" in r})
    lat.update({"rn50_core_s_per_GB": r["rn50_core_s_per_GB"] for r in rows if "rn50_core_s_per_GB" in r})
    return lat, rn50, f"measured with {python}"


def wait_quietly(comm):
    """A barrier that sleeps instead of spinning, so a waiting rank leaves its core to others."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.05)


def sizes_of(lat):
    """The message sizes of a {size: latency, ('core_s_per_GB', size): ...} dict."""
    return [k for k in lat if isinstance(k, int)]


def row(nbytes, lat, hvd_lat, hvd_note):
    def bw(t):
        return None if t is None else nbytes / t / 1e9
    m, p, h = lat["mlsl"][nbytes], lat["mpi"][nbytes], hvd_lat.get(nbytes)
    cpu = ("core_s_per_GB", nbytes)
    return {"size_bytes": nbytes, "k": chain_length(nbytes),
            "mlsl_latency_us": m * 1e6, "mlsl_algbw_GBps": bw(m),
            "mpi_latency_us": p * 1e6, "mpi_algbw_GBps": bw(p),
            "algbw_ratio": p / m, "latency_ratio": m / p,
            "horovod_latency_us": None if h is None else h * 1e6, "horovod_algbw_GBps": bw(h),
            "horovod_algbw_ratio": None if h is None else p / h,
            "horovod_over_mlsl_latency": None if h is None else h / m,
            "mlsl_core_s_per_GB": lat["mlsl"][cpu], "mpi_core_s_per_GB": lat["mpi"][cpu],
            "horovod_core_s_per_GB": hvd_lat.get(cpu), "core_s_ratio": lat["mlsl"][cpu] / lat["mpi"][cpu],
            "horovod": hvd_note}


def summary(rows, nranks, link, hvd_note):
    big = [r["algbw_ratio"] for r in rows if r["size_bytes"] >= BANDWIDTH_FROM]
    small = [r["latency_ratio"] for r in rows if r["size_bytes"] == LATENCY_AT]
    return {"summary": True, "ranks": nranks, "link": link or "shared memory",
            "min_algbw_ratio_from_1MiB": min(big) if big else None,
            "bandwidth_target_met": min(big) >= BANDWIDTH_TARGET if big else None,
            "latency_ratio_4KiB": small[0] if small else None,
            "latency_target_met": small[0] <= LATENCY_TARGET if small else None,
            "targets": f">= {BANDWIDTH_TARGET}x MPI algbw at >= 1 MiB; 4 KiB latency <= {LATENCY_TARGET:g}x MPI",
            "horovod_over_mlsl_latency_4KiB": next((r["horovod_over_mlsl_latency"] for r in rows
                                                    if r["size_bytes"] == LATENCY_AT), None),
            "horovod_over_mlsl_latency_min": min((r["horovod_over_mlsl_latency"] for r in rows
                                                  if r["horovod_over_mlsl_latency"] is not None), default=None),
            "core_s_per_GB_largest": {k: rows[-1][f"{k}_core_s_per_GB"] for k in ("mlsl", "mpi", "horovod")}
            if rows else None,
            "horovod": hvd_note}


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x = [r["size_bytes"] for r in rows]
    fig, (ax_lat, ax_bw) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("mlsl", "mlsl_tf"), ("mpi", "MPI (mpi4py)"), ("horovod", "Horovod")):
        if rows[0][f"{key}_latency_us"] is None:
            continue
        ax_lat.plot(x, [r[f"{key}_latency_us"] for r in rows], "o-", label=label)
        ax_bw.plot(x, [r[f"{key}_algbw_GBps"] for r in rows], "o-", label=label)
    for ax, ylabel in ((ax_lat, "latency (us)"), (ax_bw, "algbw (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes, float32)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_lat.set_yscale("log")
    fig.suptitle("allreduce, median of repetitions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_ranks(ns):
    from mpi4py import MPI  # first: MPI_Init_thread(MULTIPLE), which mlsl_tf then reuses
    comm, timer = MPI.COMM_WORLD, Timer(MPI.COMM_WORLD)
    if ns.expect_ranks and comm.size != ns.expect_ranks:
        raise SystemExit(f"allreduce.py: {comm.size} rank(s) see each other, {ns.expect_ranks} were launched: "
                         "mpi4py's MPI is not the launcher's (--horovod-mpiexec)")
    if ns.impl == "horovod":  # a child job started by horovod_subprocess
        lat, rn50 = horovod_inprocess(ns.sizes, ns.reps, timer, ns.mode == "fresh", ns.resnet50)
        if comm.rank == 0:
            for nbytes in sizes_of(lat):
                print(json.dumps({"size_bytes": nbytes, "latency_s": lat[nbytes],
                                  "core_s_per_GB": lat[("core_s_per_GB", nbytes)]}), flush=True)
            if "rn50_core_s_per_GB" in lat:
                print(json.dumps({"rn50_core_s_per_GB": lat["rn50_core_s_per_GB"]}), flush=True)
            if rn50 is not None:
                print(json.dumps({"resnet50_s": rn50}), flush=True)
        return 0
    import mlsl_tf as hvd
    import tensorflow as tf
    hvd.init()
    fresh = ns.mode == "fresh"
    lat = measure({"mlsl": lambda b, k: hvd_chain(hvd, tf, b, k, "mlsl", fresh),
                   "mpi": lambda b, k: mpi_chain(comm, b, k, fresh)}, ns.sizes, ns.reps, timer)
    rn50 = None
    if ns.resnet50:
        sizes = resnet50_gradient_sizes()
        t = time_alternating({"mlsl": resnet50_step(hvd, tf, sizes, "mlsl"),
                              "produce": resnet50_step(hvd, tf, sizes, "mlsl", reduce=False),
                              "mpi": mpi_one_allreduce(comm, sizes)}, ns.reps, timer)
        rn50 = {"resnet50_gradients": len(sizes), "bytes": 4 * sum(sizes), "ranks": comm.size,
                "mlsl_s": t["mlsl"], "produce_s": t["produce"], "mpi_one_allreduce_s": t["mpi"],
                "mlsl_over_mpi": t["mlsl"] / t["mpi"],
                "collective_over_mpi": (t["mlsl"] - t["produce"]) / t["mpi"], "target": "<= 1.05",
                "horovod_s": None}
        per_gb = {name: timer.core_s_per_gb(("step", name), 4 * sum(sizes) * ns.reps) for name in t}
        rn50.update(mlsl_core_s_per_GB=per_gb["mlsl"], produce_core_s_per_GB=per_gb["produce"],
                    mpi_core_s_per_GB=per_gb["mpi"],
                    collective_core_s_per_GB=per_gb["mlsl"] - per_gb["produce"])
    hvd_lat, hvd_note, hvd_rn50 = {}, "not importable", None
    try:
        import horovod.tensorflow  # noqa: F401
        (hvd_lat, hvd_rn50), hvd_note = horovod_inprocess(ns.sizes, ns.reps, timer, fresh, ns.resnet50), \
            "measured in-process"
    except ImportError:
        if ns.horovod_python:
            hvd.shutdown()  # leave the cores to the Horovod job
            if comm.rank == 0:
                hvd_lat, hvd_rn50, hvd_note = horovod_subprocess(ns.horovod_python, ns.sizes, ns.reps, comm.size,
                                                                 ns.mode, ns.resnet50, ns.horovod_mpiexec)
            wait_quietly(comm)
            hvd_note = comm.bcast(hvd_note)
    if rn50 and hvd_rn50:
        rn50.update(horovod_s=hvd_rn50, horovod_over_mlsl=hvd_rn50 / rn50["mlsl_s"],
                    horovod_core_s_per_GB=hvd_lat.get("rn50_core_s_per_GB"))
    if comm.rank == 0:
        rows = [dict(row(b, lat, hvd_lat, hvd_note), ranks=comm.size, mode=ns.mode) for b in ns.sizes]
        for r in rows:
            print(json.dumps(r), flush=True)
        if rn50:
            print(json.dumps(rn50), flush=True)
        print(json.dumps(dict(summary(rows, comm.size, ns.link_name, hvd_note), mode=ns.mode)), flush=True)
        if ns.plot:
            plot(rows, ns.plot)
    return 0


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=DEFAULT_SIZES,
                   help="comma-separated message sizes in bytes (multiples of 4)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size (medians are reported)")
    p.add_argument("--link", help="emulate a cluster link of this tbf rate (e.g. 2gbit); launches mpiexec itself")
    p.add_argument("--np", type=lambda s: [int(v) for v in s.split(",")],
                   help="rank counts to launch, one job each, e.g. 2,3,4 (default 2 with --link)")
    p.add_argument("--mode", choices=["fresh", "chain"], default="fresh",
                   help="fresh: each input newly computed, as gradients are (default); chain: x = allreduce(x)")
    p.add_argument("--resnet50", action="store_true", help="also time ResNet-50's 161 gradients issued together")
    p.add_argument("--plot", help="write a PNG of latency and algbw against size")
    p.add_argument("--horovod-python", help="interpreter of a venv with Horovod (and mpi4py, mpiexec next to it)")
    p.add_argument("--horovod-mpiexec", help="launcher of the MPI Horovod was built with (default: the mpiexec "
                   "next to --horovod-python); Open MPI's mpirun is detected")
    p.add_argument("--impl", choices=["mlsl", "horovod"], default="mlsl", help=argparse.SUPPRESS)
    p.add_argument("--expect-ranks", type=int, help=argparse.SUPPRESS)  # the launched ranks, checked
    p.add_argument("--link-name", help=argparse.SUPPRESS)  # what the launcher emulated, for the summary
    ns = p.parse_args(argv)
    if any(s <= 0 or s % 4 for s in ns.sizes):
        p.error("--sizes must be positive multiples of 4 bytes")
    return ns


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ns = parse(argv)
    if ns.link or ns.np:
        codes = [netlink.relaunch(__file__, argv, n, ns.link) for n in ns.np or [2]]
        return max(codes)
    return run_ranks(ns)


if __name__ == "__main__":
    sys.exit(main())
