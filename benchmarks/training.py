"""Training throughput of real Keras models, launched as users launch them: mlsl_tf's policies,
Horovod, and the two limits of each setting (compute alone, communication alone), measured in
the same run with the configurations interleaved.

    python benchmarks/training.py [--models resnet50,vgg16,transformer] [--links 2gbit,shm]
                                  [--configs ...] [--runs 3] [--np 2]
                                  [--horovod-python /work/hvd-venv/bin/python]
                                  [--plot training.png] [--timeline-png timeline.png]

Every job is `mlslrun -np N` (Horovod: its venv's `mpiexec -n N`) of this file in worker mode,
which does `import mlsl_tf.keras as hvd; hvd.init()` right after its imports, builds the model
on a fixed synthetic batch, compiles it with `hvd.DistributedOptimizer(SGD(momentum=0.9))` and
times `model.fit` after warm-up steps. A link is `shm` (shared memory) or a rate: then each rank
runs on its own emulated host (benchmarks/hosts.py: a network namespace per rank on a bridge,
tbf on each host's link, MPICH over TCP).

Configurations (`--configs`, default all), each a separate job:
  fifo          MLSL_TF_PRIORITY=fifo, MLSL_TF_CROSS_ITERATION=0: Horovod's order, update in the step
  priority      MLSL_TF_CROSS_ITERATION=0: priority order, update in the step
  overlap       the defaults: priority + cross-iteration overlap
  overlap_bf16  the defaults with DistributedOptimizer(compression=hvd.Compression.bf16)
  horovod       Horovod 0.28.1 (--horovod-python; TF 2.15, tf.keras), same model and loop
  horovod_compute  compute alone in Horovod's venv (TF 2.15, tf.keras, plain optimizer): the
                compute limit of the horovod job, whose TensorFlow and Keras are not ours
  compute       compute alone: the same training with a plain optimizer (no reduction)
  comm          communication alone: the model's gradients (shapes, priorities, dtype) reduced
                by mlsl_tf each step with no compute; comm_bf16 the same in bf16
Efficiency of a configuration = max(compute step, comm step) / its step (comm_bf16 for
overlap_bf16; horovod_compute's step for horovod when it was measured). JSON lines: one per
job, then one per (model, link, config) with the median over runs, then a summary per (model,
link). --plot draws the medians as bars; --timeline-png draws
rank 0's timeline of two consecutive steps of the first overlap job (ResNet-50 at the first
link): each gradient's start (backward produced it), its chunks on the wire, and its take (the
next forward pass reached its layer).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MODELS = ("resnet50", "vgg16", "transformer")
CONFIGS = ("compute", "comm", "comm_bf16", "fifo", "priority", "overlap", "overlap_bf16", "horovod", "horovod_compute")
HOROVOD_CONFIGS = ("horovod", "horovod_compute")  # jobs run by Horovod's venv
CONFIG_ENV = {
    "fifo": {"MLSL_TF_PRIORITY": "fifo", "MLSL_TF_CROSS_ITERATION": "0"},
    "priority": {"MLSL_TF_CROSS_ITERATION": "0"},
}
LIMIT_OF = {"fifo": "comm", "priority": "comm", "overlap": "comm", "overlap_bf16": "comm_bf16", "horovod": "comm"}
LAUNCHER_ENV = ("PMI_", "PMIX_", "HYD", "MPI_LOCAL", "OMPI_")  # what a nested launcher must not inherit


# ---------------------------------------------------------------------------------------------
# The models (Keras 3 here, tf.keras 2.15 in Horovod's venv: only names both have).

def model_spec(name):
    """(batch per rank, warm-up steps, timed steps) of a model on this 2-core machine."""
    return {"resnet50": (16, 5, 15), "vgg16": (2, 2, 4), "transformer": (16, 5, 15)}[name]


def build_model(name, keras, batch, seed):
    """(model, x, y, loss) for one fixed synthetic batch of `batch` samples."""
    import numpy as np
    rng = np.random.default_rng(seed)
    if name == "resnet50":  # 25.6 M parameters; 64x64 images on this machine
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=1000)
        x = rng.uniform(size=(batch, 64, 64, 3)).astype("float32")
        y = rng.integers(0, 1000, size=(batch, 1))
    elif name == "vgg16":  # 138 M parameters: the classifier needs 224x224 inputs
        model = keras.applications.VGG16(weights=None, input_shape=(224, 224, 3), classes=1000)
        x = rng.uniform(size=(batch, 224, 224, 3)).astype("float32")
        y = rng.integers(0, 1000, size=(batch, 1))
    elif name == "transformer":  # a 4-block encoder on token ids: the embedding's gradient is sparse
        vocab, seq, dim, heads, blocks = 32000, 128, 256, 4, 4
        layers = keras.layers
        tokens = keras.Input((seq,), dtype="int32")
        h = layers.Embedding(vocab, dim)(tokens)
        for _ in range(blocks):
            a = layers.MultiHeadAttention(heads, dim // heads)(h, h)
            h = layers.LayerNormalization()(h + a)
            f = layers.Dense(4 * dim, activation="relu")(h)
            h = layers.LayerNormalization()(h + layers.Dense(dim)(f))
        out = layers.Dense(2)(layers.GlobalAveragePooling1D()(h))
        model = keras.Model(tokens, out)
        x = rng.integers(0, vocab, size=(batch, seq)).astype("int32")
        y = rng.integers(0, 2, size=(batch, 1))
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=name == "transformer")
    return model, x, y, loss


# ---------------------------------------------------------------------------------------------
# Worker: one rank of one job.

def thread_cpu():
    """CPU seconds so far of this process's threads, summed by thread name (mlsl_tf's background
    thread is 'mlsl_tf_comm'; TensorFlow's pools are 'tf_*')."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return out


