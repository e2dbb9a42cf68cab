"""The one-machine ring allreduce (MLSL_TF_RING_BYTES): point-to-point reduce-scatter + allgather
that reduces into the output and reuses its receive buffers (issue #13). Here the threshold is
1 byte, so every allreduce takes the ring, including counts smaller than the number of ranks
(empty segments), odd counts, every dtype and op, in place (a chain of fresh tensors) and out
of place (the caller keeps its input); results must match numpy and be bit-identical on every rank."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()
COUNTS = [1, N - 1 or 1, N, N + 1, 1000, (3 << 20) // 4 + 7]  # the last: several 1 MiB chunks


@pytest.fixture(scope="module", autouse=True)
def ring_everywhere():
    os.environ["MLSL_TF_RING_BYTES"] = "1"
    hvd.shutdown()
    hvd.init()
    yield
    del os.environ["MLSL_TF_RING_BYTES"]
    hvd.shutdown()
    hvd.init()


def values(rank, n, top=5):
    """Small integers in 1..top, different on each rank (top=2 for products: 2**N stays exact)."""
    v = (np.arange(n) * 7 + 3 * rank) % top + 1
    return v.astype(np.float64)


def reference(op, n, top=5):
    per_rank = np.array([values(r, n, top) for r in range(N)])
    if op == hvd.Sum:
        return per_rank.sum(0)
    if op == hvd.Min:
        return per_rank.min(0)
    if op == hvd.Max:
        return per_rank.max(0)
    return per_rank.prod(0)


def as_np(t):
    return np.asarray(tf.cast(t, tf.float64))


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.uint8],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product], ids=["sum", "min", "max", "prod"])
def test_out_of_place_every_dtype_and_op(n, dtype, op):
    top = 2 if op == hvd.Product else 5
    x = tf.cast(tf.constant(values(R, n, top)), dtype)
    y = hvd.allreduce(x, op=op, name=f"ring.{dtype.name}.{n}.{op}")
    np.testing.assert_array_equal(as_np(y), reference(op, n, top))
    np.testing.assert_array_equal(as_np(x), values(R, n, top))  # the input kept its value


@pytest.mark.parametrize("n", COUNTS)
def test_in_place_chain_of_fresh_tensors(n):
    @tf.function
    def chain(t):
        for i in range(3):  # each input is a fresh tensor nobody else reads: reduced in place
            t = hvd.allreduce(t, op=hvd.Sum, name=f"ring.chain.{n}.{i}") * (1.0 / N)
        return t

    before = hvd.stats()["in_place"]
    x = tf.constant(values(R, n), tf.float32)
    got = chain(x)
    mean = reference(hvd.Sum, n) / N
    np.testing.assert_allclose(got.numpy(), mean, rtol=1e-6)
    if n >= 256:  # TensorFlow forwards larger buffers; the 2nd and 3rd allreduce run in place
        assert hvd.stats()["in_place"] - before >= 2


@pytest.mark.parametrize("n", [N + 1, (3 << 20) // 4 + 7])
def test_float_sums_are_bit_identical_on_every_rank(n):
    x = tf.constant(np.random.default_rng(R).standard_normal(n).astype(np.float32) * 1e3)
    y = hvd.allreduce(x, op=hvd.Sum, name=f"ring.bits.{n}")
    everyone = hvd.allgather(tf.reshape(y, [1, n])).numpy()
    for r in range(N):
        np.testing.assert_array_equal(everyone[r].view(np.uint32), everyone[0].view(np.uint32))
    np.testing.assert_allclose(y.numpy(), sum(np.random.default_rng(r).standard_normal(n).astype(np.float32) * 1e3
                                              for r in range(N)), rtol=1e-4, atol=1e-2)


def test_average_and_grouped_fusion_take_the_ring():
    a = tf.fill([N * 10 + 1], float(R))
    b = tf.fill([3], float(2 * R))
    ga, gb = hvd.grouped_allreduce([a, b], op=hvd.Average, name="ring.grouped")
    np.testing.assert_allclose(ga.numpy(), np.full(N * 10 + 1, (N - 1) / 2))
    np.testing.assert_allclose(gb.numpy(), np.full(3, float(N - 1)))


@pytest.mark.parametrize("n", [N + 1, (3 << 20) // 4 + 7])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_average_and_postscale_are_applied_once_by_each_segments_owner(n, dtype, in_place):
    # Each rank scales only the segment it reduced, before the allgather: the result must be the
    # sum times the factor rounded once (sum as float64, times the factor, back to dtype), and the
    # same bits on every rank.
    np_dtype = np.float32 if dtype == tf.float32 else np.float64
    exact_sum = reference(hvd.Sum, n)  # small integers: exact in every order
    for op, post in ((hvd.Average, 1.0), (hvd.Sum, 0.3), (hvd.Average, 2.0)):
        factor = float(np.float32(post)) / (N if op == hvd.Average else 1)  # the op's attribute is a float32
        name = f"ring.scaled.{dtype.name}.{n}.{in_place}.{op}.{post}"
        if in_place:
            y = tf.function(lambda t: hvd.allreduce(t * 1.0, op=op, postscale_factor=post, name=name))(
                tf.constant(values(R, n), dtype))
        else:
            x = tf.constant(values(R, n), dtype)
            y = hvd.allreduce(x, op=op, postscale_factor=post, name=name)
            np.testing.assert_array_equal(x.numpy(), values(R, n).astype(np_dtype))  # the input kept its value
        want = (exact_sum.astype(np.float64) * factor).astype(np_dtype)
        np.testing.assert_array_equal(y.numpy(), want)
        everyone = hvd.allgather(tf.reshape(y, [1, n]), name=name + ".check").numpy()
        for r in range(N):
            np.testing.assert_array_equal(everyone[r], everyone[0])


@pytest.mark.parametrize("n", [1, N + 1, 4099])
def test_bool_or_and(n):
    flags = tf.constant((np.arange(n) + R) % 3 == 0)
    every = np.array([(np.arange(n) + r) % 3 == 0 for r in range(N)])
    got_or = hvd.allreduce(flags, op=hvd.Max, name=f"ring.or.{n}")
    got_and = hvd.allreduce(flags, op=hvd.Min, name=f"ring.and.{n}")
    np.testing.assert_array_equal(got_or.numpy(), every.any(0))
    np.testing.assert_array_equal(got_and.numpy(), every.all(0))


def _ran(way):
    return hvd.stats()["ways"].get(way, 0)


def test_the_ways_that_ran_are_the_operation_tables_choice():
    """Every rank on this machine: a chunk of at least MLSL_TF_RING_BYTES runs as the ring, a
    smaller one as MPI's allreduce with the core's kernels, never with MPI's own operation (the
    operation tables, ops/core/operations.h; the C++ tests hold the fake transport and the
    simulator to the same tables)."""
    x = tf.fill([16384], float(R))  # 64 KiB: not eager
    ring, chunks = _ran("ring_allreduce"), _ran("chunks")
    out = hvd.allreduce(x, op=hvd.Sum, name="ways.ring")
    assert (_ran("ring_allreduce") - ring, _ran("chunks") - chunks) == (1, 1)
    np.testing.assert_array_equal(out.numpy(), np.full(16384, N * (N - 1) / 2))
    os.environ["MLSL_TF_RING_BYTES"] = str(16384 * 4 + 1)
    hvd.shutdown()
    hvd.init()
    try:
        out = hvd.allreduce(x, op=hvd.Sum, name="ways.kernel")
        assert (_ran("kernel_allreduce"), _ran("ring_allreduce"), _ran("native_allreduce")) == (1, 0, 0)
        np.testing.assert_array_equal(out.numpy(), np.full(16384, N * (N - 1) / 2))
    finally:
        os.environ["MLSL_TF_RING_BYTES"] = "1"
        hvd.shutdown()
        hvd.init()
