"""The worker of benchmarks/elastic.py: a small Keras model trained with `fit` under the elastic API,
written once for both libraries (`--library mlsl_tf`: mlsl_tf.keras on Keras 3; `--library horovod`:
horovod.tensorflow.keras on the Horovod venv's Keras 2), a KerasState and Horovod's three elastic
callbacks, a commit every --batches-per-commit batches.

Rank 0 appends one JSON line per finished step to --step-log: wall time, world size, epoch, batch, the
number of steps done so far, and at each (re)start of `train` the step it resumes from, its
resident memory and thread count."""

import argparse
import json
import os
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--library", choices=("mlsl_tf", "horovod"), required=True)
p.add_argument("--step-log", dest="log", required=True)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--steps", type=int, default=100, help="steps per epoch")
p.add_argument("--batches-per-commit", type=int, default=10)
args = p.parse_args()

if args.library == "mlsl_tf":
    import mlsl_tf.keras as hvd
else:
    import horovod.tensorflow.keras as hvd
hvd.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def log(**fields):
    if hvd.rank() == 0:
        with open(args.log, "a") as f:
            f.write(json.dumps({"time": time.time(), "size": hvd.size(), "pid": os.getpid(), **fields}) + "\n")


rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(4096, 32)).astype("float32")
y = (x[:, :16].sum(axis=1) > x[:, 16:].sum(axis=1)).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2, activation="softmax")])
sgd = keras.optimizers.legacy.SGD if args.library == "horovod" else keras.optimizers.SGD
optimizer = hvd.DistributedOptimizer(sgd(0.01 * hvd.size(), momentum=0.9))
model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
model.fit(data, steps_per_epoch=1, epochs=1, verbose=0)  # builds the optimizer (Horovod's recipe)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_reset():
    lr = model.optimizer.learning_rate if args.library == "mlsl_tf" else model.optimizer.lr
    lr.assign(0.01 * hvd.size())


state.register_reset_callbacks([on_reset])


def steps_done():
    """Steps the state says are done: mlsl_tf's state.batch counts the epoch's finished batches,
    Horovod's is the index of the last one (0 at an epoch's end)."""
    batch = state.batch + 1 if args.library == "horovod" and state.batch else state.batch
    return state.epoch * args.steps + batch


class StepLog(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.done = steps_done()

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        log(event="step", step=self.done)


callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit), StepLog()]


@hvd.elastic.run
def train(state):
    log(event="start", epoch=state.epoch, batch=state.batch, step=steps_done(), rss_mib=rss_mib(),
        threads=threading.active_count())
    model.fit(data, steps_per_epoch=args.steps, epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0)


train(state)
log(event="done", epoch=state.epoch)
