"""Hybrid model-parallel x data-parallel training with mlsl_tf: an MLP on scikit-learn's 8x8
digits whose hidden block is split over 2 ranks (Megatron-style), replicated over the rest.

    PYTHONPATH=. .venv/bin/mpiexec -n 4 .venv/bin/python examples/hybrid_parallel.py   # 2-way model x 2-way data
    PYTHONPATH=. .venv/bin/mpiexec -n 4 .venv/bin/python examples/hybrid_parallel.py --model-parallel 4

`grid(model_parallel=K)` makes this rank's model-parallel group (K consecutive ranks, which
share the block's weights: each holds 1/K of them and sees the same batch) and its
data-parallel group (the ranks holding the same shard in the other replicas, which see
different batches). The optimizer averages gradients over the data-parallel group only.
Rank 0 prints the loss (averaged over the replicas) per epoch.
"""

import argparse
import time

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mlsl_tf.keras as hvd
from mlsl_tf.groups import grid
from mlsl_tf.keras.layers import ColumnParallelDense, RowParallelDense

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model-parallel", type=int, default=2, help="ranks per model-parallel group (default 2)")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--hidden", type=int, default=512, help="width of the model-parallel hidden layer")
args = parser.parse_args()

hvd.init()  # Keras prints on rank 0 only
mp, dp = grid(model_parallel=args.model_parallel)

digits = load_digits()
x_all = (digits.data / 16.0).astype("float32")  # (1797, 64)
x_train, x_test, y_train, y_test = train_test_split(x_all, digits.target, test_size=0.25, random_state=0,
                                                    stratify=digits.target)
# Every member of a model-parallel group trains on its replica's shard: the same rows.
x_train, y_train = x_train[dp.rank()::dp.size()], y_train[dp.rank()::dp.size()]

# The same seed everywhere: replicated layers start equal on every rank, and the parallel layers
# build their full weights from their own seeds and keep their slice (no broadcast needed; a
# broadcast from rank 0 would overwrite the other members' shards).
keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(128, activation="relu"),                                     # replicated
    ColumnParallelDense(args.hidden, group=mp, gather_output=False, activation="relu"),  # hidden/K units here
    RowParallelDense(128, group=mp, input_is_parallel=True, activation="relu"),    # partial sums, summed in mp
    keras.layers.Dense(10, activation="softmax"),                                   # replicated
])
shard_params = sum(int(np.prod(v.shape)) for v in model.layers[1].weights + model.layers[2].weights)

base_lr = 0.001
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(base_lr * dp.size()), group=dp),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])

if hvd.rank() == 0:
    print(f"{hvd.size()} ranks: model-parallel groups of {mp.size()}, data-parallel groups of {dp.size()}; "
          f"this rank holds {shard_params} of the block's "
          f"{2 * 128 * args.hidden + args.hidden + 128} parameters", flush=True)

start = time.perf_counter()
# MetricAverageCallback averages over all ranks; members of a model-parallel group report the same
# loss, so that is the average over the data-parallel replicas.
model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, verbose=2,
          callbacks=[hvd.callbacks.MetricAverageCallback()])
train_s = time.perf_counter() - start

# Each replica scores its share of the test set; the counts are summed over the replicas.
shard = slice(dp.rank(), None, dp.size())
predictions = np.argmax(model.predict(x_test[shard], verbose=0), axis=1)
correct = hvd.allreduce(np.array([np.sum(predictions == y_test[shard]), len(predictions)], np.float64), op=hvd.Sum,
                        group=dp, name="hybrid.test_accuracy").numpy()
if hvd.rank() == 0:
    print(f"test accuracy {correct[0] / correct[1]:.4f} on {int(correct[1])} images ({train_s:.1f} s of training)")
# Every rank shuts down at exit, and a rank's shutdown fails collectives still pending anywhere:
# wait until every data-parallel group has finished its reduction.
hvd.barrier()
