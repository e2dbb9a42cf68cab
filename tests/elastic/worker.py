"""The worker of the elastic tests and of benchmarks/elastic.py: a small TensorFlow model trained
under hvd.elastic.run with a TensorFlowKerasState and a commit every batch.

Rank 0 appends JSON lines to --log: "resume" (the state a generation starts from), "commit" (epoch,
batch, the weights' checksum), "done"; every rank appends "final" (its weights' checksum) at the
end.  --fail EPOCH,BATCH,START_RANK,MODE[,always] (repeatable) makes the worker whose HOROVOD_RANK is START_RANK
fail there, in the first generation only unless `always`: MODE kill (SIGKILL itself), raise (an
exception), or exit (sys.exit(3)).  A "resume" line also has the process's resident memory and
thread count."""

import argparse
import json
import os
import signal
import threading
import time

import mlsl_tf as hvd

hvd.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--log", required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batches", type=int, default=10)
p.add_argument("--batch-seconds", type=float, default=0.0, help="sleep in each batch (a longer step)")
p.add_argument("--fail", action="append", default=[], help="EPOCH,BATCH,START_RANK,MODE[,always] (repeatable)")
args = p.parse_args()
generation = int(os.environ.get("MLSL_TF_ELASTIC_GENERATION", "0"))
start_rank = int(os.environ.get("HOROVOD_RANK", "-1"))


def log(every_rank=False, **fields):
    if every_rank or hvd.rank() == 0:
        record = {"generation": generation, "rank": hvd.rank(), "size": hvd.size(), "start_rank": start_rank,
                  "hostname": os.environ.get("HOROVOD_HOSTNAME"), "time": time.time(), **fields}
        with open(args.log, "a") as f:
            f.write(json.dumps(record) + "\n")


def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
x = tf.random.stateless_normal([16, 4], seed=[hvd.rank(), 7])
y = tf.reduce_sum(x, axis=1, keepdims=True)


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def checksum():
    return float(sum(np.sum(np.abs(w.numpy().astype(np.float64))) for w in model.variables))


optimizer.build(model.trainable_variables)
fails = [spec.split(",") for spec in args.fail]


def maybe_fail(state):
    for fail in fails:
        if (generation == 1 or fail[4:] == ["always"]) and \
                (state.epoch, state.batch, start_rank) == (int(fail[0]), int(fail[1]), int(fail[2])):
            log(every_rank=True, event="failing", mode=fail[3])
            if fail[3] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fail[3] == "raise":
                raise RuntimeError(f"start rank {start_rank} fails at epoch {state.epoch} batch {state.batch}")
            raise SystemExit(3)


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    log(event="resume", epoch=state.epoch, batch=state.batch, rendezvous=state.rendezvous, checksum=checksum(),
        rss_mib=rss_mib(), threads=threading.active_count())
    while state.epoch < args.epochs:
        while state.batch < args.batches:
            maybe_fail(state)
            step()
            time.sleep(args.batch_seconds)
            state.batch += 1
            state.commit()
            log(event="commit", epoch=state.epoch, batch=state.batch, checksum=checksum())
        state.epoch += 1
        state.batch = 0
        state.commit()


state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0, rendezvous=0)
train(state)
log(event="done", epoch=state.epoch, batch=state.batch, rendezvous=state.rendezvous)
log(every_rank=True, event="final", checksum=checksum())