def cpu_per_step(before, steps):
    """CPU seconds per step by thread name since thread_cpu() returned `before` (threads that used none left out)."""
    cpu = {k: round((v - before.get(k, 0.0)) / steps, 4) for k, v in thread_cpu().items()}
    return {k: v for k, v in sorted(cpu.items()) if v > 0}


def worker(ns):
    import tensorflow as tf
    if ns.impl == "horovod":
        import horovod.tensorflow.keras as hvd
    else:
        import mlsl_tf.keras as hvd
    hvd.init()
    if ns.impl == "horovod":
        keras = tf.keras
        sgd = keras.optimizers.legacy.SGD
    else:
        import keras
        sgd = keras.optimizers.SGD
    batch, warmup, steps = model_spec(ns.model)
    steps = ns.steps or steps
    keras.utils.set_random_seed(1234)
    model, x, y, loss = build_model(ns.model, keras, batch, seed=hvd.rank())
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    plain = ns.config in ("compute", "horovod_compute")  # compute alone: no reduction
    if ns.config in ("comm", "comm_bf16"):
        result = comm_only(ns, hvd, tf, model, batch, warmup, steps)
    else:
        opt = sgd(0.01, momentum=0.9)
        if not plain:
            compression = hvd.Compression.bf16 if ns.config == "overlap_bf16" else hvd.Compression.none
            opt = hvd.DistributedOptimizer(opt, compression=compression)
        model.compile(optimizer=opt, loss=loss)
        callbacks = [] if plain else [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0, callbacks=callbacks)
        ends = []
        clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
        hvd.allreduce(tf.constant(0.0), name="training.barrier")
        cpu_before = thread_cpu()
        counters = counters_before = None
        if ns.impl == "mlsl_tf":
            import mlsl_tf  # noqa: PLC0415 (the Horovod job has no mlsl_tf)
            counters = mlsl_tf.stats
            counters_before = counters()
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
        times = [b - a for a, b in zip([start] + ends[:-1], ends)]
        result = {"step_s": statistics.median(times[1:]), "mean_step_s": (ends[-1] - start) / steps,
                  "cpu_s_per_step": cpu_per_step(cpu_before, steps)}
        if ns.impl == "mlsl_tf":  # results still parked: the last step's updates were deferred
            from mlsl_tf import _library
            result["deferred_at_end"] = _library.c_api().mlsl_tf_parked()
            # the runtime's counters per timed step: collectives, those that rode in the control
            # message, chunks started, tensors packed into fused buffers, allreduces into their input
            after = counters()
            result["per_step"] = {k: (after[k] - counters_before[k]) / steps
                                  for k in ("requests", "eager", "chunks", "fused_tensors", "in_place")}
    step = max(hvd.allgather(tf.constant([result["step_s"]], tf.float64)).numpy())  # the slowest rank
    result.update(model=ns.model, config=ns.config, impl=ns.impl, ranks=hvd.size(), batch_per_rank=batch,
                  steps=steps, step_s=float(step), samples_per_s=batch * hvd.size() / float(step),
                  parameters=int(sum(int(tf.size(v)) for v in model.trainable_variables)))
    if hvd.rank() == 0:
        print(json.dumps({"result": result}), flush=True)


