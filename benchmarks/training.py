"""Training throughput of real Keras models, launched as users launch them: mlsl_tf's policies,
Horovod, TensorFlow's MultiWorkerMirroredStrategy (MWMS), the limits of each setting (compute
alone, communication alone, and this machine's CPU-bound limit) and what communication costs in
CPU, measured in the same run with the configurations interleaved.

    python benchmarks/training.py [--models resnet50,vgg16,transformer] [--links 2gbit,shm]
                                  [--configs ...] [--runs 3] [--np 2]
                                  [--horovod-python <horovod-venv>/bin/python]
                                  [--plot training.png] [--timeline-png timeline.png]
    python benchmarks/training.py --markdown results.jsonl ...      # the README table

Every mlsl_tf job is `mlslrun -np N` (Horovod: its venv's `mpiexec -n N`) of this file in worker
mode, which does `import mlsl_tf.keras as hvd; hvd.init()` right after its imports, builds the
model on a fixed synthetic batch, compiles it with `hvd.DistributedOptimizer(SGD(momentum=0.9))`
and times `model.fit` after warm-up steps. An MWMS job is N processes of this file started
together, each with its TF_CONFIG (benchmarks/mwms.py). A link is `shm` (shared memory; MWMS on
127.0.0.1 ports) or a rate: then each rank runs on its own emulated host (benchmarks/hosts.py: a
network namespace per rank on a bridge, tbf on each host's link; MPICH over TCP, MWMS's gRPC
between the hosts' addresses). --models tiny is a small MLP for smoke tests.

Configurations (`--configs`, default all), each a separate job:
  fifo          MLSL_TF_PRIORITY=fifo, MLSL_TF_CROSS_ITERATION=0: Horovod's order, update in the step
  priority      MLSL_TF_CROSS_ITERATION=0: priority order, update in the step
  overlap       the defaults: priority + cross-iteration overlap
  overlap_bf16  the defaults with DistributedOptimizer(compression=hvd.Compression.bf16)
  overlap_elastic  the defaults under elastic mlslrun (-np N --min-np N -H localhost:N), the timed
                fit inside hvd.elastic.run with KerasState and the elastic callbacks, a commit every
                ELASTIC_BATCHES_PER_COMMIT batches (median step: between commits; mean: with them)
  overlap_mixed_bf16  the defaults under Keras' mixed_bfloat16 policy (bf16 compute, float32
                variables and gradients, reduced in float32)
  overlap_tf_keras  the defaults under tf_keras (TF_USE_LEGACY_KERAS=1): model.fit of Keras 2 with
                DistributedOptimizer over a tf_keras optimizer (no cross-iteration overlap there)
  horovod       Horovod 0.28.1 (--horovod-python; TF 2.15, tf.keras), same model and loop
  mwms          MWMS, Keras 3, the custom strategy.run loop of TensorFlow's multi-worker tutorial
  mwms_tf_keras MWMS, tf_keras model.fit (the global batch, split per worker by MWMS)
  compute       compute alone: the same training with a plain optimizer (no reduction)
  compute_tf_keras  compute alone under tf_keras (the limit of overlap_tf_keras and mwms_tf_keras)
  compute_mixed_bf16  compute alone under mixed_bfloat16 (the limit of overlap_mixed_bf16)
  horovod_compute  compute alone in Horovod's venv (TF 2.15, tf.keras, plain optimizer)
  mwms_compute  compute alone of the mwms loop: N single-worker strategies, no cluster
  comm          communication alone: the model's gradients (shapes, priorities, dtype) reduced
                by mlsl_tf each step with no compute; comm_bf16 the same in bf16
Autotune's (docs/autotune.md), only when named in --configs:
  overlap_autotune  the defaults with MLSL_TF_AUTOTUNE=1 (a warm-up sample, 5 steps per sample): the
                warm-up goes on until every rank froze the search, then the steps are timed; the
                job's row names the values it froze ("autotune"), the steps the search took
                ("autotune_steps") and the changes it applied ("autotune_changes")
  overlap_autotune_fixed  autotune on with both knobs set to the defaults (nothing tuned)
  grid_inflight<I>_spin<S>  the defaults with MLSL_TF_INFLIGHT=I and MLSL_TF_SPIN_US=S, for every
                candidate I in 1, 2, 4, 8, 16 and S in 0, 50, 200, 1000: the grid autotune searches
                (`--configs grid` names all 20)

CPU: every rank writes its CPU seconds per timed step by thread (/proc/self/task/*/stat; the
threads a library starts in hvd.init() are labelled 'comm:<name>': mlsl_tf_comm, Horovod's
background thread; MWMS's are its collective_ops and gRPC threads) and the machine's ksoftirqd
and softirq time (benchmarks/cpu_cost.py says what each captures). A job's row sums them over
its ranks: process_cpu_s_per_step, comm_cpu_s_per_step (communication threads), and
ksoftirqd_s_per_step / softirq_s_per_step (machine-wide, rank 0's reading).

Limits (limits() below has the exact definitions): limit_step_s = max(compute, comm) and
cpu_limit_step_s = max(link time, compute + communication CPU / cores), each from the jobs of
the same runs; efficiency and cpu_efficiency = limit / step. JSON lines: one per job, then one
per (model, link, config) with the medians over runs, limits and ratios to Horovod and MWMS's
better form, and the machine (CPU model, cores, AVX-512 or not, TF_ENABLE_ONEDNN_OPTS).
--markdown prints the README table from those lines; --plot draws the medians as bars;
--timeline-png draws rank 0's timeline of two consecutive steps of the first overlap job
(ResNet-50 at the first link): each gradient's start (backward produced it), its chunks on the
wire, and its take (the next forward pass reached its layer).
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cpu_cost  # noqa: E402

MODELS = ("resnet50", "vgg16", "transformer", "tiny")  # tiny: a small MLP for smoke tests
CONFIGS = ("compute", "compute_tf_keras", "comm", "comm_bf16", "fifo", "priority", "overlap", "overlap_bf16",
           "overlap_elastic", "overlap_mixed_bf16", "compute_mixed_bf16",
           "overlap_tf_keras", "horovod", "horovod_compute", "mwms", "mwms_tf_keras", "mwms_compute")
HOROVOD_CONFIGS = ("horovod", "horovod_compute")  # jobs run by Horovod's venv
MWMS_CONFIGS = ("mwms", "mwms_tf_keras", "mwms_compute")  # one process per worker, TF_CONFIG (mwms.py)
PLAIN_CONFIGS = ("compute", "compute_tf_keras", "horovod_compute", "compute_mixed_bf16", "compute_unbound",
                 "compute_unbound_pool1")  # compute alone, launched as the others
LEGACY_KERAS = {"TF_USE_LEGACY_KERAS": "1"}
CONFIG_ENV = {
    "fifo": {"MLSL_TF_PRIORITY": "fifo", "MLSL_TF_CROSS_ITERATION": "0"},
    "priority": {"MLSL_TF_CROSS_ITERATION": "0"},
    "overlap_tf_keras": LEGACY_KERAS,
    "compute_tf_keras": LEGACY_KERAS,
}
IMPL_OF = dict({c: "horovod" for c in HOROVOD_CONFIGS}, **{c: "mwms" for c in MWMS_CONFIGS})  # else mlsl_tf
# The comm-alone job that is the link limit of a configuration, and its compute-alone job: the
# same TensorFlow, Keras and training loop without the reduction (first one measured).
ELASTIC_BATCHES_PER_COMMIT = 10
LIMIT_OF = {"fifo": "comm", "priority": "comm", "overlap": "comm", "overlap_bf16": "comm_bf16",
            "overlap_elastic": "comm", "overlap_mixed_bf16": "comm",
            "overlap_tf_keras": "comm", "horovod": "comm", "mwms": "comm", "mwms_tf_keras": "comm"}
COMPUTE_OF = {"horovod": ("horovod_compute", "compute"), "mwms": ("mwms_compute", "compute"),
              "overlap_tf_keras": ("compute_tf_keras", "compute"), "mwms_tf_keras": ("compute_tf_keras", "compute"),
              "overlap_mixed_bf16": ("compute_mixed_bf16", "compute")}
# Autotune and the grid of its candidates (docs/autotune.md); not run unless named in --configs.
GRID = {f"grid_inflight{i}_spin{s}": {"MLSL_TF_INFLIGHT": str(i), "MLSL_TF_SPIN_US": str(s)}
        for i in (1, 2, 4, 8, 16) for s in (0, 50, 200, 1000)}
# A control for what an autotune job does besides tuning: overlap_autotune_fixed (autotune on,
# both knobs set to the defaults' values, so nothing is tuned: its schedulers' 16 slots, its
# step clock). To time every configuration after the search's warm-up, pass --warmup 100.
AUTOTUNE_CONFIGS = ("overlap_autotune", "overlap_autotune_fixed") + tuple(GRID)
CONFIG_ENV.update(GRID, overlap_autotune={"MLSL_TF_AUTOTUNE": "1", "MLSL_TF_AUTOTUNE_WARMUP_SAMPLES": "1",
                                          "MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE": "5"})
CONFIG_ENV["overlap_autotune_fixed"] = dict(CONFIG_ENV["overlap_autotune"], MLSL_TF_INFLIGHT="4", MLSL_TF_SPIN_US="200")
TUNING_CONFIGS = ("overlap_autotune", "overlap_autotune_fixed")  # warmed up until the search froze
LIMIT_OF.update({c: "comm" for c in AUTOTUNE_CONFIGS})
# Where the ranks' threads run (mlsl_tf/cpu_placement.py), only when named in --configs: the
# defaults and compute alone with MLSL_TF_BIND=none (threads left where the kernel puts them),
# and the same with TensorFlow's intra-op pool of one thread (a rank's share of 2 cores).
UNBOUND_CONFIGS = ("overlap_unbound", "compute_unbound", "overlap_unbound_pool1", "compute_unbound_pool1")
CONFIG_ENV.update({c: {"MLSL_TF_BIND": "none"} for c in UNBOUND_CONFIGS})
for _c in UNBOUND_CONFIGS[2:]:
    CONFIG_ENV[_c]["TF_NUM_INTRAOP_THREADS"] = "1"
LIMIT_OF.update(overlap_unbound="comm", overlap_unbound_pool1="comm")
COMPUTE_OF.update(overlap_unbound=("compute_unbound", "compute"),
                  overlap_unbound_pool1=("compute_unbound_pool1", "compute"))
MIXED_BF16_CONFIGS = ("overlap_mixed_bf16", "compute_mixed_bf16")  # Keras 3's mixed_bfloat16 policy
MWMS_PORT_BASE = 23400  # MWMS jobs on emulated hosts: a fresh port each (no TIME_WAIT reuse)
CORES = os.cpu_count() or 2  # the cores the ranks of a job share (all on this machine)
MACHINE = cpu_cost.machine()  # in every summary row: which machine the figures come from
LAUNCHER_ENV = ("PMI_", "PMIX_", "HYD", "MPI_LOCAL", "OMPI_")  # what a nested launcher must not inherit


# ---------------------------------------------------------------------------------------------
# The models (Keras 3 here, tf.keras 2.15 in Horovod's venv: only names both have).

def model_spec(name):
    """(batch per rank, warm-up steps, timed steps) of a model on this 2-core machine."""
    return {"resnet50": (16, 5, 15), "vgg16": (2, 2, 4), "transformer": (16, 5, 15), "tiny": (8, 2, 3)}[name]


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
    elif name == "tiny":  # 2 dense layers: seconds per job, for tests
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        x = rng.uniform(size=(batch, 32)).astype("float32")
        y = rng.integers(0, 10, size=(batch, 1))
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=name in ("transformer", "tiny"))
    return model, x, y, loss


# ---------------------------------------------------------------------------------------------
# Worker: one rank of one job.

def write_rank_file(ns, rank, result):
    """Each rank's own step time and CPU per step, read by the orchestrator (all ranks' CPU, not rank 0's)."""
    if ns.out_dir:
        keep = ("step_s", "cpu_s_per_step", "kernel_s_per_step", "weights_sum")
        with open(os.path.join(ns.out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(dict({k: result[k] for k in keep if k in result}, rank=rank), f)


def mwms_worker(ns):
    import mwms  # noqa: PLC0415 (creates the strategy first thing)
    result = mwms.run_worker(ns, build_model, model_spec)
    write_rank_file(ns, result["rank"], result)
    if result["rank"] == 0:
        print(json.dumps({"result": result}), flush=True)


def worker(ns):
    if ns.impl == "mwms":
        return mwms_worker(ns)
    import tensorflow as tf
    if ns.impl == "horovod":
        import horovod.tensorflow.keras as hvd
    else:
        import mlsl_tf.keras as hvd
    before = cpu_cost.thread_times()
    hvd.init()
    if hvd.size() != ns.np:  # e.g. Horovod linked to another MPI than its launcher's: singletons
        raise SystemExit(f"training.py: {ns.impl} sees {hvd.size()} rank(s), {ns.np} were launched: the "
                         "launcher's MPI is not the one the library was built with (--horovod-mpiexec)")
    labels = cpu_cost.label_new_threads(before, "comm:")  # the library's own threads (its communication)
    if ns.impl == "horovod":
        keras = tf.keras
        sgd = keras.optimizers.legacy.SGD
    elif os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # tf_keras: Keras 2 on our TensorFlow
        import tf_keras as keras
        sgd = keras.optimizers.SGD
    else:
        import keras
        sgd = keras.optimizers.SGD
    thread_cpu = lambda: cpu_cost.thread_cpu(labels)  # noqa: E731
    batch, warmup, steps = model_spec(ns.model)
    steps, warmup = ns.steps or steps, ns.warmup or warmup
    keras.utils.set_random_seed(1234)
    if ns.config in MIXED_BF16_CONFIGS:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model, x, y, loss = build_model(ns.model, keras, batch, seed=hvd.rank())
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    plain = ns.config in PLAIN_CONFIGS  # compute alone: no reduction
    if ns.config in ("comm", "comm_bf16"):
        result = comm_only(ns, hvd, tf, model, batch, warmup, steps, thread_cpu)
    else:
        opt = sgd(0.01, momentum=0.9)
        if not plain:
            compression = hvd.Compression.bf16 if ns.config == "overlap_bf16" else hvd.Compression.none
            opt = hvd.DistributedOptimizer(opt, compression=compression)
        model.compile(optimizer=opt, loss=loss)
        callbacks = [] if plain else [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0, callbacks=callbacks)
        tuning_steps = warm_up_until_tuned(model, data, warmup) if ns.config in TUNING_CONFIGS else 0
        ends = []
        clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
        timed_callbacks = [clock]
        if ns.config == "overlap_elastic":  # what an elastic Horovod script adds to its fit
            state = hvd.elastic.KerasState(model, opt, batch=0, epoch=0)
            timed_callbacks += [hvd.elastic.UpdateBatchStateCallback(state),
                                hvd.elastic.UpdateEpochStateCallback(state),
                                hvd.elastic.CommitStateCallback(state, batches_per_commit=ELASTIC_BATCHES_PER_COMMIT)]
        counters = counters_before = None

        def timed(*_):
            nonlocal counters, counters_before
            hvd.allreduce(tf.constant(0.0), name="training.barrier")
            cpu_kernel = thread_cpu(), cpu_cost.kernel_cpu()
            if ns.impl == "mlsl_tf":
                import mlsl_tf  # noqa: PLC0415 (the Horovod job has no mlsl_tf)
                counters = mlsl_tf.stats
                counters_before = counters()
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=timed_callbacks)
            return start, cpu_kernel

        # elastic: the state's first sync (a broadcast of the model) comes before the timed steps
        start, (cpu_before, kernel_before) = hvd.elastic.run(timed)(state) if ns.config == "overlap_elastic" \
            else timed()
        times = [b - a for a, b in zip([start] + ends[:-1], ends)]
        result = {"step_s": statistics.median(times[1:]), "mean_step_s": (ends[-1] - start) / steps,
                  "step_times_s": [round(t, 4) for t in times],  # rank 0's, in order: a trend shows
                  "cpu_s_per_step": cpu_cost.per_step(thread_cpu(), cpu_before, steps),
                  "kernel_s_per_step": cpu_cost.per_step(cpu_cost.kernel_cpu(), kernel_before, steps)}
        if ns.impl == "mlsl_tf":  # results still parked: the last step's updates were deferred
            from mlsl_tf import _library
            result["deferred_at_end"] = _library.c_api().mlsl_tf_parked()
            # the runtime's counters per timed step: collectives, those that rode in the control
            # message, chunks started, tensors packed into fused buffers, allreduces into their input
            after = counters()
            result["per_step"] = {k: (after[k] - counters_before[k]) / steps
                                  for k in ("requests", "eager", "chunks", "fused_tensors", "in_place")}
            if ns.config in TUNING_CONFIGS:
                result["autotune"] = after["autotune"]["values"]
                # the steps the search took: the warm-up fit, then fits until every rank froze
                result["autotune_steps"] = warmup + tuning_steps
                result["autotune_changes"] = len(after["autotune"]["applied"])
    step = max(hvd.allgather(tf.constant([result["step_s"]], tf.float64)).numpy())  # the slowest rank
    result.update(model=ns.model, config=ns.config, impl=ns.impl, ranks=hvd.size(), batch_per_rank=batch,
                  steps=steps, step_s=float(step), samples_per_s=batch * hvd.size() / float(step),
                  parameters=int(sum(int(tf.size(v)) for v in model.trainable_variables)))
    write_rank_file(ns, hvd.rank(), result)
    if hvd.rank() == 0:
        print(json.dumps({"result": result}), flush=True)


def warm_up_until_tuned(model, data, steps):
    """More warm-up fits of `steps` steps until every rank's autotune froze its values (ranks see it
    at different times: they agree, by a Min over the ranks, after each fit, so they fit alike).
    Returns the steps fitted here."""
    import mlsl_tf
    import tensorflow as tf
    fitted = 0
    while True:
        frozen = float(mlsl_tf.stats()["autotune"]["frozen"])
        if mlsl_tf.allreduce(tf.constant(frozen), op=mlsl_tf.Min, name="training.autotune_frozen").numpy() == 1:
            return fitted
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
        fitted += steps


def comm_only(ns, hvd, tf, model, batch, warmup, steps, thread_cpu):
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
    cpu_before, kernel_before = thread_cpu(), cpu_cost.kernel_cpu()
    for k in range(steps):
        start = time.perf_counter()
        float(step(tf.constant(float(k))))
        times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times), "mean_step_s": sum(times) / len(times),
            "cpu_s_per_step": cpu_cost.per_step(thread_cpu(), cpu_before, steps),
            "kernel_s_per_step": cpu_cost.per_step(cpu_cost.kernel_cpu(), kernel_before, steps)}


