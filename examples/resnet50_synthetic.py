"""Synthetic-data ResNet-50 training throughput with mlsl_tf: the counterpart of Horovod's
tensorflow2_synthetic_benchmark.py, on TensorFlow 2.21 and Keras 3.

    mpiexec -n 2 python examples/resnet50_synthetic.py                  # DistributedGradientTape loop
    mpiexec -n 2 python examples/resnet50_synthetic.py --use-fit        # DistributedOptimizer + model.fit
    mpiexec -n 2 python examples/resnet50_synthetic.py --image-size 224 --batch-size 32

Every rank trains keras.applications.ResNet50(weights=None) on one fixed batch of random images
and labels, so only compute and gradient reduction are measured. After --num-warmup-batches
steps, --num-iters iterations of --num-batches-per-iter steps are timed; rank 0 prints each
iteration's images/sec, their mean +- 1.96 std (as Horovod's script does), and the total over all
ranks (each iteration's rates summed across ranks, not rank 0's times size). --json adds one
machine-readable line at the end (benchmarks/keras_resnet50.py reads it).

--framework horovod runs the same steps with Horovod (an environment where it is importable,
TensorFlow <= 2.15) so the two can be compared by one script. The default image size is 64
because the development machine has two CPU cores; 224 is ResNet-50's usual size.
"""

import argparse
import json
import os
import time

import numpy as np


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ResNet50", help="a keras.applications model (default ResNet50)")
    p.add_argument("--image-size", type=int, default=64, help="image height and width (>= 32; 224 is standard)")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps first")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timed iteration")
    p.add_argument("--num-iters", type=int, default=10, help="timed iterations")
    p.add_argument("--use-fit", action="store_true", help="model.fit with DistributedOptimizer instead of a "
                   "tf.function loop with DistributedGradientTape")
    p.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16 around each allreduce")
    p.add_argument("--intra-op-threads", type=int, default=-1,
                   help="TensorFlow intra-op threads per rank (default: CPU cores / ranks on this node; 0: TF's default)")
    p.add_argument("--framework", choices=["mlsl_tf", "horovod"], default="mlsl_tf")
    p.add_argument("--json", action="store_true", help="rank 0 prints a JSON line with the results at the end")
    ns = p.parse_args(argv)
    for name in ("batch_size", "num_classes", "num_batches_per_iter", "num_iters"):
        if getattr(ns, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if ns.num_warmup_batches < 0:
        p.error("--num-warmup-batches must be >= 0")
    if ns.image_size < 32:
        p.error("--image-size must be >= 32 (ResNet-50's five stride-2 stages)")
    return ns


def import_framework(name):
    """(hvd, hvd_keras): the module with the collectives and tape, the one with the Keras
    DistributedOptimizer and callbacks (the same module for mlsl_tf)."""
    if name == "horovod":
        import horovod.tensorflow as hvd
        import horovod.tensorflow.keras as hvd_keras
        return hvd, hvd_keras
    import mlsl_tf.keras as hvd
    return hvd, hvd


def optimizer_variables(opt):
    v = opt.variables  # a property in Keras 3 and tf.keras >= 2.11, a method before
    return list(v() if callable(v) else v)


def build(ns, hvd, hvd_keras, keras, tf):
    """Builds the model and data; returns `timed(iters, steps)`, which trains `iters` iterations
    of `steps` steps each and returns each iteration's seconds."""
    model = getattr(keras.applications, ns.model)(weights=None, input_shape=(ns.image_size, ns.image_size, 3),
                                                 classes=ns.num_classes)
    rng = np.random.default_rng(hvd.rank())
    images = tf.constant(rng.uniform(size=(ns.batch_size, ns.image_size, ns.image_size, 3)).astype("float32"))
    labels = tf.constant(rng.integers(0, ns.num_classes, size=(ns.batch_size, 1)))
    compression = hvd.Compression.fp16 if ns.fp16_allreduce else hvd.Compression.none
    opt = keras.optimizers.SGD(0.01)

    if ns.use_fit:
        model.compile(optimizer=hvd_keras.DistributedOptimizer(opt, compression=compression),
                      loss="sparse_categorical_crossentropy", jit_compile=False)
        data = tf.data.Dataset.from_tensors((images, labels)).repeat()
        # The first fit broadcasts rank 0's weights and optimizer state and traces the step.
        model.fit(data, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False,
                  callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])

        def timed(iters, steps):
            """One fit of `iters` epochs of `steps` steps; each epoch is an iteration."""
            if iters * steps == 0:
                return []
            times = []
            clock = keras.callbacks.LambdaCallback(
                on_epoch_begin=lambda epoch, logs: times.append(time.perf_counter()),
                on_epoch_end=lambda epoch, logs: times.__setitem__(-1, time.perf_counter() - times[-1]))
            model.fit(data, steps_per_epoch=steps, epochs=iters, verbose=0, shuffle=False, callbacks=[clock])
            return times
        return timed

    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    opt.build(model.trainable_variables)  # state exists before step 1: broadcast it with the weights
    hvd.broadcast_variables(model.variables + optimizer_variables(opt), root_rank=0)

    def timed(iters, steps):
        """`iters` iterations of `steps` steps; the seconds each took."""
        times = []
        if steps == 0:
            return times
        for _ in range(iters):
            t = time.perf_counter()
            for _ in range(steps):
                loss = step()
            float(loss)  # the last step has finished
            times.append(time.perf_counter() - t)
        return times

    timed(1, 1)  # trace
    return timed


