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
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_allreduce_average_and_scaling(mode, dtype):
    x = tf.cast(tf.fill([4], 2 * N * (R + 1)), dtype)  # sums divide by N exactly, also in integers
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Average, name=f"avg.{mode}.{dtype.name}"), x)
    assert got.dtype == dtype
    np.testing.assert_allclose(np_of(got), sum(2 * (r + 1) for r in range(N)), rtol=1e-2)
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                                            name=f"scaled.{mode}.{dtype.name}"), x)
    np.testing.assert_allclose(np_of(got), 3.0 * N * sum(r + 1 for r in range(N)), rtol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_default_is_average_and_bool(mode):
    got = run(mode, lambda t: hvd.allreduce(t, name=f"default_avg.{mode}"), tf.constant([float(R)]))
    np.testing.assert_allclose(got.numpy(), [np.mean(range(N))])
    flags = tf.constant([R == 0, True, False])
    got_or = run(mode, lambda t: hvd.allreduce(t, op=hvd.Max, name=f"bool_or.{mode}"), flags)
    got_and = run(mode, lambda t: hvd.allreduce(t, op=hvd.Min, name=f"bool_and.{mode}"), flags)
    assert got_or.dtype == tf.bool and got_and.dtype == tf.bool
    np.testing.assert_array_equal(got_or.numpy(), [True, True, False])
    np.testing.assert_array_equal(got_and.numpy(), [N == 1, True, False])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not meaningful for bool"):
        run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"bool_sum.{mode}"), flags)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixed_dtypes(mode):
    xs = [tf.fill([2, 2], float(R)), tf.fill([5], R + 1), tf.constant(float(R), tf.float64)]
    got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Sum, name=f"grouped.{mode}"), *xs)
    assert [g.dtype for g in got] == [x.dtype for x in xs]
    np.testing.assert_array_equal(got[0].numpy(), np.full([2, 2], sum(range(N))))
    np.testing.assert_array_equal(got[1].numpy(), np.full([5], sum(range(1, N + 1))))
    assert got[2].numpy() == sum(range(N))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_grouped_allreduce_every_op(mode, dtype):
    """One negotiation for three tensors of one dtype and different shapes, every op."""
    shapes = [(3, 2), (5,), ()]
    xs = [rank_data(R, dtype, s) for s in shapes]
    per_rank = [[np_of(rank_data(r, dtype, s)) for r in range(N)] for s in shapes]
    reducers = {hvd.Sum: lambda a: np.sum(a, axis=0), hvd.Min: lambda a: np.min(a, axis=0),
                hvd.Max: lambda a: np.max(a, axis=0)}
    for op, reduce in reducers.items():
        got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=op, name=f"gar.{mode}.{dtype.name}.{op}"), *xs)
        assert [g.dtype for g in got] == [dtype] * 3 and [tuple(g.shape) for g in got] == shapes
        for g, ranks in zip(got, per_rank):
            np.testing.assert_array_equal(np_of(g), reduce(ranks))
    ys = [tf.cast(tf.fill(s, 2 * N * (R + 1)), dtype) for s in shapes]
    got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Average, postscale_factor=2.0,
                                                      name=f"gar.{mode}.{dtype.name}.avg"), *ys)
    for g, s in zip(got, shapes):
        np.testing.assert_allclose(np_of(g), np.full(s, 4.0 * sum(r + 1 for r in range(N))), rtol=1e-2)


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
@pytest.mark.parametrize("dtype", NUMERIC + [tf.bool], ids=lambda d: d.name)
def test_alltoall_with_splits(mode, dtype):
    # rank r sends r + d + 1 rows to rank d, each row filled with 10 * r + d
    splits = [R + d + 1 for d in range(N)]
    rows = np.concatenate([np.full([splits[d], 2], 10 * R + d) for d in range(N)])
    x = tf.cast(tf.constant(rows % 2 if dtype == tf.bool else rows), dtype)
    got, received = run(mode, lambda t: hvd.alltoall(t, splits=splits, name=f"a2a.{mode}.{dtype.name}"), x)
    want = np.concatenate([np.full([s + R + 1, 2], 10 * s + R) for s in range(N)])
    np.testing.assert_array_equal(np_of(got), want % 2 if dtype == tf.bool else want)
    np.testing.assert_array_equal(received.numpy(), [s + R + 1 for s in range(N)])


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_with_empty_slices(mode):
    # rank r sends nothing to rank r+1 and d + 1 rows of 100 * r + d to every other rank d (itself
    # included); a second call sends nothing at all. Every slice, empty or not, lands where it belongs.
    splits = [0 if d == (R + 1) % N else d + 1 for d in range(N)]
    rows = np.concatenate([np.full([splits[d], 3], 100 * R + d, np.float32) for d in range(N)])
    got, received = run(mode, lambda t: hvd.alltoall(t, splits=splits, name=f"a2a_empty.{mode}"), tf.constant(rows))
    senders = [s for s in range(N) if R != (s + 1) % N]
    want = np.concatenate([np.full([R + 1, 3], 100 * s + R, np.float32) for s in senders])
    np.testing.assert_array_equal(np_of(got), want)
    np.testing.assert_array_equal(received.numpy(), [0 if R == (s + 1) % N else R + 1 for s in range(N)])
    none, received = run(mode, lambda t: hvd.alltoall(t, splits=[0] * N, name=f"a2a_none.{mode}"),
                         tf.zeros([0, 3], tf.float32))
    assert tuple(none.shape) == (0, 3)
    np.testing.assert_array_equal(received.numpy(), [0] * N)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_even_split_default(mode):
    x = tf.reshape(tf.range(2 * N, dtype=tf.int32) + 100 * R, [2 * N, 1])
    got = run(mode, lambda t: hvd.alltoall(t, name=f"a2a_even.{mode}"), x)  # no splits given: the tensor alone
    want = np.concatenate([[2 * R + 100 * s, 2 * R + 1 + 100 * s] for s in range(N)]).reshape(-1, 1)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_uneven(mode, dtype, op):
    rows = 2 * N + 1  # the first rank gets one row more
    base = np.arange(rows * 3).reshape(rows, 3) % 3 + 1
    # sums divide by N exactly, also in integers, and fit in int8 up to 4 ranks (3 x 4 x 10 = 120)
    x = tf.cast(tf.constant(base * N * (R + 1)), dtype)
    got = run(mode, lambda t: hvd.reducescatter(t, op=op, name=f"rs.{mode}.{dtype.name}.{op}"), x)
    full = base * N * sum(range(1, N + 1))
    if op == hvd.Average:
        full = full // N
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    start = sum(counts[:R])
    assert got.dtype == dtype
    np.testing.assert_array_equal(np_of(got), full[start:start + counts[R]])


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_scaling(mode):
    x = tf.ones([2 * N, 2]) * (R + 1)
    got = run(mode, lambda t: hvd.reducescatter(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0,
                                                name=f"rs_scaled.{mode}"), x)
    np.testing.assert_allclose(got.numpy(), np.full([2, 2], 2.0 * sum(range(1, N + 1))))