# ---------------------------------------------------------------------------------------------
# Orchestrator: the jobs, interleaved, under each link.

def clean_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_ENV) and not k.startswith("MLSL_TF_")}
    env.update(extra)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def job_argv(ns, model, config, enter, timeline=None, out_dir=None, launcher_interface=None):
    """(argv, env) of one job run by a launcher (mlslrun, or Horovod's mpiexec)."""
    worker_args = ["--worker", "--model", model, "--config", config] + (["--steps", str(ns.steps)] if ns.steps else []) + \
        (["--warmup", str(ns.warmup)] if getattr(ns, "warmup", None) else []) + \
        (["--out-dir", out_dir] if out_dir else []) + ["--np", str(ns.np)]  # the worker checks the ranks it sees
    if config in HOROVOD_CONFIGS:
        python = ns.horovod_python
        mpiexec = getattr(ns, "horovod_mpiexec", None) or os.path.join(os.path.dirname(python), "mpiexec")
        flags, extra, launcher_host = [], {}, []
        if is_open_mpi(mpiexec):  # Horovod built against Open MPI: its mpirun, over TCP between hosts
            flags = (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["--oversubscribe", "--bind-to", "none"]
            if enter:  # PMIx's server listens on TCP: mpirun on host 0, reachable from the others on eth0
                extra = dict(OPEN_MPI_TCP_ENV)
                launcher_host = ["ip", "netns", "exec", enter[enter.index("--prefix") + 1] + "0"]
        argv = launcher_host + [mpiexec, "-n", str(ns.np)] + flags + enter + [python, os.path.abspath(__file__)] + \
            worker_args + ["--impl", "horovod"]
        return argv, clean_env(extra)
    python = ns.python
    elastic = []
    if config == "overlap_elastic":  # its workers connect back to mlslrun: from emulated hosts over the bridge
        elastic = ["--min-np", str(ns.np), "-H", f"localhost:{ns.np}"] + \
            (["--network-interface", launcher_interface] if launcher_interface else [])
    argv = [python, "-m", "mlsl_tf.runner", "-np", str(ns.np), "--no-tag-output"] + elastic + enter + \
        [python, os.path.abspath(__file__)] + worker_args
    env = clean_env(CONFIG_ENV.get(config, {}))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if timeline:
        env["MLSL_TF_TIMELINE"] = timeline
    return argv, env


OPEN_MPI_TCP_ENV = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "eth0",
                    "OMPI_MCA_oob_tcp_if_include": "eth0", "PMIX_MCA_ptl_tcp_if_include": "eth0",
                    "PMIX_MCA_ptl_tcp_remote_connections": "1"}