def main(argv=None):
    ns = parse(argv)
    hvd, hvd_keras = import_framework(ns.framework)
    hvd.init()
    import keras
    import tensorflow as tf

    threads = ns.intra_op_threads
    if threads < 0:
        threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    def log(msg):
        if hvd.rank() == 0:
            print(msg, flush=True)

    mode = "fit + DistributedOptimizer" if ns.use_fit else "tf.function + DistributedGradientTape"
    log(f"Model: {ns.model}, {ns.image_size}x{ns.image_size} synthetic images, {mode}, {ns.framework}")
    log(f"Batch size: {ns.batch_size} per rank")
    log(f"Number of ranks: {hvd.size()} (CPU, {threads or 'default'} intra-op threads each)")

    start = time.perf_counter()
    timed = build(ns, hvd, hvd_keras, keras, tf)
    log(f"Built and traced in {time.perf_counter() - start:.1f} s")
    log("Running warmup...")
    timed(1, ns.num_warmup_batches)
    log("Running benchmark...")
    rates = [ns.batch_size * ns.num_batches_per_iter / t for t in timed(ns.num_iters, ns.num_batches_per_iter)]
    for i, rate in enumerate(rates):
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
    # Every rank's rate in every iteration; the total of an iteration is the sum over ranks.
    every = hvd.allgather(tf.constant([rates], tf.float64), name="resnet50_synthetic.rates").numpy()
    totals = every.sum(axis=0)
    mean, conf = float(np.mean(rates)), float(1.96 * np.std(rates))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {np.mean(totals):.1f} +-{1.96 * np.std(totals):.1f}")
    if ns.json and hvd.rank() == 0:
        print(json.dumps({
            "framework": ns.framework, "model": ns.model, "ranks": hvd.size(),
            "mode": "fit" if ns.use_fit else "tape", "image_size": ns.image_size, "batch_size": ns.batch_size,
            "batches_per_iter": ns.num_batches_per_iter, "iters": ns.num_iters, "fp16_allreduce": ns.fp16_allreduce,
            "intra_op_threads": threads, "img_sec_per_rank_rank0": mean, "img_sec_per_rank_rank0_conf": conf,
            "total_img_sec_mean": float(np.mean(totals)), "total_img_sec_conf": float(1.96 * np.std(totals)),
            "total_img_sec_per_iter": [float(v) for v in totals]}), flush=True)


if __name__ == "__main__":
    main()
