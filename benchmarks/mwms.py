"""TensorFlow's MultiWorkerMirroredStrategy in benchmarks/training.py, run as its users run it: one
process per worker, each told the cluster by TF_CONFIG, the strategy created before any other
TensorFlow op, CPU collectives over gRPC (CommunicationImplementation.RING).

Two forms, both with TensorFlow 2.21 here:
  mwms           Keras 3 with the custom training loop of TensorFlow's multi-worker tutorial
                 (strategy.run of a step under tf.function, loss averaged over the global batch,
                 optimizer.apply_gradients all-reducing the gradients); model.fit under MWMS with
                 Keras 3 fails on more than one worker (keras-team/keras#20585)
  mwms_tf_keras  tf_keras (TF_USE_LEGACY_KERAS=1) model.fit: the dataset holds the global batch
                 and MWMS splits it per worker (auto-shard OFF: every worker reads the same
                 synthetic dataset)
  mwms_compute   compute alone of the `mwms` loop: the same processes with no TF_CONFIG, each a
                 single-worker strategy (no cluster, nothing sent)
Each worker writes its own result file (step time, CPU per thread); worker 0 also prints the
result line. The functions here that take no TensorFlow object are pure (tested without TF).
"""

import json
import os
import socket
import statistics
import time

MWMS_CONFIGS = ("mwms", "mwms_tf_keras", "mwms_compute")
MWMS_PORT = 23400  # on emulated hosts every worker has its own address: one port per job


def tf_config(addresses, index):
    """The TF_CONFIG of worker `index` of a cluster of workers at `addresses` ('host:port')."""
    if not 0 <= index < len(addresses):
        raise ValueError(f"worker index {index} out of range for {len(addresses)} workers")
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def free_local_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (shared memory: all workers on one address)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def worker_addresses(n, host_addresses=None, port=MWMS_PORT, local_ports=None):
    """'host:port' of each worker: on emulated hosts worker i at host i's address, all on `port`;
    on shared memory 127.0.0.1 with local_ports (default: free ones)."""
    if host_addresses is not None:
        return [f"{a}:{port}" for a in host_addresses[:n]]
    return [f"127.0.0.1:{p}" for p in (local_ports or free_local_ports(n))]


def job_commands(n, worker_argv, addresses, namespaces=None, config="mwms"):
    """[(argv, extra env)] of the n worker processes: each with its TF_CONFIG (none for
    mwms_compute), under `ip netns exec <its host's namespace>` when namespaces are given."""
    out = []
    for i in range(n):
        env = {"MWMS_WORKER_INDEX": str(i)}
        if config != "mwms_compute":
            env["TF_CONFIG"] = tf_config(addresses, i)
        if config == "mwms_tf_keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        enter = ["ip", "netns", "exec", namespaces[i]] if namespaces else []
        out.append((enter + list(worker_argv), env))
    return out


# ---------------------------------------------------------------------------------------------
# The worker (TensorFlow from here on).

def make_strategy():
    """The strategy, before any other TensorFlow op: RING (gRPC) collectives on CPU."""
    import tensorflow as tf
    impl = tf.distribute.experimental.CommunicationImplementation.RING
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl)
    return tf, tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def barrier(tf, strategy):
    """A collective across the workers (an all-reduce of one number): every worker waits for all."""
    one = strategy.run(lambda: tf.constant(1.0))
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, one, axis=None))


def run_worker(ns, build_model, model_spec):
    """One MWMS worker: times `steps` training steps after warm-up; returns its result dict."""
    tf, strategy = make_strategy()
    index = int(os.environ.get("MWMS_WORKER_INDEX", "0"))
    workers = strategy.num_replicas_in_sync
    batch, warmup, steps = model_spec(ns.model)
    steps, warmup = ns.steps or steps, getattr(ns, "warmup", None) or warmup
    if ns.config == "mwms_tf_keras":
        import tf_keras as keras
        timed = _fit_tf_keras(tf, strategy, keras, ns, build_model, batch, workers, index)
    else:
        import keras
        timed = _custom_loop(tf, strategy, keras, ns, build_model, batch, workers, index)
    times, cpu, kernel, parameters, weights_sum = timed(warmup, steps)
    result = {"step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
              "mean_step_s": sum(times) / len(times), "cpu_s_per_step": cpu, "kernel_s_per_step": kernel,
              "model": ns.model, "config": ns.config, "impl": "mwms", "ranks": workers, "rank": index,
              "batch_per_rank": batch, "steps": steps, "parameters": parameters,
              "weights_sum": weights_sum}  # equal on every worker when the gradients were all-reduced
    return result


def _custom_loop(tf, strategy, keras, ns, build_model, batch, workers, index):
    """The tutorial's loop: a distributed dataset of per-replica batches, strategy.run of a step
    that averages the loss over the global batch, under one tf.function (traced once)."""
    global_batch = batch * workers
    with strategy.scope():
        keras.utils.set_random_seed(1234)
        model, x, y, _ = build_model(ns.model, keras, batch, seed=index)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=ns.model in ("transformer", "tiny"),
                                                             reduction=None)

    def dataset_fn(context):  # every worker its own fixed batch, as the other configurations
        return tf.data.Dataset.from_tensors((x, y)).repeat()

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            xb, yb = inputs
            with tf.GradientTape() as tape:
                per_example = loss_fn(yb, model(xb, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def run_steps(n):
        ends = []
        for _ in range(n):
            float(train_step(iterator))
            ends.append(time.perf_counter())
        return ends

    def timed(warmup, steps):
        run_steps(warmup)
        return _measure(tf, strategy, model, steps, lambda: run_steps(steps))
    return timed


def _fit_tf_keras(tf, strategy, keras, ns, build_model, batch, workers, index):
    """tf_keras model.fit under the strategy: the global batch in a dataset MWMS splits per worker."""
    import numpy as np

    global_batch = batch * workers
    with strategy.scope():
        keras.utils.set_random_seed(1234)
        model, x, y, loss = build_model(ns.model, keras, global_batch, seed=0)
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=loss)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensors((x, np.asarray(y))).repeat().with_options(options)

    def timed(warmup, steps):
        model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
        ends = []
        clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: ends.append(time.perf_counter()))

        def fit():
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
            return ends
        return _measure(tf, strategy, model, steps, fit)
    return timed


def _measure(tf, strategy, model, steps, run):
    """After a barrier, times `run()` (which runs `steps` steps and returns their end times):
    the per-step times, CPU per step by thread, the kernel's CPU per step, the parameter count
    and the weights' sum (to compare workers)."""
    import cpu_cost
    barrier(tf, strategy)
    cpu_before, kernel_before = cpu_cost.thread_cpu(), cpu_cost.kernel_cpu()
    start = time.perf_counter()
    ends = run()
    cpu = cpu_cost.per_step(cpu_cost.thread_cpu(), cpu_before, steps)
    kernel = cpu_cost.per_step(cpu_cost.kernel_cpu(), kernel_before, steps)
    times = [b - a for a, b in zip([start] + ends[:-1], ends)]
    return times, cpu, kernel, int(sum(int(tf.size(v)) for v in model.trainable_variables)), \
        float(sum(float(tf.reduce_sum(tf.cast(v, tf.float64))) for v in model.trainable_variables))