def comm_only(ns, hvd, tf, model, batch, warmup, steps):
    """The step's reductions alone: one tensor per trainable variable (forward index = priority,
    fresh every step), the sparse embedding gradient as its allgather of rows; no compute."""
    import mlsl_tf as mlsl
    compression = mlsl.Compression.bf16 if ns.config == "comm_bf16" else mlsl.Compression.none
    variables = list(model.trainable_variables)
    embedding = [v for v in variables if "embedding" in v.path]
    rows = batch * int(model.inputs[0].shape[1]) if embedding else 0

    @tf.function
    def step(k):
        outs = []
        for i, v in enumerate(variables):
            if any(v is e for e in embedding):
                values = tf.fill([rows, v.shape[1]], k)
                outs.append(mlsl.allgather(values, name=f"comm.{i}.values", priority=i))
                outs.append(mlsl.allgather(tf.zeros([rows], tf.int64) + tf.cast(k, tf.int64),
                                           name=f"comm.{i}.indices", priority=i))
            else:
                outs.append(mlsl.allreduce(tf.fill(v.shape, k), name=f"comm.{i}", priority=i,
                                           compression=compression))
        return tf.add_n([tf.reduce_sum(o[:1]) if o.dtype == tf.float32 else 0.0 for o in outs])

    for k in range(warmup):
        float(step(tf.constant(float(k))))
    times = []
    cpu_before = thread_cpu()
    for k in range(steps):
        start = time.perf_counter()
        float(step(tf.constant(float(k))))
        times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times), "mean_step_s": sum(times) / len(times),
            "cpu_s_per_step": cpu_per_step(cpu_before, steps)}


# ---------------------------------------------------------------------------------------------
# Orchestrator: the jobs, interleaved, under each link.

def clean_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_ENV) and not k.startswith("MLSL_TF_")}
    env.update(extra)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def job_argv(ns, model, config, enter, timeline=None):
    """(argv, env) of one job."""
    worker_args = ["--worker", "--model", model, "--config", config] + (["--steps", str(ns.steps)] if ns.steps else [])
    if config in HOROVOD_CONFIGS:
        python = ns.horovod_python
        mpiexec = os.path.join(os.path.dirname(python), "mpiexec")
        argv = [mpiexec, "-n", str(ns.np)] + enter + [python, os.path.abspath(__file__)] + worker_args + \
            ["--impl", "horovod"]
        return argv, clean_env({})
    python = ns.python
    argv = [python, "-m", "mlsl_tf.runner", "-np", str(ns.np), "--no-tag-output"] + enter + [python, os.path.abspath(__file__)] + \
        worker_args
    env = clean_env(CONFIG_ENV.get(config, {}))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if timeline:
        env["MLSL_TF_TIMELINE"] = timeline
    return argv, env


