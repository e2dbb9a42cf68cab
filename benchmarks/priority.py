"""Priority scheduling on a real backward pass: the 161 ResNet-50 gradients, issued in backprop
order with the spacing of the compute that produces them, reduced under each policy. Reports
the first layer's exposed time (its gradient ready -> its reduced result available: what the
next forward pass waits for) and the total time (first submission -> last result).

    python benchmarks/priority.py --link 2gbit [--reps 7] [--plot priority.png]   # 2 ranks, emulated link
    mpiexec -n 2 python benchmarks/priority.py [...]                               # shared memory
    ... --timeline-dir DIR      # also write DIR/{priority,fifo}.json (rank 0, first measured run)
    ... --horovod-python /path/to/hvd-venv/bin/python   # Horovod as a separate MPI job

Policies, alternated run by run so they share the machine's noise:
  priority  mlsl_tf, MLSL_TF_PRIORITY=priority (variable i has priority i, forward order)
  fifo      mlsl_tf, MLSL_TF_PRIORITY=fifo
  mpi       raw MPI: mpi4py Iallreduce of each gradient in issue order, the issuing thread
            polling MPI_Testsome while it waits for the next gradient
  horovod   where importable (or --horovod-python), same issue pattern; else a JSON line says
            why it was skipped
mlsl_tf settings are read at init, so each run is: shutdown, set MLSL_TF_* , init, one warm-up
pass (negotiation), one measured pass. MLSL_TF_CHUNK_BYTES / MLSL_TF_INFLIGHT /
MLSL_TF_FUSION_THRESHOLD from the environment (or --chunk-bytes/--inflight/--fusion-threshold)
apply to both mlsl_tf policies.

Gradient sizes: Keras' ResNet50(weights=None) trainable variables in forward order, without the
53 convolution biases (each conv feeds a BatchNorm, which makes them redundant; torchvision's
ResNet-50 has none): 161 tensors, 97.5 MiB of float32. --conv-bias keeps them (214 tensors).
--check-keras builds the Keras model and checks the generated list against it.

Backward pass: the total --compute-ms is split over the layers in proportion to their size;
the gradient of layer i becomes ready when the compute of every layer after it and of itself is
done (last layer first). mlsl_tf and Horovod calls block until their result, so each gradient
has a worker thread that submits it when the issuing thread signals it ready.

Per run, each metric is the maximum over ranks; the reported value is the median over runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlsl_tf
import netlink  # noqa: E402

LAUNCHER_ENV = ("PMI_", "PMIX_", "HYD", "MPI_LOCAL", "OMPI_")  # what a nested mpiexec must not inherit
KNOBS = {"chunk_bytes": "MLSL_TF_CHUNK_BYTES", "inflight": "MLSL_TF_INFLIGHT",
         "fusion_threshold": "MLSL_TF_FUSION_THRESHOLD"}
EXPOSED_TARGET, TOTAL_TARGET = 5.0, 1.05  # fifo/priority first-layer exposed >= 5; priority/fifo total <= 1.05
MLSL_POLICIES = ("priority", "fifo")


# ---------------------------------------------------------------------------------------------
# The model: pure functions.

def resnet50_variables(conv_bias=False):
    """(name, shape) of Keras' ResNet50(weights=None, classes=1000) trainable variables, in the
    order model.trainable_variables lists them (forward order); without the conv biases unless
    conv_bias."""
    out = []

    def conv(name, k, cin, cout):
        out.append((f"{name}_conv/kernel", (k, k, cin, cout)))
        if conv_bias:
            out.append((f"{name}_conv/bias", (cout,)))

    def bn(name, c):
        out.extend([(f"{name}_bn/gamma", (c,)), (f"{name}_bn/beta", (c,))])

    conv("conv1", 7, 3, 64)
    bn("conv1", 64)
    cin = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=2):
        for b in range(1, blocks + 1):
            p = f"conv{stage}_block{b}"
            conv(p + "_1", 1, cin, width)
            bn(p + "_1", width)
            conv(p + "_2", 3, width, width)
            bn(p + "_2", width)
            if b == 1:  # projection shortcut; Keras creates it before the block's last conv
                conv(p + "_0", 1, cin, 4 * width)
            conv(p + "_3", 1, width, 4 * width)
            if b == 1:
                bn(p + "_0", 4 * width)
            bn(p + "_3", 4 * width)
            cin = 4 * width
    out.extend([("predictions/kernel", (cin, 1000)), ("predictions/bias", (1000,))])
    return out


def keras_variables(conv_bias):
    """The same list read from a Keras model built here (nothing is downloaded)."""
    import keras
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    return [(v.path, tuple(v.shape)) for v in model.trainable_variables
            if conv_bias or not (v.path.endswith("/bias") and "_conv/" in v.path)]


def num_elements(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def backprop_schedule(sizes, compute_s):
    """[(forward index, ready offset in s)] in issue order: the last layer first, each gradient
    ready once the compute of its own layer (compute_s split in proportion to size) is done."""
    total = float(sum(sizes))
    out, t = [], 0.0
    for i in reversed(range(len(sizes))):
        t += compute_s * sizes[i] / total
        out.append((i, t))
    return out


def run_metrics(ready, done, called=None):
    """First layer's exposed time and the total time (s) of one run on one rank; with the
    times the reductions were called, also the first layer's time inside the call."""
    out = {"first_exposed_s": done[0] - ready[0], "total_s": max(done) - min(ready)}
    if called is not None:
        out["first_in_call_s"] = done[0] - called[0]
    return out


