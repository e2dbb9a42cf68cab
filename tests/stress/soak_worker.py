"""One rank of the soak (run by test_soak.py under mlslrun): mixed eager collectives with every
result checked, then distinct names; RSS sampled. Prints one JSON line on rank 0."""

import json
import sys
import time

import mlsl_tf as hvd

hvd.init()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

N, R = hvd.size(), hvd.rank()
MIXED, DISTINCT = int(sys.argv[1]), int(sys.argv[2])


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def fill(shape, value, dtype):
    # from numpy: tf.fill with a new Python scalar each call would grow TensorFlow's eager cache
    # of scalar constants (one entry per distinct value), which is not mlsl_tf's memory
    return tf.constant(np.full(shape, value, dtype))


def one(i, name):
    """Collective number i (its kind cycles); returns whether its result was right."""
    kind, k = i % 6, 1 + i % 97
    if kind == 0:
        y = hvd.allreduce(fill([k], i + R, np.float32), op=hvd.Sum, name=name)
        return np.array_equal(y.numpy(), np.full(k, N * i + N * (N - 1) / 2))
    if kind == 1:
        y = hvd.allgather(fill([R + 1, 2], i + R, np.int32), name=name)
        want = np.concatenate([np.full([r + 1, 2], i + r) for r in range(N)])
        return np.array_equal(y.numpy(), want)
    if kind == 2:
        root = i % N
        y = hvd.broadcast(fill([k], i * 10 + R, np.int32), root_rank=root, name=name)
        return np.array_equal(y.numpy(), np.full(k, i * 10 + root))
    if kind == 3:
        y = hvd.alltoall(fill([N * 2], i * 10 + R, np.int32), name=name)
        return np.array_equal(y.numpy(), np.repeat([i * 10 + r for r in range(N)], 2))
    if kind == 4:
        y = hvd.reducescatter(fill([N * 3], i + R, np.float32), op=hvd.Sum, name=name)
        return np.array_equal(y.numpy(), np.full(3, N * i + N * (N - 1) / 2))
    ys = hvd.grouped_allreduce([fill([k], i + R, np.float32), fill([2], R, np.float32)], op=hvd.Sum, name=name)
    return (np.array_equal(ys[0].numpy(), np.full(k, N * i + N * (N - 1) / 2))
            and np.array_equal(ys[1].numpy(), np.full(2, N * (N - 1) / 2)))


wrong, samples = 0, []
start = time.time()
for i in range(MIXED):
    # named and unnamed calls, a bounded set of names
    wrong += not one(i, None if i % 2 else f"soak.{i % 6}.{i % 40}")
    if i % 10000 == 0:
        samples.append(["mixed", i, rss_kib()])
mixed_s = time.time() - start
start = time.time()
for j in range(DISTINCT):
    wrong += not one(6 * j, f"distinct.{j}")  # allreduces, each under a new name
    if j % 2000 == 0:
        samples.append(["distinct", j, rss_kib()])
samples.append(["end", DISTINCT, rss_kib()])
result = {"rank": R, "ranks": N, "mixed": MIXED, "distinct": DISTINCT, "wrong": int(wrong),
          "mixed_s": round(mixed_s, 1), "distinct_s": round(time.time() - start, 1), "rss_kib": samples,
          "names_known": hvd.stats()["names_known"], "names_forgotten": hvd.stats()["names_forgotten"]}
print("SOAK " + json.dumps(result), flush=True)