@functools.lru_cache(maxsize=None)
def is_open_mpi(mpiexec):
    """Whether `mpiexec` is Open MPI's (Horovod may be built against it rather than MPICH)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr


def mwms_procs(ns, model, config, hosts_ctx=None, port=None, out_dir=None):
    """[(argv, env)] of an MWMS job's worker processes, started together (no launcher: TF_CONFIG)."""
    import mwms
    worker_argv = [ns.python, os.path.abspath(__file__), "--worker", "--model", model, "--config", config,
                   "--impl", "mwms"] + (["--steps", str(ns.steps)] if ns.steps else []) + \
                   (["--warmup", str(ns.warmup)] if getattr(ns, "warmup", None) else []) + \
        (["--out-dir", out_dir] if out_dir else [])
    if hosts_ctx:
        import hosts
        addresses = mwms.worker_addresses(ns.np, [hosts.address(i) for i in range(ns.np)], port or mwms.MWMS_PORT)
        namespaces = [hosts.host_namespace(hosts_ctx.prefix, i) for i in range(ns.np)]
    else:
        addresses, namespaces = mwms.worker_addresses(ns.np), None
    return [(argv, clean_env(extra)) for argv, extra in mwms.job_commands(ns.np, worker_argv, addresses, namespaces,
                                                                           config)]