def median_summary(policy, runs, extra=None):
    """One JSON row for a policy from its per-run metrics (each already the max over ranks)."""
    first = [r["first_exposed_s"] for r in runs]
    total = [r["total_s"] for r in runs]
    row = {"policy": policy, "runs": len(runs),
           "first_layer_exposed_ms": statistics.median(first) * 1e3,
           "total_ms": statistics.median(total) * 1e3,
           "first_layer_exposed_ms_runs": [round(v * 1e3, 3) for v in first],
           "total_ms_runs": [round(v * 1e3, 3) for v in total]}
    if all("first_in_call_s" in r for r in runs):  # the rest is the worker thread's wake-up
        row["first_layer_in_call_ms"] = statistics.median(r["first_in_call_s"] for r in runs) * 1e3
    row.update(extra or {})
    return row


def summary(rows, compute_ms, link, nbytes, ntensors):
    by = {r["policy"]: r for r in rows if "first_layer_exposed_ms" in r}
    out = {"summary": True, "link": link or "shared memory", "compute_ms": compute_ms,
           "tensors": ntensors, "bytes": nbytes,
           "targets": f"first-layer exposed >= {EXPOSED_TARGET:g}x lower than fifo; "
                      f"total <= {TOTAL_TARGET:g}x fifo's"}
    p, f, m = by.get("priority"), by.get("fifo"), by.get("mpi")
    if p and f:
        out["exposed_fifo_over_priority"] = f["first_layer_exposed_ms"] / p["first_layer_exposed_ms"]
        out["total_priority_over_fifo"] = p["total_ms"] / f["total_ms"]
        out["exposed_target_met"] = out["exposed_fifo_over_priority"] >= EXPOSED_TARGET
        out["total_target_met"] = out["total_priority_over_fifo"] <= TOTAL_TARGET
    if p and m:
        out["exposed_mpi_over_priority"] = m["first_layer_exposed_ms"] / p["first_layer_exposed_ms"]
        out["total_priority_over_mpi"] = p["total_ms"] / m["total_ms"]
    h = by.get("horovod")
    if p and h:
        out["exposed_horovod_over_priority"] = h["first_layer_exposed_ms"] / p["first_layer_exposed_ms"]
        out["total_priority_over_horovod"] = p["total_ms"] / h["total_ms"]
    return out


# ---------------------------------------------------------------------------------------------
# Issuing one backward pass.

