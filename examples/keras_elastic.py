"""Elastic Keras training with mlsl_tf: the digits CNN survives workers that die and come back.

    mlslrun -np 3 --min-np 2 --max-np 3 --host-discovery-script ./hosts.sh \\
        --blacklist-cooldown-range 10 20 python examples/keras_elastic.py

where hosts.sh prints the usable hosts, one `host:slots` a line (e.g. `localhost:2` and
`127.0.0.1:1`, two names of this machine).  Kill a worker (`kill -9 PID`): the others write the
last commit and leave, mlslrun starts the job again on the hosts left (the dead worker's host sits
out its cooldown), rank 0 resumes from that commit, and when the host is back the job grows to its
full size at the next commit.  A Horovod elastic script with only the import changed, except that
the partial epoch a reset leaves is finished first (Keras 3's fit cannot shorten an epoch already
begun).

--log FILE appends one JSON line per commit (generation, epoch, batch, size) and per resume, so a
test can check that no commit was lost.
"""

import argparse
import json
import math
import os
import time

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mlsl_tf.keras as hvd

hvd.init()

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--steps-per-epoch", type=int, default=60)
parser.add_argument("--batches-per-commit", type=int, default=5)
parser.add_argument("--log", help="append a JSON line per commit and per resume to this file (rank 0)")
args = parser.parse_args()
generation = int(os.environ.get("MLSL_TF_ELASTIC_GENERATION", "0"))


def log(**fields):
    if args.log and hvd.rank() == 0:
        with open(args.log, "a") as f:
            f.write(json.dumps({"generation": generation, "size": hvd.size(), "time": time.time(), **fields}) + "\n")


digits = load_digits()
images = (digits.images / 16.0).astype("float32")[..., None]
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0,
                                                    stratify=digits.target)

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
base_lr = 0.001
optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(base_lr * hvd.size()))
model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def shard():
    """This rank's share of the training set for the current size(), as an endless dataset."""
    x, y = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    import tensorflow as tf
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=hvd.rank()).repeat().batch(16)


state = hvd.elastic.KerasState(model, optimizer, batch=0, epoch=0)


def learning_rate():
    """base_lr times the workers now, decayed over the epochs trained (a cosine to 0 at the
    last): where the job ends does not depend on the size it ran at last."""
    return base_lr * hvd.size() * 0.5 * (1 + math.cos(math.pi * state.epoch / args.epochs))


def on_reset():
    """After a reset the world size may differ: scale the learning rate again."""
    optimizer.learning_rate.assign(learning_rate())


class DecayLearningRate(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        optimizer.learning_rate.assign(learning_rate())


state.register_reset_callbacks([on_reset])


class LogCommits(hvd.elastic.CommitStateCallback):
    def commit(self):
        super().commit()
        log(event="commit", epoch=self.state.epoch, batch=self.state.batch)


callbacks = [
    hvd.callbacks.MetricAverageCallback(),
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    DecayLearningRate(),
    LogCommits(state, batches_per_commit=args.batches_per_commit),
]


@hvd.elastic.run
def train(state):
    log(event="resume", epoch=state.epoch, batch=state.batch)
    data = shard()
    verbose = 2 if hvd.rank() == 0 else 0
    if state.batch >= args.steps_per_epoch:  # committed after its last batch, before the epoch's end
        state.epoch, state.batch = state.epoch + 1, 0
    if state.batch > 0 and state.epoch < args.epochs:  # finish the epoch the reset interrupted
        model.fit(data, steps_per_epoch=args.steps_per_epoch - state.batch, epochs=1, callbacks=callbacks,
                  verbose=verbose)
    if state.epoch < args.epochs:
        model.fit(data, steps_per_epoch=args.steps_per_epoch, epochs=args.epochs - state.epoch,
                  callbacks=callbacks, verbose=verbose)


start = time.perf_counter()
train(state)
train_s = time.perf_counter() - start

part = slice(hvd.rank(), None, hvd.size())
predictions = np.argmax(model.predict(x_test[part], verbose=0), axis=1)
correct = hvd.allreduce(np.array([np.sum(predictions == y_test[part]), len(predictions)], np.float64), op=hvd.Sum,
                        name="keras_elastic.test_accuracy").numpy()
if hvd.rank() == 0:
    accuracy = correct[0] / correct[1]
    log(event="done", accuracy=float(accuracy))
    print(f"test accuracy {accuracy:.4f} on {int(correct[1])} images ({hvd.size()} ranks at the end, "
          f"generation {generation}, {train_s:.1f} s in this generation)")
