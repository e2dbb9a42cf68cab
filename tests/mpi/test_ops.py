"""Every collective x dtype x eager/tf.function on N ranks, checked against numpy."""

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()
MODES = ["eager", "graph"]
NUMERIC = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]


def run(mode, fn, *args):
    return tf.function(fn)(*args) if mode == "graph" else fn(*args)


def np_of(t):
    return np.asarray(tf.cast(t, tf.float64) if t.dtype == tf.bfloat16 else t, dtype=np.float64)


def rank_data(rank, dtype, shape=(3, 2)):
    """Small values that every dtype holds exactly, different on each rank."""
    base = np.arange(np.prod(shape)).reshape(shape) % 5
    return tf.cast(tf.constant(base + rank + 1), dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_allreduce_every_op(mode, dtype):
    ranks = [np_of(rank_data(r, dtype)) for r in range(N)]
    expected = {hvd.Sum: sum(ranks), hvd.Min: np.min(ranks, axis=0), hvd.Max: np.max(ranks, axis=0),
                hvd.Product: np.prod(ranks, axis=0)}
    x = rank_data(R, dtype)
    for op, want in expected.items():
        if op in (hvd.Sum, hvd.Product) and dtype in (tf.uint8, tf.int8) and np.max(np.abs(want)) > 100:
            continue  # would overflow 8 bits
        if op == hvd.Product and dtype in (tf.float16, tf.bfloat16) and N > 2:
            continue  # products of 3 values lose exactness in 8-bit mantissas
        got = run(mode, lambda t: hvd.allreduce(t, op=op, name=f"ar.{mode}.{dtype.name}.{op}"), x)
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_array_equal(np_of(got), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32], ids=lambda d: d.name)
def test_allreduce_average_and_scaling(mode, dtype):
    x = tf.cast(tf.fill([4], 2 * (R + 1)), dtype)
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Average, name=f"avg.{mode}.{dtype.name}"), x)
    want = sum(2 * (r + 1) for r in range(N)) / N
    if dtype.is_integer:
        want = int(want)
    np.testing.assert_allclose(np_of(got), want, rtol=1e-2)
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                                            name=f"scaled.{mode}.{dtype.name}"), x)
    np.testing.assert_allclose(np_of(got), 3.0 * sum(r + 1 for r in range(N)), rtol=1e-2)


def test_allreduce_default_is_average_and_bool():
    got = hvd.allreduce(tf.constant([float(R)]), name="default_avg")
    np.testing.assert_allclose(got.numpy(), [np.mean(range(N))])
    flags = tf.constant([R == 0, True, False])
    np.testing.assert_array_equal(hvd.allreduce(flags, op=hvd.Max, name="bool_or").numpy(), [True, True, False])
    np.testing.assert_array_equal(hvd.allreduce(flags, op=hvd.Min, name="bool_and").numpy(), [N == 1, True, False])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not meaningful for bool"):
        hvd.allreduce(flags, op=hvd.Sum, name="bool_sum")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixed_dtypes(mode):
    xs = [tf.fill([2, 2], float(R)), tf.fill([5], R + 1), tf.constant(float(R), tf.float64)]
    got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Sum, name=f"grouped.{mode}"), *xs)
    assert [g.dtype for g in got] == [x.dtype for x in xs]
    np.testing.assert_array_equal(got[0].numpy(), np.full([2, 2], sum(range(N))))
    np.testing.assert_array_equal(got[1].numpy(), np.full([5], sum(range(1, N + 1))))
    assert got[2].numpy() == sum(range(N))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", NUMERIC + [tf.bool], ids=lambda d: d.name)