def test_barrier_and_process_queries():
    hvd.barrier()

    @tf.function
    def graph_barrier():
        hvd.barrier(name="barrier.graph")

    graph_barrier()
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


def test_constant_inputs_run_at_every_call():
    """Collectives of constants inside a tf.function are not constant-folded away: each call runs
    each of them (folded, they would run once, while the graph is optimised, on the ranks that
    fold them)."""
    @tf.function
    def consts():
        x = tf.constant([[1.0, 2.0]] * (2 * N)) * 2.0
        return (hvd.allreduce(x, op=hvd.Sum, name="const.ar"), hvd.allgather(x, name="const.ag"),
                hvd.broadcast(x, 0, name="const.bc"), hvd.alltoall(x, name="const.a2a"),
                hvd.reducescatter(x, op=hvd.Sum, name="const.rs"),
                hvd.grouped_allreduce([x, x], op=hvd.Sum, name="const.gar")[0])

    before = hvd.stats()["requests"]
    for _ in range(3):
        ar, ag, bc, a2a, rs, gar = consts()
    assert hvd.stats()["requests"] - before == 3 * 6
    np.testing.assert_array_equal(ar.numpy(), np.tile([[2.0 * N, 4.0 * N]], (2 * N, 1)))
    np.testing.assert_array_equal(gar.numpy(), ar.numpy())
    assert ag.shape == (2 * N * N, 2) and a2a.shape == (2 * N, 2) and rs.shape == (2, 2)


def test_mpi4py_collectives_alongside_mlsl_tf():
    """mlsl_tf runs over a duplicate of mpi4py's world: the user's own MPI collectives, on the
    main thread, and mlsl_tf's, in flight from another thread at the same time, do not mix."""
    import threading

    from mpi4py import MPI

    results, errors = [], []

    def collectives():
        try:
            for i in range(20):
                x = tf.fill([1000], float(R + i))
                results.append(hvd.allreduce(x, op=hvd.Sum, name=f"beside_mpi4py.{i}").numpy())
        except Exception as e:  # reported below, on the main thread
            errors.append(e)

    t = threading.Thread(target=collectives)
    t.start()
    mine = [MPI.COMM_WORLD.allreduce(R * 100 + i) for i in range(200)]
    t.join(timeout=60)
    assert not t.is_alive() and not errors, errors
    assert mine == [sum(r * 100 + i for r in range(N)) for i in range(200)]
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got, np.full(1000, sum(r + i for r in range(N)), np.float32))