def wait_until(deadline, poll=None):
    """Sleep (or call poll() repeatedly) until perf_counter() >= deadline."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if poll is not None:
            poll()
        else:
            time.sleep(left)


def threaded_pass(reduce_fn, tensors, schedule):
    """One backward pass through a blocking reduce_fn(i, tensor): a worker thread per gradient,
    released when the gradient is ready. Returns (ready, called, done) perf_counter times per
    index: signalled ready, reduce_fn called, reduce_fn returned."""
    n = len(tensors)
    ready, called, done = [0.0] * n, [0.0] * n, [0.0] * n
    go = [threading.Event() for _ in range(n)]
    errors = []

    def worker(i):
        go[i].wait()
        called[i] = time.perf_counter()
        try:
            reduce_fn(i, tensors[i])
        except BaseException as e:  # reported after the pass; the others still finish
            errors.append(f"gradient {i}: {e}")
        done[i] = time.perf_counter()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    for i, offset in schedule:
        wait_until(t0 + offset)
        ready[i] = time.perf_counter()
        go[i].set()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("reduction failed: " + "; ".join(errors[:3]))
    return ready, called, done


def graph_backward(allreduce_fn, tensors, schedule, tf):
    """A backward pass as a tf.function, what a training step's graph looks like to the
    executor: each layer's compute is a numpy_function that sleeps its share (holding an executor
    thread, as a kernel does), then its gradient goes to allreduce_fn(i, tensor). Returns run(),
    which executes one pass and returns (ready, done) perf_counter times per index: the layer's
    compute ended, the reduced gradient was available to the graph."""
    n = len(tensors)
    ready, done = [0.0] * n, [0.0] * n
    previous, spans = 0.0, []
    for i, offset in schedule:
        spans.append((i, offset - previous))
        previous = offset

    def compute(i, seconds):
        def run(x):
            time.sleep(seconds)
            ready[i] = time.perf_counter()
            return x
        return run

    def stamp(i):
        def run(x):
            done[i] = time.perf_counter()
            return x
        return run

    # Declared stateless: TF chains stateful ops in program order, which would make layer i-1's
    # compute wait for layer i's reduction to be stamped.
    @tf.function
    def backward(seed):
        t, outs = seed, []
        for i, seconds in spans:
            t = tf.numpy_function(compute(i, seconds), [t], tf.float32, stateful=False)
            reduced = allreduce_fn(i, tensors[i] * t[0])
            outs.append(tf.numpy_function(stamp(i), [reduced[:1]], tf.float32, stateful=False))
        return tf.add_n(outs) + t

    def run():
        backward(tf.ones([1]))
        return list(ready), list(done)
    return run


def mpi_pass(comm, buffers, schedule):
    """One backward pass of raw MPI: Iallreduce in issue order, polling Testsome between."""
    from mpi4py import MPI
    n = len(buffers)
    ready, done = [0.0] * n, [0.0] * n
    reqs, idx = [], []

    def poll():
        if not reqs:
            return
        finished = MPI.Request.Testsome(reqs)
        if finished:
            now = time.perf_counter()
            for k in sorted(finished, reverse=True):
                done[idx[k]] = now
                del reqs[k], idx[k]

    for b in buffers:
        b.fill(1.0)
    t0 = time.perf_counter()
    for i, offset in schedule:
        wait_until(t0 + offset, poll)
        ready[i] = time.perf_counter()
        reqs.append(comm.Iallreduce(MPI.IN_PLACE, [buffers[i], MPI.FLOAT], op=MPI.SUM))
        idx.append(i)
        poll()
    while reqs:
        poll()
    return ready, done


# ---------------------------------------------------------------------------------------------
# The policies, on every rank.

class Bench:
    def __init__(self, comm, shapes, schedule, timeline_dir=None, graph=False):
        import numpy as np
        self.comm, self.shapes, self.schedule = comm, shapes, schedule
        self.graph, self.graph_run = graph, None
        self.timeline_dir = timeline_dir
        self.np_buffers = [np.ones(num_elements(s), np.float32) for s in shapes]
        self.tensors = None
        self.per_layer = {}  # policy -> per-layer exposed times (s) of rank 0, per run

    def _max_over_ranks(self, metrics):
        from mpi4py import MPI
        return {k: self.comm.allreduce(v, op=MPI.MAX) for k, v in metrics.items()}

    def _record(self, policy, ready, done, called=None):
        self.per_layer.setdefault(policy, []).append([d - r for r, d in zip(ready, done)])
        return self._max_over_ranks(run_metrics(ready, done, called))

    def mlsl_run(self, policy, knobs, timeline=None):
        """shutdown, settings, init, warm-up, measured pass; (metrics, stats delta)."""
        import mlsl_tf as hvd
        import tensorflow as tf
        if hvd.is_initialized():
            self.comm.Barrier()
            hvd.shutdown()
        self.comm.Barrier()
        os.environ["MLSL_TF_PRIORITY"] = policy
        for key, var in KNOBS.items():
            if knobs.get(key) is not None:
                os.environ[var] = str(knobs[key])
        if timeline:
            os.environ["MLSL_TF_TIMELINE"] = timeline
        else:
            os.environ.pop("MLSL_TF_TIMELINE", None)
        hvd.init()
        if self.tensors is None:
            self.tensors = [tf.ones([num_elements(s)], tf.float32) for s in self.shapes]

        def reduce_fn(i, x):
            return hvd.allreduce(x, op=hvd.Sum, name=f"grad_{i}", priority=i)

        first = hvd.allreduce(self.tensors[0], op=hvd.Sum, name="grad_0", priority=0)
        if float(tf.reduce_min(first)) != hvd.size() or float(tf.reduce_max(first)) != hvd.size():
            raise RuntimeError(f"{policy}: allreduce of ones did not give {hvd.size()}")
        called = None
        if self.graph:
            if self.graph_run is None:
                self.graph_run = graph_backward(reduce_fn, self.tensors, self.schedule, tf)
            self.graph_run()  # traces; negotiates every name
            self.comm.Barrier()
            before = hvd.stats()
            ready, done = self.graph_run()
        else:
            threaded_pass(reduce_fn, self.tensors, self.schedule)  # negotiates every name
            self.comm.Barrier()
            before = hvd.stats()
            ready, called, done = threaded_pass(reduce_fn, self.tensors, self.schedule)
        after = hvd.stats()
        delta = {k: after[k] - before[k] for k in ("chunks", "preemptions", "fused_buffers", "fused_tensors")}
        if timeline:  # the file is complete once the runtime is shut down
            self.comm.Barrier()
            hvd.shutdown()
        return self._record(policy, ready, done, called), delta

    def mpi_run(self):
        import mlsl_tf as hvd
        if hvd.is_initialized():  # leave MPI and the cores to the raw-MPI pass
            self.comm.Barrier()
            hvd.shutdown()
        self.comm.Barrier()
        mpi_pass(self.comm, self.np_buffers, self.schedule)  # warm-up
        self.comm.Barrier()
        ready, done = mpi_pass(self.comm, self.np_buffers, self.schedule)
        if self.np_buffers[0][0] != self.comm.size:
            raise RuntimeError(f"mpi: allreduce of ones gave {self.np_buffers[0][0]}, not {self.comm.size}")
        return self._record("mpi", ready, done)

    def horovod_inprocess(self, reps):
        import horovod.tensorflow as hhvd
        import tensorflow as tf
        hhvd.init()
        tensors = [tf.ones([num_elements(s)], tf.float32) for s in self.shapes]

        # Horovod names an eager op by its type, so concurrent eager allreduces from the worker
        # threads collide ("same name as another tensor that is currently being processed"):
        # each gradient gets its own tf.function, where the name= is the node's name.
        fns = [tf.function(lambda x, i=i: hhvd.allreduce(x, op=hhvd.Sum, name=f"grad_{i}")) for i in range(len(tensors))]

        def reduce_fn(i, x):
            return fns[i](x)

        if self.graph:
            run = graph_backward(lambda i, x: hhvd.allreduce(x, op=hhvd.Sum, name=f"grad_{i}"), tensors,
                                 self.schedule, tf)
            run()
            runs = []
            for _ in range(reps):
                self.comm.Barrier()
                ready, done = run()
                runs.append(self._record("horovod", ready, done))
            return runs
        for i, x in enumerate(tensors):  # trace every function before the timed passes
            fns[i](x)
        threaded_pass(reduce_fn, tensors, self.schedule)
        runs = []
        for _ in range(reps):
            self.comm.Barrier()
            ready, called, done = threaded_pass(reduce_fn, tensors, self.schedule)
            runs.append(self._record("horovod", ready, done, called))
        return runs


def horovod_subprocess(python, ns, nranks):
    """This file under `python`'s venv (mpiexec next to it) in --impl horovod mode: (runs, note)."""
    if not (python and os.access(python, os.X_OK)):
        return None, f"skipped: {python} is not an executable interpreter"
    mpiexec = os.path.join(os.path.dirname(python), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        return None, f"skipped: no mpiexec next to {python}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_ENV)}
    cmd = [mpiexec, "-n", str(nranks), python, os.path.abspath(__file__), "--impl", "horovod",
           "--reps", str(ns.reps), "--compute-ms", str(ns.compute_ms)] + (["--conv-bias"] if ns.conv_bias else []) + \
        (["--graph"] if ns.graph else [])
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "failed: the Horovod job timed out"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return None, f"failed (exit {proc.returncode}): {tail[0]}"
    return rows[0]["runs_detail"], f"measured with {python}"


def run_ranks(ns):
    from mpi4py import MPI  # first: MPI_Init_thread(MULTIPLE), which mlsl_tf then reuses
    comm = MPI.COMM_WORLD
    shapes = [s for _, s in resnet50_variables(ns.conv_bias)]
    sizes = [num_elements(s) * 4 for s in shapes]
    schedule = backprop_schedule(sizes, ns.compute_ms / 1e3)
    bench = Bench(comm, shapes, schedule, graph=ns.graph)
    if ns.impl == "horovod":  # a child job started by horovod_subprocess
        runs = bench.horovod_inprocess(ns.reps)
        if comm.rank == 0:
            print(json.dumps({"runs_detail": runs}), flush=True)
        return 0

    knobs = {k: getattr(ns, k) for k in KNOBS}
    runs = {p: [] for p in ns.policies}
    stats = {p: None for p in ns.policies if p in MLSL_POLICIES}
    for rep in range(ns.reps):
        for policy in ns.policies:
            if policy == "mpi":
                runs[policy].append(bench.mpi_run())
                continue
            timeline = None
            if ns.timeline_dir and rep == 0:
                os.makedirs(ns.timeline_dir, exist_ok=True)
                timeline = os.path.join(ns.timeline_dir, f"{policy}.json")
            metrics, stats[policy] = bench.mlsl_run(policy, knobs, timeline)
            runs[policy].append(metrics)
    import mlsl_tf as hvd
    effective = {}
    if any(p in MLSL_POLICIES for p in ns.policies):
        declared = hvd.settings()  # the values the last init read: environment, else default
        effective = {key: int(declared[var][2]) for key, var in KNOBS.items()}
        hvd.shutdown()
    comm.Barrier()

    hvd_runs, hvd_note = None, "not importable (horovod.tensorflow)"
    try:
        import horovod.tensorflow  # noqa: F401
        hvd_runs, hvd_note = bench.horovod_inprocess(ns.reps), "measured in-process"
    except ImportError:
        if ns.horovod_python:
            if comm.rank == 0:
                hvd_runs, hvd_note = horovod_subprocess(ns.horovod_python, ns, comm.size)
            hvd_runs, hvd_note = comm.bcast((hvd_runs, hvd_note))
        else:
            hvd_note = "skipped: horovod.tensorflow is not importable here and no --horovod-python was given"

    if comm.rank != 0:
        return 0
    rows = []
    for policy in ns.policies:
        extra = {"settings": effective} if policy in MLSL_POLICIES else {}
        if stats.get(policy) is not None:
            extra["stats_last_run"] = stats[policy]
        rows.append(median_summary(policy, runs[policy], extra))
    if hvd_runs:
        rows.append(median_summary("horovod", hvd_runs, {"horovod": hvd_note}))
    else:
        rows.append({"policy": "horovod", "skipped": True, "reason": hvd_note})
    for r in rows:
        print(json.dumps(r), flush=True)
    line = summary(rows, ns.compute_ms, ns.link_name, sum(sizes), len(sizes))
    import tensorflow as tf
    line.update(issue="tf.function backward pass" if ns.graph else "a Python thread per gradient",
                inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads() or "TensorFlow's default")
    print(json.dumps(line), flush=True)
    if ns.plot:
        plot(rows, bench.per_layer, ns.plot, ns.compute_ms, ns.link_name)
    return 0


def plot(rows, per_layer, path, compute_ms, link):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measured = [r for r in rows if "first_layer_exposed_ms" in r]
    fig, (ax_bar, ax_layer) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    names = [r["policy"] for r in measured]
    x = range(len(names))
    w = 0.38
    first = [r["first_layer_exposed_ms"] for r in measured]
    total = [r["total_ms"] for r in measured]
    ax_bar.bar([i - w / 2 for i in x], first, w, label="first layer exposed")
    ax_bar.bar([i + w / 2 for i in x], total, w, label="total")
    for i, (f, t) in enumerate(zip(first, total)):
        ax_bar.annotate(f"{f:.0f}", (i - w / 2, f), ha="center", va="bottom", fontsize=8)
        ax_bar.annotate(f"{t:.0f}", (i + w / 2, t), ha="center", va="bottom", fontsize=8)
    ax_bar.set_xticks(list(x), names)
    ax_bar.set_ylabel("ms (median of runs)")
    ax_bar.legend(fontsize=8)
    ax_bar.set_title("first-layer exposed vs total")
    for policy, layers in per_layer.items():
        runs = [r for r in layers]
        n = len(runs[0])
        med = [statistics.median(run[i] for run in runs) * 1e3 for i in range(n)]
        ax_layer.plot(range(n), med, ".-", lw=0.8, ms=3, label=policy)
    ax_layer.set_yscale("log")
    ax_layer.set_xlabel("layer (forward index = priority)")
    ax_layer.set_ylabel("ready -> reduced (ms), rank 0 median")
    ax_layer.grid(True, which="both", alpha=0.3)
    ax_layer.legend(fontsize=8)
    ax_layer.set_title("per-gradient wait")
    fig.suptitle(f"ResNet-50 gradients in backprop order, {compute_ms:g} ms compute, {link or 'shared memory'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------
# Command line.

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compute-ms", type=float, default=400.0,
                   help="backward compute time split over the layers by size (default 400)")
    p.add_argument("--reps", type=int, default=5, help="measured runs per policy (median reported; >= 5)")
    p.add_argument("--policies", type=lambda s: s.split(","), default=["priority", "fifo", "mpi"],
                   help="comma-separated subset of priority,fifo,mpi (default: all three)")
    p.add_argument("--chunk-bytes", type=int, help="MLSL_TF_CHUNK_BYTES for the mlsl_tf policies")
    p.add_argument("--inflight", type=int, help="MLSL_TF_INFLIGHT for the mlsl_tf policies")
    p.add_argument("--fusion-threshold", type=int, help="MLSL_TF_FUSION_THRESHOLD for the mlsl_tf policies")
    p.add_argument("--conv-bias", action="store_true", help="keep the 53 conv biases (214 tensors)")
    p.add_argument("--graph", action="store_true",
                   help="issue the gradients from a tf.function backward pass whose layers hold an executor thread "
                        "(py_function sleeps), as a training graph does, instead of one Python thread per gradient")
    p.add_argument("--check-keras", action="store_true",
                   help="check the generated variable list against keras.applications.ResNet50 and exit")
    p.add_argument("--timeline-dir", help="write mlsl_tf timelines of the first measured run per policy here")
    p.add_argument("--plot", help="write a PNG plot here")
    p.add_argument("--link", help="emulate a cluster link of this tbf rate (e.g. 2gbit); launches mpiexec itself")
    p.add_argument("--np", type=int, help="ranks to launch (default 2 with --link)")
    p.add_argument("--horovod-python", help="interpreter of a venv with Horovod (and mpi4py, mpiexec next to it)")
    p.add_argument("--impl", choices=["mlsl", "horovod"], default="mlsl", help=argparse.SUPPRESS)
    p.add_argument("--link-name", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    bad = [x for x in ns.policies if x not in ("priority", "fifo", "mpi")]
    if bad or not ns.policies:
        p.error(f"--policies: unknown {','.join(bad) or '(empty)'}; choose from priority,fifo,mpi")
    if ns.reps < 1:
        p.error("--reps must be >= 1")
    if ns.compute_ms < 0:
        p.error("--compute-ms must be >= 0")
    for key in ("chunk_bytes", "inflight"):
        if getattr(ns, key) is not None and getattr(ns, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if ns.fusion_threshold is not None and ns.fusion_threshold < 0:
        p.error("--fusion-threshold must be >= 0")
    return ns


def check_keras(conv_bias):
    mine = [(n, tuple(s)) for n, s in resnet50_variables(conv_bias)]
    theirs = keras_variables(conv_bias)
    ok = mine == theirs
    print(json.dumps({"check_keras": ok, "tensors": len(mine), "keras_tensors": len(theirs),
                      "bytes": sum(num_elements(s) * 4 for _, s in mine)}))
    return 0 if ok else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ns = parse(argv)
    if ns.check_keras:
        return check_keras(ns.conv_bias)
    if ns.link or ns.np:
        ns.np = ns.np or 2
        return netlink.relaunch(__file__, argv, ns.np, ns.link)
    return run_ranks(ns)


if __name__ == "__main__":
    sys.exit(main())