def run_job(procs, timeout, out_dir=None):
    """Runs a job's processes together (one for a launcher, one per worker for MWMS); its result
    row: rank 0's result line, with every rank's CPU from its rank file."""
    start = time.perf_counter()
    running = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for argv, env in procs]
    outputs, error = [], None
    deadline = time.monotonic() + timeout
    for p in running:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout} s"
            for q in running:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
        outputs.append((p.returncode, out, err))
        if p.returncode != 0 and error is None:  # one worker failed: the others would wait forever
            error = f"exit {p.returncode}: " + " | ".join(
                [line for line in (err + out).strip().splitlines() if line.strip()][-3:])
            for q in running:
                if q.poll() is None:
                    q.kill()
    rows = [json.loads(line)["result"] for _, out, _ in outputs for line in out.splitlines()
            if line.startswith('{"result"')]
    if error or not rows:
        return {"error": error or "no result line: " + " | ".join(outputs[0][2].strip().splitlines()[-3:])}
    row = rows[-1]
    row["wall_s"] = round(time.perf_counter() - start, 1)
    if out_dir:
        merge_rank_files(row, out_dir)
    return row


def merge_rank_files(row, out_dir):
    """Adds the ranks' own figures to rank 0's row: the slowest rank's step (MWMS's workers do not
    agree on one), each rank's CPU per step by thread, and their sums over the ranks."""
    ranks = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(out_dir, name)) as f:
                ranks.append(json.load(f))
    if not ranks:
        return row
    ranks.sort(key=lambda r: r["rank"])
    if row.get("impl") == "mwms":  # mwms_compute's workers are single-worker strategies: count them here
        row["ranks"] = len(ranks)
        row["step_s"] = max(r["step_s"] for r in ranks)
        row["samples_per_s"] = row["batch_per_rank"] * row["ranks"] / row["step_s"]
    row["cpu_s_per_step_ranks"] = [r.get("cpu_s_per_step", {}) for r in ranks]
    if all("weights_sum" in r for r in ranks):
        row["weights_sum_ranks"] = [r["weights_sum"] for r in ranks]
    row.update(cpu_totals(row.get("impl", "mlsl_tf"), row["cpu_s_per_step_ranks"], ranks[0].get("kernel_s_per_step", {})))
    return row