def test_tf1_graph_and_session():
    # A tf.compat.v1 graph run by a Session, unnamed collectives (the node names pair them)
    with tf.Graph().as_default():
        x = tf.constant([1.0 + R, 2.0])
        ops = [hvd.allreduce(x, op=hvd.Sum), hvd.allgather(tf.reshape(x, [1, 2])),
               hvd.broadcast(x, root_rank=N - 1), hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)]
        with tf.compat.v1.Session() as sess:
            for _ in range(2):  # the same nodes run twice
                total, gathered, bcast, grouped = sess.run(ops)
    ranks_sum = N * (N + 1) / 2
    np.testing.assert_array_equal(total, [ranks_sum, 2.0 * N])
    np.testing.assert_array_equal(gathered, [[1.0 + r, 2.0] for r in range(N)])
    np.testing.assert_array_equal(bcast, [float(N), 2.0])
    np.testing.assert_array_equal(grouped[1], [2 * ranks_sum, 4.0 * N])


@pytest.mark.parametrize("mode", MODES)
def test_rank_and_size_ops(mode):
    got = run(mode, lambda: tf.stack([hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op()]))
    assert got.dtype == tf.int32
    assert got.numpy().tolist() == [R, N, hvd.local_rank(), hvd.local_size()]


def test_broadcast_global_variables_in_a_tf1_graph():
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("w", initializer=tf.constant([float(R), 1.0 + R]))
        sync = hvd.broadcast_global_variables(N - 1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(sync)
            assert sess.run(v).tolist() == [float(N - 1), float(N)]
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hvd.broadcast_global_variables(0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.int32], ids=lambda d: d.name)
def test_indexed_slices_sum_and_average(mode, dtype):
    # rank r contributes rows [r] with values 4 * (r + 1): allgathered, then scaled for Average
    def body():
        s = tf.IndexedSlices(tf.fill([1, 2], tf.cast(4 * (R + 1), dtype)), tf.constant([R], tf.int64),
                             dense_shape=tf.constant([N, 2], tf.int64))
        total = hvd.allreduce(s, op=hvd.Sum, name=f"is.sum.{mode}.{dtype.name}")
        mean = hvd.allreduce(s, op=hvd.Average, name=f"is.avg.{mode}.{dtype.name}")
        return total.values, total.indices, mean.values
    values, indices, mean = run(mode, body)
    assert indices.numpy().tolist() == list(range(N))
    assert values.numpy().tolist() == [[4 * (r + 1)] * 2 for r in range(N)]
    # Average divides by the rank count with `/`, as Horovod does: integer values become floats
    assert mean.dtype == (dtype if dtype.is_floating else tf.float64)
    np.testing.assert_allclose(mean.numpy(), [[4 * (r + 1) / N] * 2 for r in range(N)])


def test_indexed_slices_refuse_prescale():
    s = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64), dense_shape=tf.constant([2, 2], tf.int64))
    with pytest.raises(NotImplementedError, match="prescale_factor"):
        hvd.allreduce(s, prescale_factor=2.0)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixes_indexed_slices_and_dense(mode):
    def body():
        s = tf.IndexedSlices(tf.fill([1, 2], float(R + 1)), tf.constant([R], tf.int64),
                             dense_shape=tf.constant([N, 2], tf.int64))
        return hvd.grouped_allreduce([s, tf.fill([3], float(R)), s], op=hvd.Sum, name=f"mixed.{mode}")
    first, dense, last = run(mode, body)
    assert isinstance(first, tf.IndexedSlices) and isinstance(last, tf.IndexedSlices)
    for sl in (first, last):
        assert sl.indices.numpy().tolist() == list(range(N))
        np.testing.assert_array_equal(sl.values.numpy(), [[r + 1.0] * 2 for r in range(N)])
    np.testing.assert_array_equal(dense.numpy(), [sum(range(N))] * 3)
    s = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64))
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        with pytest.raises(NotImplementedError, match="IndexedSlices support only Sum and Average|Adasum"):
            hvd.grouped_allreduce([s, tf.ones([2])], op=op)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather_and_reducescatter(mode):
    def body():
        gathered = hvd.grouped_allgather([tf.fill([R + 1], R), tf.fill([1, 2], float(R))], name=f"gag.{mode}")
        scattered = hvd.grouped_reducescatter([tf.ones([2 * N]), tf.ones([N, 3])], op=hvd.Sum, name=f"grs.{mode}")
        return gathered, scattered
    (g1, g2), (s1, s2) = run(mode, body)
    assert g1.numpy().tolist() == [r for r in range(N) for _ in range(r + 1)]
    assert g2.numpy().tolist() == [[float(r)] * 2 for r in range(N)]
    assert s1.numpy().tolist() == [float(N)] * 2 and s2.numpy().tolist() == [[float(N)] * 3]


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_in_place(mode):
    a, b = tf.Variable([float(R)] * 2), tf.Variable(R)
    values = run(mode, lambda: hvd.broadcast_([a, b], root_rank=N - 1, name=f"bc_.{mode}"))
    assert a.numpy().tolist() == [float(N - 1)] * 2 and int(b.numpy()) == N - 1
    assert [v.numpy().tolist() for v in values] == [[float(N - 1)] * 2, N - 1]


def test_broadcast_object_fn():
    fn = hvd.broadcast_object_fn(root_rank=N - 1, name="bofn")
    assert fn({"rank": R}) == {"rank": N - 1}