def run_job(argv, env, timeout):
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    rows = [json.loads(line)["result"] for line in proc.stdout.splitlines() if line.startswith('{"result"')]
    if proc.returncode != 0 or not rows:
        tail = [line for line in (proc.stderr + proc.stdout).strip().splitlines() if line.strip()][-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    rows[-1]["wall_s"] = round(time.perf_counter() - start, 1)
    return rows[-1]


def links_context(link, np_):
    if link == "shm":
        import contextlib
        return contextlib.nullcontext(None)
    import hosts
    return hosts.Hosts(np_, link)


def orchestrate(ns):
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds the with blocks: namespaces deleted
    configs = [c for c in ns.configs if c not in HOROVOD_CONFIGS or ns.horovod_python]
    for c in ns.configs:
        if c in HOROVOD_CONFIGS and not ns.horovod_python:
            print(json.dumps({"config": c, "skipped": True,
                              "reason": "no --horovod-python given (a venv with Horovod 0.28.1, DESIGN.md)"}), flush=True)
    results = {}  # (model, link, config) -> [rows]
    timeline_path = None
    if ns.timeline_png:
        timeline_path = os.path.join(tempfile.mkdtemp(prefix="mlsl-training-"), "timeline.json")
    for run in range(ns.runs):
        for model in ns.models:
            for link in ns.links:
                with links_context(link, ns.np) as h:
                    enter = h.enter(ns.python) if h else []
                    order = configs if run % 2 == 0 else list(reversed(configs))
                    for config in order:
                        tl = None
                        if timeline_path and run == 0 and model == ns.models[0] and link == ns.links[0] \
                                and config == "overlap":
                            tl = timeline_path
                        argv, env = job_argv(ns, model, config, enter if config not in HOROVOD_CONFIGS or not h
                                             else h.enter(ns.horovod_python), tl)
                        if h:
                            env.update(h.env({}))
                        row = run_job(argv, env, ns.timeout)
                        row.update(model=model, link=link, config=config, run=run)
                        print(json.dumps({"job": row}), flush=True)
                        results.setdefault((model, link, config), []).append(row)
    summaries = summarize(results, ns)
    if ns.plot:
        plot(summaries, ns.plot)
    if ns.timeline_png and timeline_path and os.path.exists(timeline_path):
        draw_timeline(timeline_path, ns.timeline_png)
    return 0


def summarize(results, ns):
    medians = {}
    for (model, link, config), rows in results.items():
        ok = [r for r in rows if "error" not in r]
        row = {"model": model, "link": link, "config": config, "runs": len(ok),
               "errors": [r["error"] for r in rows if "error" in r]}
        if ok:
            row["step_s"] = statistics.median(r["step_s"] for r in ok)
            row["samples_per_s"] = statistics.median(r["samples_per_s"] for r in ok)
            row["samples_per_s_runs"] = [round(r["samples_per_s"], 2) for r in ok]
        medians[(model, link, config)] = row
    summaries = []
    for (model, link, config), row in sorted(medians.items()):
        limit = medians.get((model, link, LIMIT_OF.get(config, "")))
        # Horovod's compute limit is its own venv's (another TensorFlow and Keras) when measured
        compute = medians.get((model, link, "horovod_compute")) if config == "horovod" else None
        compute = compute or medians.get((model, link, "compute"))
        if "step_s" in row and limit and compute and "step_s" in limit and "step_s" in compute:
            bound = max(limit["step_s"], compute["step_s"])
            row["limit_step_s"] = bound
            row["efficiency"] = bound / row["step_s"]
        hvd = medians.get((model, link, "horovod"))
        if "samples_per_s" in row and hvd and "samples_per_s" in hvd and config not in HOROVOD_CONFIGS:
            row["over_horovod"] = row["samples_per_s"] / hvd["samples_per_s"]
        print(json.dumps({"median": row}), flush=True)
        summaries.append(row)
    return summaries


def plot(summaries, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["model"], r["link"]) for r in summaries})
    order = [c for c in CONFIGS if any(r["config"] == c for r in summaries)]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), squeeze=False)
    for ax, (model, link) in zip(axes[0], groups):
        rows = {r["config"]: r for r in summaries if r["model"] == model and r["link"] == link}
        names = [c for c in order if c in rows and "samples_per_s" in rows[c] and not c.startswith("comm")]
        values = [rows[c]["samples_per_s"] for c in names]
        colours = ["#999999" if c == "compute" else "#e8a0a0" if c == "horovod_compute" else "#d62728" if c == "horovod"
                   else "#2a6fdb" for c in names]
        ax.bar(range(len(names)), values, color=colours)
        for i, c in enumerate(names):
            eff = rows[c].get("efficiency")
            ax.annotate(f"{values[i]:.1f}" + (f"\n{eff:.0%}" if eff else ""), (i, values[i]), ha="center",
                        va="bottom", fontsize=7)
        for c, style in (("comm", "--"), ("comm_bf16", ":")):
            if c in rows and "step_s" in rows[c] and "compute" in rows:
                batch = rows["compute"]["samples_per_s"] * rows["compute"]["step_s"]
                ax.axhline(batch / rows[c]["step_s"], ls=style, color="k", lw=0.8, label=f"{c} alone")
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{model}, {link}", fontsize=9)
        ax.set_ylabel("samples/s (all ranks, median)")
        ax.legend(fontsize=7)
    fig.suptitle("Training throughput (label: samples/s and efficiency = max(compute, comm) / step)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def draw_timeline(trace_path, png_path):
    """Two consecutive steps of the trace, ending one step before its end (the last step's late
    reductions have no next forward pass beside them)."""
    sys.path.insert(0, ROOT)
    from mlsl_tf import timeline
    trace = timeline.load(trace_path).for_rank(0)
    window = trace.window(*two_steps(trace))
    timeline.draw(window, png_path, title="rank 0: two consecutive training steps (overlap)", order="name")


def two_steps(trace):
    """(start_us, end_us) of the two steps before the last one: every gradient starts once per step,
    so the step boundaries are one gradient's 'start' times (the first of a step's backward
    pass: the gradient whose starts come earliest within their step). Gaps inside a backward
    pass (VGG-16's layers take hundreds of ms) cannot split a step this way."""
    starts = {}
    for i in trace.instants:
        if i.kind == "start":
            starts.setdefault(i.name, []).append(i.at_us)
    steps = max((len(v) for v in starts.values()), default=0)
    if steps < 4:
        return None, None
    full = {n: sorted(v) for n, v in starts.items() if len(v) == steps}
    first = min(full.values(), key=lambda v: v[-1])  # starts first in the last step
    margin = 0.02 * (first[-1] - first[-2])
    return first[-4] - margin, first[-2] - margin


def markdown(paths):
    """A markdown table of the median lines in result files: samples/s per configuration for each
    (model, link), with efficiency and the ratio to Horovod."""
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line)["median"] for line in f if line.startswith('{"median"')]
    configs = [c for c in CONFIGS if any(r["config"] == c for r in rows)]
    out = ["| model, link | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for model, link in sorted({(r["model"], r["link"]) for r in rows}, key=lambda ml: (MODELS.index(ml[0]), ml[1])):
        cells = []
        for c in configs:
            r = next((r for r in rows if (r["model"], r["link"], r["config"]) == (model, link, c)), None)
            if r is None or "samples_per_s" not in r:
                cells.append("-")
                continue
            cell = f"{r['samples_per_s']:.1f}"
            extra = [f"{r['efficiency']:.0%}"] if "efficiency" in r else []
            if "over_horovod" in r and c not in ("compute", "comm", "comm_bf16", "horovod_compute"):
                extra.append(f"{r['over_horovod']:.2f}x hvd")
            cells.append(cell + (f" ({', '.join(extra)})" if extra else ""))
        out.append(f"| {model}, {link} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--models", type=split, default=list(MODELS))
    p.add_argument("--links", type=split, default=["2gbit"], help="shm or tbf rates, e.g. 1gbit,2gbit,10gbit,shm")
    p.add_argument("--configs", type=split, default=list(CONFIGS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, help="timed steps per job (default: per model)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per job")
    p.add_argument("--python", default=sys.executable, help="interpreter with mlsl_tf (default: this one)")
    p.add_argument("--horovod-python", help="interpreter of a venv with Horovod 0.28.1 (mpiexec next to it)")
    p.add_argument("--plot", help="PNG bar chart of the medians")
    p.add_argument("--timeline-png", help="PNG of two consecutive steps of the first overlap job (rank 0)")
    p.add_argument("--markdown", nargs="+", metavar="JSONL", help="print a markdown table of these result files and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="mlsl_tf", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if not ns.worker:
        bad = [m for m in ns.models if m not in MODELS] + [c for c in ns.configs if c not in CONFIGS]
        if bad:
            p.error(f"unknown model/config: {', '.join(bad)}")
        if ns.runs < 1 or ns.np < 2:
            p.error("--runs >= 1 and --np >= 2")
        if ns.horovod_python and not os.access(ns.horovod_python, os.X_OK):
            p.error(f"--horovod-python {ns.horovod_python} is not executable")
    return ns


def main(argv=None):
    ns = parse(sys.argv[1:] if argv is None else argv)
    if ns.markdown:
        print(markdown(ns.markdown))
        return 0
    if ns.worker:
        return worker(ns)
    return orchestrate(ns)


if __name__ == "__main__":
    sys.exit(main())