def cpu_totals(impl, ranks_cpu, kernel):
    """CPU seconds per step summed over the ranks (they all share this machine's cores): of every
    thread, of the library's communication threads (cpu_cost.COMM_PREFIXES), and the kernel's
    softirq threads (ksoftirqd, machine-wide) that add to them."""
    return {"process_cpu_s_per_step": round(sum(sum(c.values()) for c in ranks_cpu), 4),
            "comm_cpu_s_per_step": round(sum(cpu_cost.comm_cpu(impl, c) for c in ranks_cpu), 4),
            "ksoftirqd_s_per_step": kernel.get("ksoftirqd_s", 0.0),
            "softirq_s_per_step": kernel.get("softirq_s", 0.0)}


def links_context(link, np_, launcher=False):
    if link == "shm":
        return contextlib.nullcontext(None)
    import hosts
    return hosts.Hosts(np_, link, launcher=launcher)


def orchestrate(ns):
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds the with blocks: namespaces deleted
    configs = [c for c in ns.configs if c not in HOROVOD_CONFIGS or ns.horovod_python]
    for c in ns.configs:
        if c in HOROVOD_CONFIGS and not ns.horovod_python:
            print(json.dumps({"config": c, "skipped": True,
                              "reason": "no --horovod-python given (a venv with Horovod 0.28.1, benchmarks/README.md)"}), flush=True)
    with cpu_hogs(ns.cpu_hog):
        results = run_all(ns, configs)
    summaries = summarize(results, ns)
    if ns.plot:
        plot(summaries, ns.plot)
    return 0


