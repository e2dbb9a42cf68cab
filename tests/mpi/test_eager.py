"""Eager allreduces (MLSL_TF_EAGER_BYTES, default 8 KiB): a small allreduce whose name every
rank already knows rides in the control message and finishes in its one round trip. Each test
repeats names so the second and later calls can ride along; the values must match numpy on
every call (the first, two-round call included), every dtype and op, with scaling, grouped, and
interleaved with larger allreduces and compressed ones that must not ride along."""

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()
REPEATS = 6


def values(rank, n, top=5):
    return ((np.arange(n) * 7 + 3 * rank) % top + 1).astype(np.float64)


def reference(op, n, top=5):
    per_rank = np.array([values(r, n, top) for r in range(N)])
    return {hvd.Sum: per_rank.sum(0), hvd.Min: per_rank.min(0), hvd.Max: per_rank.max(0),
            hvd.Product: per_rank.prod(0), hvd.Average: per_rank.mean(0)}[op]


def as_np(t):
    return np.asarray(tf.cast(t, tf.float64))


@pytest.mark.parametrize("n", [1, 3, 1024])  # 1024 floats: 4 KiB, what issue #13 measures
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.uint8],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product], ids=["sum", "min", "max", "prod"])
def test_every_dtype_and_op_rides_along(n, dtype, op):
    top = 2 if op == hvd.Product else 5
    x = tf.cast(tf.constant(values(R, n, top)), dtype)
    before = hvd.stats()["eager"]
    for _ in range(REPEATS):
        y = hvd.allreduce(x, op=op, name=f"eager.{dtype.name}.{n}.{op}")
        np.testing.assert_array_equal(as_np(y), reference(op, n, top))
        np.testing.assert_array_equal(as_np(x), values(R, n, top))  # the input kept its value
    if n * dtype.size <= 8192:
        assert hvd.stats()["eager"] - before >= REPEATS - 2


def test_average_scaling_and_grouped_in_a_graph():
    a = tf.constant(values(R, 5), tf.float32)
    b = tf.constant(values(R, 300), tf.float64)

    @tf.function
    def step(a, b):
        avg = hvd.allreduce(a, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.25, name="eager.avg")
        g = hvd.grouped_allreduce([a, a * 3.0], op=hvd.Sum, name="eager.grouped")
        m = hvd.allreduce(b, op=hvd.Max, name="eager.max64")
        return avg, g[0], g[1], m

    before = hvd.stats()["eager"]
    for _ in range(REPEATS):
        avg, g0, g1, m = step(a, b)
        np.testing.assert_allclose(avg.numpy(), reference(hvd.Average, 5) * 0.5, rtol=1e-6)
        np.testing.assert_array_equal(g0.numpy(), reference(hvd.Sum, 5))
        np.testing.assert_array_equal(g1.numpy(), 3 * reference(hvd.Sum, 5))
        np.testing.assert_array_equal(m.numpy(), reference(hvd.Max, 300))
    assert hvd.stats()["eager"] - before >= 2 * (REPEATS - 2)


def test_chain_of_fresh_small_tensors_is_bit_identical_on_every_rank():
    @tf.function
    def chain(t):
        for i in range(8):
            t = hvd.allreduce(t, op=hvd.Sum, name=f"eager.chain.{i}") * (1.0 / N) + 0.1
        return t

    x = tf.constant(np.random.RandomState(R).standard_normal(1024), tf.float32)
    for _ in range(3):
        got = chain(x).numpy()
    every = hvd.allgather(tf.constant(got[None, :])).numpy()
    for r in range(N):
        np.testing.assert_array_equal(every[r], every[0])  # not merely close: the same bits


def test_large_and_compressed_allreduces_do_not_ride_along():
    big = tf.constant(values(R, 4096), tf.float32)  # 16 KiB > 8 KiB
    small = tf.constant(values(R, 16), tf.float32)
    before = hvd.stats()["eager"]
    for _ in range(REPEATS):
        np.testing.assert_array_equal(hvd.allreduce(big, op=hvd.Sum, name="eager.big").numpy(),
                                      reference(hvd.Sum, 4096))
    assert hvd.stats()["eager"] == before
    for _ in range(REPEATS):  # bf16 on the wire: the compressed path, whose rounding it keeps
        y = hvd.allreduce(small, op=hvd.Sum, name="eager.bf16", compression=hvd.Compression.bf16)
        np.testing.assert_allclose(y.numpy(), reference(hvd.Sum, 16), rtol=1e-2)
    assert hvd.stats()["eager"] == before


def test_ranks_that_drift_apart_still_agree():
    # Rank 0 submits late now and then: the entry is invalid that cycle and it rides the next
    # one (or takes the two-round path); every value is still right.
    import time
    x = tf.constant(values(R, 64), tf.float32)
    for i in range(40):
        if R == 0 and i % 3 == 0:
            time.sleep(0.002)
        y = hvd.allreduce(x * float(i), op=hvd.Sum, name="eager.drift")
        np.testing.assert_array_equal(y.numpy(), reference(hvd.Sum, 64) * i)