def test_allgather_uneven_first_dimension(mode, dtype):
    x = tf.cast(tf.fill([R + 1, 2], R % 2 if dtype == tf.bool else R + 1), dtype)
    got = run(mode, lambda t: hvd.allgather(t, name=f"ag.{mode}.{dtype.name}"), x)
    want = np.concatenate([np.full([r + 1, 2], r % 2 if dtype == tf.bool else r + 1) for r in range(N)])
    assert got.dtype == dtype
    np.testing.assert_array_equal(np_of(got), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", NUMERIC + [tf.bool], ids=lambda d: d.name)
def test_broadcast_every_root(mode, dtype):
    for root in range(N):
        x = tf.cast(tf.fill([3], (R + 1) % 2 if dtype == tf.bool else R + 1), dtype)
        got = run(mode, lambda t: hvd.broadcast(t, root_rank=root, name=f"bc.{mode}.{dtype.name}.{root}"), x)
        np.testing.assert_array_equal(np_of(got), np.full([3], (root + 1) % 2 if dtype == tf.bool else root + 1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.uint8, tf.int64, tf.bfloat16, tf.float32, tf.bool], ids=lambda d: d.name)
def test_alltoall_with_splits(mode, dtype):
    # rank r sends r + d + 1 rows to rank d, each row filled with 10 * r + d
    splits = [R + d + 1 for d in range(N)]
    rows = np.concatenate([np.full([splits[d], 2], 10 * R + d) for d in range(N)])
    x = tf.cast(tf.constant(rows % 2 if dtype == tf.bool else rows), dtype)
    got, received = run(mode, lambda t: hvd.alltoall(t, splits=splits, name=f"a2a.{mode}.{dtype.name}"), x)
    want = np.concatenate([np.full([s + R + 1, 2], 10 * s + R) for s in range(N)])
    np.testing.assert_array_equal(np_of(got), want % 2 if dtype == tf.bool else want)
    np.testing.assert_array_equal(received.numpy(), [s + R + 1 for s in range(N)])


def test_alltoall_even_split_default():
    x = tf.reshape(tf.range(2 * N, dtype=tf.int32) + 100 * R, [2 * N, 1])
    got, received = hvd.alltoall(x, name="a2a_even")
    want = np.concatenate([[2 * R + 100 * s, 2 * R + 1 + 100 * s] for s in range(N)]).reshape(-1, 1)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(received.numpy(), [2] * N)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_uneven(mode, op):
    rows = 2 * N + 1  # the first rank gets one row more
    x = tf.reshape(tf.range(rows * 3, dtype=tf.float32), [rows, 3]) * (R + 1)
    got = run(mode, lambda t: hvd.reducescatter(t, op=op, name=f"rs.{mode}.{op}"), x)
    full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * sum(range(1, N + 1))
    if op == hvd.Average:
        full = full / N
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    start = sum(counts[:R])
    np.testing.assert_allclose(got.numpy(), full[start:start + counts[R]], rtol=1e-6)


def test_barrier_and_process_queries():
    hvd.barrier()
    assert 0 <= hvd.local_rank() < hvd.local_size() <= N
    assert hvd.cross_size() * hvd.local_size() == N
    assert hvd.mpi_threads_supported() and hvd.mpi_enabled() and hvd.mpi_built()


def test_broadcast_helpers():
    obj = {"rank": R, "payload": list(range(R + 3))}
    assert hvd.broadcast_object(obj, root_rank=N - 1) == {"rank": N - 1, "payload": list(range(N + 2))}
    assert hvd.allgather_object(("r", R)) == [("r", r) for r in range(N)]
    v = [tf.Variable(tf.fill([3], float(R))), tf.Variable(R)]
    hvd.broadcast_variables(v, root_rank=N - 1)
    np.testing.assert_array_equal(v[0].numpy(), [N - 1.0] * 3)
    assert v[1].numpy() == N - 1


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.int64], ids=lambda d: d.name)
def test_large_allreduce_every_op(dtype):
    """Sizes past the vector widths, the 1 MiB chunks and the 4 MiB huge-page advice, with an odd
    element count; reduced in MPI by the core's vectorised kernels."""
    n = (5 << 20) // dtype.size + 3
    ranks = [np.random.default_rng(r).integers(-1000, 1000, n) for r in range(N)]
    expected = {hvd.Sum: np.sum(ranks, axis=0), hvd.Min: np.min(ranks, axis=0), hvd.Max: np.max(ranks, axis=0)}
    x = tf.constant(ranks[R], dtype)
    for op, want in expected.items():
        got = hvd.allreduce(x, op=op, name=f"big.{dtype.name}.{op}")  # x stays alive: a fresh output
        np.testing.assert_array_equal(got.numpy(), want.astype(dtype.as_numpy_dtype))
    np.testing.assert_array_equal(x.numpy(), ranks[R].astype(dtype.as_numpy_dtype))  # input untouched


def test_allreduce_chain_runs_in_place():
    """Inside a tf.function an allreduce whose input has no other consumer writes into it."""
    @tf.function
    def chain(t):
        for i in range(3):
            t = hvd.allreduce(t, op=hvd.Sum, name=f"inplace.{i}")
        return t

    before = hvd.stats()["in_place"]
    got = chain(tf.ones([1 << 20]))
    np.testing.assert_array_equal(got.numpy(), np.full(1 << 20, float(N) ** 3, np.float32))
    assert hvd.stats()["in_place"] - before >= 2  # the 2nd and 3rd; the 1st reads the caller's tensor