@contextlib.contextmanager
def cpu_hogs(n):
    """`n` busy processes, each pinned to one of the last `n` CPUs, for the block: a machine whose
    cores are shared with another tenant (issue #43's slower machine)."""
    cpus = sorted(os.sched_getaffinity(0))[-n:] if n else []
    hogs = []
    try:
        for cpu in cpus:
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                         preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu})))
        yield cpus
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def run_all(ns, configs):
    """Every (run, model, link, config) job, interleaved; {(model, link, config): [job rows]}."""
    results = {}  # (model, link, config) -> [rows]
    jobs_started = 0
    timeline_path = None
    if ns.timeline_png:
        timeline_path = os.path.join(tempfile.mkdtemp(prefix="mlsl-training-"), "timeline.json")
    for run in range(ns.runs):
        for model in ns.models:
            for link in ns.links:
                with links_context(link, ns.np, launcher="overlap_elastic" in configs) as h:
                    enter = h.enter(ns.python) if h else []
                    order = configs if run % 2 == 0 else list(reversed(configs))
                    for config in order:
                        tl = None
                        if timeline_path and run == 0 and model == ns.models[0] and link == ns.links[0] \
                                and config == "overlap":
                            tl = timeline_path
                        out_dir = tempfile.mkdtemp(prefix="mlsl-training-ranks-")
                        if config in MWMS_CONFIGS:
                            jobs_started += 1
                            procs = mwms_procs(ns, model, config, h, MWMS_PORT_BASE + jobs_started % 500, out_dir)
                        else:
                            argv, env = job_argv(ns, model, config, enter if config not in HOROVOD_CONFIGS or not h
                                                 else h.enter(ns.horovod_python), tl, out_dir,
                                                 h.launcher_interface if h and h.launcher else None)
                            if h:
                                env.update(h.env({}))
                            procs = [(argv, env)]
                        row = run_job(procs, ns.timeout, out_dir)
                        shutil.rmtree(out_dir, ignore_errors=True)
                        row.update(model=model, link=link, config=config, run=run, cpu_hog=ns.cpu_hog)
                        print(json.dumps({"job": row}), flush=True)
                        results.setdefault((model, link, config), []).append(row)
    if ns.timeline_png and timeline_path and os.path.exists(timeline_path):
        draw_timeline(timeline_path, ns.timeline_png)
    return results


MEDIAN_FIELDS = ("step_s", "samples_per_s", "process_cpu_s_per_step", "comm_cpu_s_per_step", "ksoftirqd_s_per_step",
                 "softirq_s_per_step")


def summarize(results, ns, quiet=False):
    medians = {}
    for (model, link, config), rows in results.items():
        ok = [r for r in rows if "error" not in r]
        row = {"model": model, "link": link, "config": config, "runs": len(ok), "cpu_hog": getattr(ns, "cpu_hog", 0),
               "errors": [r["error"] for r in rows if "error" in r], "machine": MACHINE}
        if ok:
            for field in MEDIAN_FIELDS:
                if all(field in r for r in ok):
                    row[field] = statistics.median(r[field] for r in ok)
            row["samples_per_s_runs"] = [round(r["samples_per_s"], 2) for r in ok]
            row["samples_per_step"] = ok[0]["samples_per_s"] * ok[0]["step_s"]
        medians[(model, link, config)] = row
    summaries = []
    for (model, link, config), row in sorted(medians.items()):
        row.update(limits(medians, model, link, config))
        hvd = medians.get((model, link, "horovod"))
        if "samples_per_s" in row and hvd and "samples_per_s" in hvd and config not in HOROVOD_CONFIGS:
            row["over_horovod"] = row["samples_per_s"] / hvd["samples_per_s"]
        best = best_mwms(medians, model, link)
        if "samples_per_s" in row and best and config not in MWMS_CONFIGS:
            row["over_best_mwms"] = row["samples_per_s"] / best["samples_per_s"]
            row["best_mwms"] = best["config"]
        if not quiet:
            print(json.dumps({"median": row}), flush=True)
        summaries.append(row)
    return summaries


def best_mwms(medians, model, link):
    """MWMS's better form (mwms or mwms_tf_keras) by median samples/s, or None."""
    rows = [medians.get((model, link, c)) for c in ("mwms", "mwms_tf_keras")]
    rows = [r for r in rows if r and "samples_per_s" in r]
    return max(rows, key=lambda r: r["samples_per_s"]) if rows else None


def limits(medians, model, link, config):
    """The two limits of a configuration's step, from medians of jobs of the same runs:

      link_s     its comm-alone job's step (LIMIT_OF: the model's gradients reduced by mlsl_tf with
                 no compute, comm_bf16 for bf16): what the link allows
      compute_s  its compute-alone job's step (COMPUTE_OF: the same TensorFlow, Keras and loop
                 without the reduction, its ranks sharing the machine's cores as in training)
      comm_cpu_s CPU seconds per step of its communication: the library's communication threads
                 (cpu_cost.COMM_PREFIXES) summed over its ranks -- all on this machine -- plus the
                 kernel's ksoftirqd threads over the same steps (median over runs)
      limit_step_s      = max(compute_s, link_s): the limit of a machine with spare cores
      cpu_limit_step_s  = max(link_s, compute_s + comm_cpu_s / CORES): the limit of this machine,
                 whose CORES cores are all busy computing, so the communication's CPU time is
                 taken from compute (spread over the cores)
    efficiency = limit_step_s / step_s and cpu_efficiency = cpu_limit_step_s / step_s; the
    limits' samples/s = the job's samples per step / the limit step. Rows without the
    needed jobs get none."""
    row = medians[(model, link, config)]
    link_row = medians.get((model, link, LIMIT_OF.get(config, "")))
    compute = next((medians[(model, link, c)] for c in COMPUTE_OF.get(config, ("compute",))
                    if "step_s" in medians.get((model, link, c), {})), None)
    if "step_s" not in row or not link_row or "step_s" not in link_row or not compute:
        return {}
    out = {"link_s": link_row["step_s"], "compute_s": compute["step_s"], "compute_config": compute["config"],
           "limit_step_s": max(compute["step_s"], link_row["step_s"])}
    out["efficiency"] = out["limit_step_s"] / row["step_s"]
    if "comm_cpu_s_per_step" in row:
        out["comm_cpu_s"] = row["comm_cpu_s_per_step"] + row.get("ksoftirqd_s_per_step", 0.0)
        out["cpu_limit_step_s"] = cpu_bound_limit(out["link_s"], out["compute_s"], out["comm_cpu_s"], CORES)
        out["cpu_efficiency"] = out["cpu_limit_step_s"] / row["step_s"]
        if "process_cpu_s_per_step" in row and "process_cpu_s_per_step" in compute:
            # all the CPU distributing adds, wherever it ran (TensorFlow's threads included)
            out["added_cpu_s"] = row["process_cpu_s_per_step"] - compute["process_cpu_s_per_step"]
    if "samples_per_step" in row:
        out["limit_samples_per_s"] = row["samples_per_step"] / out["limit_step_s"]
        if "cpu_limit_step_s" in out:
            out["cpu_limit_samples_per_s"] = row["samples_per_step"] / out["cpu_limit_step_s"]
    return out


def cpu_bound_limit(link_s, compute_s, comm_cpu_s, cores):
    """max(link time, compute + the communication's CPU spread over the cores)."""
    return max(link_s, compute_s + comm_cpu_s / cores)


def plot(summaries, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["model"], r["link"]) for r in summaries})
    order = [c for c in CONFIGS + AUTOTUNE_CONFIGS + UNBOUND_CONFIGS if any(r["config"] == c for r in summaries)]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), squeeze=False)
    for ax, (model, link) in zip(axes[0], groups):
        rows = {r["config"]: r for r in summaries if r["model"] == model and r["link"] == link}
        names = [c for c in order if c in rows and "samples_per_s" in rows[c] and not c.startswith("comm")]
        values = [rows[c]["samples_per_s"] for c in names]
        colours = ["#999999" if c.startswith("compute") else "#e8a0a0" if c == "horovod_compute" else "#d62728"
                   if c == "horovod" else "#b0d8b0" if c == "mwms_compute" else "#2ca02c" if c in MWMS_CONFIGS
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


TABLE_CONFIGS = (("overlap", "mlsl_tf"), ("overlap_bf16", "mlsl_tf bf16"), ("overlap_tf_keras", "mlsl_tf tf_keras"),
                 ("horovod", "Horovod 0.28.1"), ("mwms", "MWMS Keras 3 loop"), ("mwms_tf_keras", "MWMS tf_keras fit"))
CPU_CONFIGS = (("overlap", "mlsl_tf"), ("horovod", "Horovod"), ("mwms", "MWMS"), ("mwms_tf_keras", "MWMS tf_keras"))


def markdown(paths):
    """The README table from the job lines of result files, summarized together (or, in files
    without job lines, their median lines): one row per (model, link);
    samples/s (median of runs) of each library, mlsl_tf defaults' ratios to MWMS's better form and
    to Horovod, the two limits of mlsl_tf defaults (samples/s, and its efficiency against each),
    and the CPU seconds per step of each library's communication (summed over the ranks)."""
    rows, jobs = [], {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith('{"median"'):
                    rows.append(json.loads(line)["median"])
                elif line.startswith('{"job"'):
                    job = json.loads(line)["job"]
                    jobs.setdefault((job["model"], job["link"], job["config"]), []).append(job)
    if jobs:  # the jobs of all the files together (runs made apart, e.g. Horovod's added later)
        rows = summarize(jobs, None, quiet=True)
    get = {(r["model"], r["link"], r["config"]): r for r in rows}
    head = ["model", "link"] + [name for _, name in TABLE_CONFIGS] + \
        ["mlsl_tf / best MWMS", "mlsl_tf / Horovod", "limit max(compute, comm)", "limit CPU-bound",
         "comm CPU s/step: " + " / ".join(name for _, name in CPU_CONFIGS)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    link_order = lambda link: (link != "shm", _rate_bits(link))  # noqa: E731
    ours_rate = lambda model, link: get.get((model, link, "overlap"), {}).get("samples_per_s", 99)  # noqa: E731
    for model, link in sorted({(r["model"], r["link"]) for r in rows},
                              key=lambda ml: (MODELS.index(ml[0]) if ml[0] in MODELS else 99, link_order(ml[1]))):
        cell = lambda c, key, fmt: fmt.format(get[(model, link, c)][key]) \
            if key in get.get((model, link, c), {}) else "-"  # noqa: E731
        rate = "{:.2f}" if ours_rate(model, link) < 10 else "{:.1f}"  # VGG-16 runs at ~1 sample/s here
        cells = [model, link] + [cell(c, "samples_per_s", rate) for c, _ in TABLE_CONFIGS]
        ours = get.get((model, link, "overlap"), {})
        best = ours.get("best_mwms")
        cells.append(f"{ours['over_best_mwms']:.2f}x ({best})" if "over_best_mwms" in ours else "-")
        cells.append(cell("overlap", "over_horovod", "{:.2f}x"))
        for key, eff in (("limit_samples_per_s", "efficiency"), ("cpu_limit_samples_per_s", "cpu_efficiency")):
            cells.append((rate + " ({:.0%})").format(ours[key], ours[eff]) if key in ours else "-")
        cells.append(" / ".join(cell(c, "comm_cpu_s", "{:.2f}") for c, _ in CPU_CONFIGS))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _rate_bits(link):
    """Bits per second of a tbf rate like 2gbit, 500mbit (0 for anything else)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if link.endswith(unit):
            try:
                return float(link[:-len(unit)]) * scale
            except ValueError:
                return 0.0
    return 0.0


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--models", type=split, default=list(MODELS))
    p.add_argument("--links", type=split, default=["2gbit"], help="shm or tbf rates, e.g. 1gbit,2gbit,10gbit,shm")
    p.add_argument("--configs", type=split, default=list(CONFIGS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, help="timed steps per job (default: per model)")
    p.add_argument("--warmup", type=int, help="warm-up steps before the timed ones (default: per model; an "
                   "autotune job fits more until its search froze)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per job")
    p.add_argument("--python", default=sys.executable, help="interpreter with mlsl_tf (default: this one)")
    p.add_argument("--horovod-python", help="interpreter of a venv with Horovod 0.28.1 (mpiexec next to it)")
    p.add_argument("--horovod-mpiexec", help="the launcher of the MPI Horovod was built with (default: the mpiexec "
                   "next to --horovod-python; Open MPI's mpirun is detected and run over TCP between hosts)")
    p.add_argument("--cpu-hog", type=int, default=0, metavar="N",
                   help="run every job beside N busy processes pinned to the last N CPUs (a shared, slower machine)")
    p.add_argument("--plot", help="PNG bar chart of the medians")
    p.add_argument("--timeline-png", help="PNG of two consecutive steps of the first overlap job (rank 0)")
    p.add_argument("--markdown", nargs="+", metavar="JSONL", help="print a markdown table of these result files and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="mlsl_tf", help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)  # where each rank writes its own figures
    ns = p.parse_args(argv)
    ns.configs = [x for c in ns.configs for x in (list(GRID) if c == "grid" else [c])]  # "grid": all its points
    if not ns.worker:
        bad = [m for m in ns.models if m not in MODELS] + [c for c in ns.configs if c not in CONFIGS + AUTOTUNE_CONFIGS + UNBOUND_CONFIGS]
        if bad:
            p.error(f"unknown model/config: {', '.join(bad)}")
        if ns.runs < 1 or ns.np < 2:
            p.error("--runs >= 1 and --np >= 2")
        if not 0 <= ns.cpu_hog < len(os.sched_getaffinity(0)):
            p.error("--cpu-hog N: 0 <= N < the CPUs this process may use")
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
