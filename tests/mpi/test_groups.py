"""Groups on N ranks (2, 3 and 4; the 2x2 layout cases need exactly 4): group collectives, two
disjoint groups at once, collective creation errors, non-members, the model-parallel ops'
gradients against a single-process reference, and a hybrid model-parallel x data-parallel
model against the same model trained in one process on the same global batch.

The reference computations run inside every rank with plain TensorFlow / Keras on the full
data, so each rank checks its own shard of the answer."""

import re

import numpy as np
import pytest
import tensorflow as tf

import keras
import mlsl_tf as hvd
from mlsl_tf import parallel
from mlsl_tf.keras.layers import ColumnParallelDense, RowParallelDense, replicated_group, sharded_group

R, N = hvd.rank(), hvd.size()
MODES = ["eager", "graph"]
only_4 = pytest.mark.skipif(N != 4, reason="the 2x2 layout needs exactly 4 ranks")
K_GRID = 2 if N % 2 == 0 else N  # model-parallel size for the grid tests on any N


@pytest.fixture(scope="module")
def groups():
    """Made once, in the same order on every rank: even and odd ranks, then the grid."""
    even = hvd.Group(range(0, N, 2))
    odd = hvd.Group(range(1, N, 2))
    mp, dp = hvd.groups.grid(model_parallel=K_GRID)
    return {"world": None, "even": even, "odd": odd, "mp": mp, "dp": dp}


def run(mode, fn, *args):
    return (tf.function(fn) if mode == "graph" else fn)(*args)


def members(group):
    return list(range(N)) if group is None else group.ranks


# ---- the group object ------------------------------------------------------------------

# These two come first: they need rank sets that no group has yet (on 2 ranks the fixture
# below takes every one), and groups with the same ranks as a registered one are refused.

def test_creating_groups_in_different_orders_fails_on_every_rank():
    first, second = [0], [N - 1]
    order = (first, second) if R % 2 == 0 else (second, first)
    for ranks, (on0, on1) in zip(order, [(first, second), (second, first)]):
        # every rank learns what rank 0 and the first rank that disagrees asked for
        with pytest.raises(ValueError, match=rf"creating the group of ranks \[\d\] failed: .*same order.*"
                                             rf"group ranks \[{on0[0]}\] on rank 0 vs \[{on1[0]}\] on rank 1"):
            hvd.Group(ranks)
    # the runtime is still usable
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after.mismatch")) == N


def test_add_and_remove_process_set_horovod_names():
    ranks = [N - 1, 0] if N > 2 else [1]
    ps = hvd.ProcessSet(ranks)
    assert ps.ranks == sorted(ranks) and ps.process_set_id is None and ps.size() is None
    assert hvd.add_process_set(ps) is ps and ps.process_set_id >= 1
    if ps.included():
        total = hvd.allreduce(tf.constant(float(R)), op=hvd.Sum, process_set=ps, name="horovod_names")
        assert float(total) == float(sum(ps.ranks))
    assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(tf.constant(1.0), process_set=ps)
    assert hvd.remove_process_set(hvd.global_process_set) is False


def test_group_attributes(groups):
    even, odd = groups["even"], groups["odd"]
    assert even.ranks == list(range(0, N, 2)) and odd.ranks == list(range(1, N, 2))
    assert even.process_set_id >= 1 and odd.process_set_id >= 1 and even.process_set_id != odd.process_set_id
    assert even.size() == len(even.ranks)
    mine, other = (even, odd) if R % 2 == 0 else (odd, even)
    assert mine.included() and not other.included()
    assert mine.rank() == R // 2
    with pytest.raises(ValueError, match=f"rank {R} is not a member"):
        other.rank()
    assert hvd.global_process_set.ranks == list(range(N)) and hvd.global_process_set.rank() == R
    assert hvd.process_set_by_id(even.process_set_id) is even
    assert [g.process_set_id for g in hvd.process_sets()][:1] == [0]


def test_bad_ranks_are_rejected_on_every_rank():
    with pytest.raises(ValueError, match="is out of range"):
        hvd.Group([0, N])
    with pytest.raises(ValueError, match="more than once"):
        hvd.Group([0, 0])
    with pytest.raises(ValueError, match="must be ints"):
        hvd.Group([0, "1"])
    with pytest.raises(ValueError, match="at least one rank"):
        hvd.Group([])


def test_grid_layout(groups):
    mp, dp = groups["mp"], groups["dp"]
    start = R - R % K_GRID
    assert mp.ranks == list(range(start, start + K_GRID))
    assert dp.ranks == list(range(R % K_GRID, N, K_GRID))
    assert mp.rank() == R % K_GRID and dp.rank() == R // K_GRID
    assert hvd.groups.data_parallel_group_of(mp) is dp


@only_4
def test_grid_2x2(groups):
    mp, dp = groups["mp"], groups["dp"]
    assert mp.ranks == [[0, 1], [0, 1], [2, 3], [2, 3]][R]
    assert dp.ranks == [[0, 2], [1, 3], [0, 2], [1, 3]][R]


def test_grid_size_must_divide():
    with pytest.raises(ValueError, match=f"world size {N} is not a multiple of model_parallel={N + 1}"):
        hvd.groups.grid(model_parallel=N + 1)
    with pytest.raises(ValueError, match="positive int"):
        hvd.groups.grid(model_parallel=0)


# ---- collectives on groups -------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["even", "odd", "mp", "dp"])
def test_group_collectives(groups, kind, mode):
    g = groups[kind]
    if not g.included():
        return
    ranks, k, me = g.ranks, g.size(), g.rank()

    def body():
        x = tf.constant([1.0, 2.0]) * (R + 1)
        return (hvd.allreduce(x, op=hvd.Sum, group=g, name=f"c.ar.{kind}"),
                hvd.allreduce(x, op=hvd.Average, process_set=g, name=f"c.avg.{kind}"),
                hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, group=g, name=f"c.gar.{kind}"),
                hvd.allgather(tf.fill([me + 1, 2], float(R)), group=g, name=f"c.ag.{kind}"),
                hvd.broadcast(tf.constant([float(R)] * 3), root_rank=ranks[-1], group=g, name=f"c.bc.{kind}"),
                hvd.alltoall(tf.reshape(tf.range(2 * k, dtype=tf.float32), [k, 2]) + 100 * R, group=g,
                             name=f"c.a2a.{kind}"),
                hvd.reducescatter(tf.ones([2 * k, 3]) * (R + 1), op=hvd.Sum, group=g, name=f"c.rs.{kind}"))

    ar, avg, (gar1, gar2), ag, bc, a2a, rs = run(mode, body)
    s = sum(r + 1 for r in ranks)
    np.testing.assert_allclose(ar.numpy(), [s, 2 * s])
    np.testing.assert_allclose(avg.numpy(), [s / k, 2 * s / k], rtol=1e-6)
    np.testing.assert_allclose(gar2.numpy(), [2 * s, 4 * s])
    np.testing.assert_allclose(ag.numpy(), np.concatenate([np.full([i + 1, 2], float(r)) for i, r in enumerate(ranks)]))
    np.testing.assert_allclose(bc.numpy(), [float(ranks[-1])] * 3)  # root_rank: a world rank
    np.testing.assert_allclose(a2a.numpy(), [[2 * me + 100 * r, 2 * me + 1 + 100 * r] for r in ranks])
    np.testing.assert_allclose(rs.numpy(), np.full([2, 3], s))
    hvd.barrier(group=g)


@pytest.mark.parametrize("mode", MODES)
def test_disjoint_groups_same_names_do_not_mix(groups, mode):
    """Even and odd ranks reduce different data under the same names at the same time."""
    g = groups["even"] if R % 2 == 0 else groups["odd"]

    def body():
        outs = []
        for i in range(4):
            outs.append(hvd.allreduce(tf.fill([1000], float(R * 10 + i)), op=hvd.Sum, group=g, name=f"same.{i}"))
        return outs

    outs = run(mode, body)
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), np.full([1000], sum(r * 10 + i for r in g.ranks)))


@only_4
@pytest.mark.parametrize("mode", MODES)
def test_pairs_01_and_23_same_names_do_not_mix(groups, mode):
    mp = groups["mp"]  # {0,1} and {2,3}

    def body():
        return hvd.allreduce(tf.fill([4096], float(R * R)), op=hvd.Sum, group=mp, name="pairs.same")

    np.testing.assert_allclose(run(mode, body).numpy(), np.full([4096], sum(r * r for r in mp.ranks)))


def test_a_ranks_two_groups_in_one_function(groups):
    """A rank's model- and data-parallel collectives, independent of each other in one graph,
    in the opposite Python order on odd ranks: they must not wait for each other."""
    mp, dp = groups["mp"], groups["dp"]

    @tf.function
    def body():
        a = lambda: hvd.allreduce(tf.fill([64], float(R)), op=hvd.Sum, group=mp, name="two.mp")  # noqa: E731
        b = lambda: hvd.allreduce(tf.fill([64], float(R)), op=hvd.Sum, group=dp, name="two.dp")  # noqa: E731
        if R % 2:
            y, x = b(), a()
        else:
            x, y = a(), b()
        return x, y

    x, y = body()
    np.testing.assert_allclose(x.numpy(), np.full([64], float(sum(mp.ranks))))
    np.testing.assert_allclose(y.numpy(), np.full([64], float(sum(dp.ranks))))


# ---- errors ----------------------------------------------------------------------------

def test_non_member_gets_a_clear_error(groups):
    g = groups["even"]
    if g.included():
        return
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"rank {R} is not a member of group {g.process_set_id} .*'foreign'"):
        hvd.allreduce(tf.constant([1.0]), group=g, name="foreign")
    with pytest.raises(ValueError, match=f"all_gather: rank {R} is not a member"):
        parallel.all_gather(tf.ones([2]), group=g)


# ---- model-parallel ops: gradients against a single-process reference ------------------

def shard_data(group, shape, salt):
    """Member i's input and loss weights, and everyone's (for the reference)."""
    ranks = members(group)
    xs = [np.random.default_rng([salt, ranks[0], i]).normal(size=shape).astype(np.float32) for i in range(len(ranks))]
    return xs


def loss_weights(group, shape, salt):
    ranks = members(group)
    return [np.random.default_rng([salt + 1, ranks[0], i]).normal(size=shape).astype(np.float32)
            for i in range(len(ranks))]


def sharded_grad(mode, fn, x, c):
    """(y, dL/dx) on this rank, L = sum(sin(fn(x)) * c)."""
    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            loss = tf.reduce_sum(tf.sin(y) * c)
        return y, tape.gradient(loss, x)
    return run(mode, body, tf.constant(x))


def reference_grads(xs, outputs_fn, cs):
    """The single-process objective sum_i sum(sin(out_i) * c_i) over the full data, with
    outputs_fn(xs) -> every member's output; returns the outputs and d/dx_i."""
    xs = [tf.constant(x) for x in xs]
    with tf.GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        outs = outputs_fn(xs)
        total = tf.add_n([tf.reduce_sum(tf.sin(o) * c) for o, c in zip(outs, cs)])
    grads = tape.gradient(total, xs, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [o.numpy() for o in outs], [g.numpy() for g in grads]


GRAD_GROUPS = ["world", "even", "mp"]


def check(group, y, g, ref_outs, ref_grads):
    me = R if group is None else group.rank()
    np.testing.assert_allclose(y.numpy(), ref_outs[me], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.numpy(), ref_grads[me], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRAD_GROUPS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather_gradient(groups, kind, axis, mode):
    g = groups[kind]
    if g is not None and not g.included():
        return
    k = len(members(g))
    shape = (2, 3, 4)
    out_shape = list(shape)
    out_shape[axis] *= k
    xs, cs = shard_data(g, shape, 1), loss_weights(g, out_shape, 1)
    me = R if g is None else g.rank()
    y, grad = sharded_grad(mode, lambda x: parallel.all_gather(x, axis=axis, group=g), xs[me], cs[me])
    ref = reference_grads(xs, lambda xs: [tf.concat(xs, axis=axis)] * k, cs)
    check(g, y, grad, *ref)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRAD_GROUPS)
@pytest.mark.parametrize("axis,op", [(0, hvd.Sum), (1, hvd.Sum), (2, hvd.Average)])
def test_reduce_scatter_gradient(groups, kind, axis, op, mode):
    g = groups[kind]
    if g is not None and not g.included():
        return
    k = len(members(g))
    shape = [2, 3, 4]
    shape[axis] = 2 * k
    out_shape = list(shape)
    out_shape[axis] = 2
    xs, cs = shard_data(g, shape, 2), loss_weights(g, out_shape, 2)
    me = R if g is None else g.rank()
    y, grad = sharded_grad(mode, lambda x: parallel.reduce_scatter(x, axis=axis, group=g, op=op), xs[me], cs[me])

    def outs(xs):
        total = tf.add_n(xs) / (k if op == hvd.Average else 1)
        return tf.split(total, k, axis=axis)

    check(g, y, grad, *reference_grads(xs, outs, cs))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRAD_GROUPS)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_all_reduce_gradient(groups, kind, op, mode):
    g = groups[kind]
    if g is not None and not g.included():
        return
    k = len(members(g))
    xs, cs = shard_data(g, (3, 5), 3), loss_weights(g, (3, 5), 3)
    me = R if g is None else g.rank()
    y, grad = sharded_grad(mode, lambda x: parallel.all_reduce(x, group=g, op=op), xs[me], cs[me])
    ref = reference_grads(xs, lambda xs: [tf.add_n(xs) / (k if op == hvd.Average else 1)] * k, cs)
    check(g, y, grad, *ref)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRAD_GROUPS)
@pytest.mark.parametrize("split_axis,concat_axis", [(0, 0), (0, 1), (2, 0), (1, 2)])
def test_all_to_all_gradient(groups, kind, split_axis, concat_axis, mode):
    g = groups[kind]
    if g is not None and not g.included():
        return
    k = len(members(g))
    shape = [3, 4, 5]
    shape[split_axis] = 2 * k
    out_shape = list(shape)
    out_shape[split_axis] //= k
    out_shape[concat_axis] *= k
    xs, cs = shard_data(g, shape, 4), loss_weights(g, out_shape, 4)
    me = R if g is None else g.rank()
    y, grad = sharded_grad(mode, lambda x: parallel.all_to_all(x, split_axis, concat_axis, group=g), xs[me], cs[me])

    def outs(xs):
        blocks = [tf.split(x, k, axis=split_axis) for x in xs]  # blocks[j][i]: what j sends to i
        return [tf.concat([blocks[j][i] for j in range(k)], axis=concat_axis) for i in range(k)]

    check(g, y, grad, *reference_grads(xs, outs, cs))


# The ops' own registered gradients (hvd.allgather & co. with group=), same objective.

def _core_case(op, k, me):
    """(this member's input shape, loss-weight shape, sharded fn, reference fn) for op."""
    if op == "allgather":  # member i has i + 1 rows
        return ((me + 1, 3), (k * (k + 1) // 2, 3), lambda x, g: hvd.allgather(x, group=g),
                lambda xs: [tf.concat(xs, 0)] * k)
    if op == "broadcast":  # root: the last member
        return ((2, 3), (2, 3), lambda x, g: hvd.broadcast(x, root_rank=g.ranks[-1], group=g), lambda xs: [xs[-1]] * k)
    if op in ("allreduce_sum", "allreduce_avg"):
        avg = op == "allreduce_avg"
        return ((2, 3), (2, 3), lambda x, g: hvd.allreduce(x, op=hvd.Average if avg else hvd.Sum, group=g),
                lambda xs: [tf.add_n(xs) / (k if avg else 1)] * k)
    if op in ("reducescatter_sum", "reducescatter_avg"):
        avg = op == "reducescatter_avg"
        return ((2 * k, 3), (2, 3), lambda x, g: hvd.reducescatter(x, op=hvd.Average if avg else hvd.Sum, group=g),
                lambda xs: tf.split(tf.add_n(xs) / (k if avg else 1), k))
    if op == "alltoall":
        return ((2 * k, 3), (2 * k, 3), lambda x, g: hvd.alltoall(x, group=g),
                lambda xs: [tf.concat([tf.split(x, k)[i] for x in xs], 0) for i in range(k)])
    raise AssertionError(op)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["even", "odd", "mp", "dp"])
@pytest.mark.parametrize("op", ["allgather", "broadcast", "allreduce_sum", "allreduce_avg", "reducescatter_sum",
                                "reducescatter_avg", "alltoall"])
def test_core_op_gradients_on_groups(groups, kind, op, mode):
    g = groups[kind]
    if not g.included():
        return
    k, me = g.size(), g.rank()
    shapes = [_core_case(op, k, i)[0] for i in range(k)]
    _, c_shape, fn, ref_fn = _core_case(op, k, me)
    xs = [np.random.default_rng([9, g.ranks[0], i]).normal(size=shape).astype(np.float32)
          for i, shape in enumerate(shapes)]
    cs = loss_weights(g, c_shape, 9)
    y, grad = sharded_grad(mode, lambda x: fn(x, g), xs[me], cs[me])
    ref_outs, ref_grads = reference_grads(xs, ref_fn, cs)
    if op in ("allgather", "broadcast"):  # Horovod's gradients: of the mean of the members' losses
        ref_grads = [r / k for r in ref_grads]
    check(g, y, grad, ref_outs, ref_grads)


def test_all_to_all_needs_a_divisible_axis(groups):
    k = N
    with pytest.raises(ValueError, match=f"all_to_all: size {2 * k + 1} of axis 0 is not divisible"):
        parallel.all_to_all(tf.ones([2 * k + 1, 2]), 0, 1)


# Megatron's region ops: the loss is replicated in the group; each member's gradient must be
# that one loss's gradient with respect to its own part.

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRAD_GROUPS)
def test_copy_and_reduce_region_gradients(groups, kind, mode):
    """L = sum(sin(sum_i x @ w_i)): x replicated, w_i member i's; f at the entry, g at the exit."""
    g = groups[kind]
    if g is not None and not g.included():
        return
    me = R if g is None else g.rank()
    x = shard_data(g, (4, 3), 5)[0]  # the same on every member
    ws = shard_data(g, (3, 2), 6)

    def body(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = parallel.reduce_from_group(tf.matmul(parallel.copy_to_group(x, group=g), w), group=g)
            loss = tf.reduce_sum(tf.sin(y))
        return (loss,) + tuple(tape.gradient(loss, [x, w]))

    loss, gx, gw = run(mode, body, tf.constant(x), tf.constant(ws[me]))
    xt, wts = tf.constant(x), [tf.constant(w) for w in ws]
    with tf.GradientTape() as tape:
        tape.watch([xt] + wts)
        ref_loss = tf.reduce_sum(tf.sin(tf.add_n([tf.matmul(xt, w) for w in wts])))
    ref = tape.gradient(ref_loss, [xt] + wts)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(gx.numpy(), ref[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.numpy(), ref[1 + me].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRAD_GROUPS)
def test_scatter_and_gather_region_gradients(groups, kind, mode):
    """L = sum(sin(concat_i(block_i(x) * v_i)) * c): x replicated, split over the members
    along the last axis, scaled by member i's v_i, gathered back; c replicated."""
    g = groups[kind]
    if g is not None and not g.included():
        return
    k = len(members(g))
    me = R if g is None else g.rank()
    x = shard_data(g, (3, 2 * k), 7)[0]
    vs = shard_data(g, (3, 2), 8)
    c = loss_weights(g, (3, 2 * k), 8)[0]

    def body(x, v):
        with tf.GradientTape() as tape:
            tape.watch([x, v])
            y = parallel.gather_from_group(parallel.scatter_to_group(x, axis=-1, group=g) * v, axis=-1, group=g)
            loss = tf.reduce_sum(tf.sin(y) * c)
        return (y,) + tuple(tape.gradient(loss, [x, v]))

    y, gx, gv = run(mode, body, tf.constant(x), tf.constant(vs[me]))
    xt, vts = tf.constant(x), [tf.constant(v) for v in vs]
    with tf.GradientTape() as tape:
        tape.watch([xt] + vts)
        ref_y = tf.concat([b * v for b, v in zip(tf.split(xt, k, axis=-1), vts)], axis=-1)
        ref_loss = tf.reduce_sum(tf.sin(ref_y) * c)
    ref = tape.gradient(ref_loss, [xt] + vts)
    np.testing.assert_allclose(y.numpy(), ref_y.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx.numpy(), ref[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gv.numpy(), ref[1 + me].numpy(), rtol=1e-5, atol=1e-5)


# ---- hybrid model: model parallel x data parallel vs one process ------------------------

D_IN, BATCH, STEPS, LR = 6, 8, 3, 0.05


def reference_model(seed):
    init = lambda s: keras.initializers.GlorotUniform(seed=seed + s)  # noqa: E731
    return keras.Sequential([
        keras.Input((D_IN,)),
        keras.layers.Dense(8, activation="relu", kernel_initializer=init(0), bias_initializer="ones"),
        keras.layers.Dense(4 * K_GRID, activation="relu", kernel_initializer=init(1), bias_initializer="ones"),
        keras.layers.Dense(2 * K_GRID, activation="tanh", kernel_initializer=init(2), bias_initializer="ones"),
        keras.layers.Dense(6, kernel_initializer=init(3), bias_initializer="ones"),
        keras.layers.Dense(2 * K_GRID, kernel_initializer=init(4), bias_initializer="ones"),
    ])


def hybrid_model(seed, mp):
    """The same model: a replicated Dense, the Column->Row block, a Row on a full input and a
    gathering Column. The parallel layers get the reference's seeded initializers."""
    init = lambda s: keras.initializers.GlorotUniform(seed=seed + s)  # noqa: E731
    return keras.Sequential([
        keras.Input((D_IN,)),
        keras.layers.Dense(8, activation="relu", kernel_initializer=init(0), bias_initializer="ones"),
        ColumnParallelDense(4 * K_GRID, group=mp, gather_output=False, activation="relu", kernel_initializer=init(1),
                            bias_initializer="ones"),
        RowParallelDense(2 * K_GRID, group=mp, input_is_parallel=True, activation="tanh", kernel_initializer=init(2),
                         bias_initializer="ones"),
        RowParallelDense(6, group=mp, input_is_parallel=False, kernel_initializer=init(3), bias_initializer="ones"),
        ColumnParallelDense(2 * K_GRID, group=mp, gather_output=True, kernel_initializer=init(4),
                            bias_initializer="ones"),
    ])


def expected_shards(ref, mp):
    """Each reference weight as this rank holds it: (kernel axis or bias axis split, or whole)."""
    k, r = mp.size(), mp.rank()
    split = [None, 1, 0, 0, 1]  # per layer: the kernel's split axis (None: replicated layer)
    out = []
    for layer, axis in zip(ref.layers, split):
        kernel, bias = [w.numpy() for w in layer.weights]
        if axis is None:
            out += [kernel, bias]
        elif axis == 1:
            out += [np.split(kernel, k, axis=1)[r], np.split(bias, k)[r]]
        else:
            out += [np.split(kernel, k, axis=0)[r], bias]
    return out


def global_data(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(STEPS * BATCH, D_IN)).astype(np.float32)
    y = rng.normal(size=(STEPS * BATCH, 2 * K_GRID)).astype(np.float32)
    return x, y


def replica_rows(dp):
    """The rows of every global batch this data-parallel replica trains on."""
    b = BATCH // dp.size()
    return np.concatenate([np.arange(t * BATCH + dp.rank() * b, t * BATCH + (dp.rank() + 1) * b)
                           for t in range(STEPS)])


def assert_weights_match(model, ref, mp):
    for got, want in zip(model.weights, expected_shards(ref, mp)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=got.path)


def test_hybrid_model_starts_from_the_reference_weights(groups):
    mp = groups["mp"]
    assert_weights_match(hybrid_model(10, mp), reference_model(10), mp)


def test_hybrid_variables_are_marked(groups):
    mp = groups["mp"]
    model = hybrid_model(10, mp)
    sharded = [v.path for v in model.weights if sharded_group(v) is mp]
    replicated = [v.path for v in model.weights if replicated_group(v) is mp]
    assert len(sharded) == 6 and len(replicated) == 2  # 4 kernels and 2 column biases; 2 row biases
    assert all(sharded_group(v) is None and replicated_group(v) is None for v in model.layers[0].weights)


def test_broadcast_root_is_a_world_rank(groups):
    """As in Horovod, root_rank names a world rank also with a group (here the odd ranks, whose
    first member is world rank 1), for broadcast and broadcast_object alike."""
    odd = groups["odd"]
    if odd.included():
        root = odd.ranks[-1]
        got = hvd.broadcast(tf.fill([2], float(R)), root_rank=root, process_set=odd, name="odd.bc")
        np.testing.assert_array_equal(got.numpy(), [float(root)] * 2)
        obj = hvd.broadcast_object({"from": R}, root_rank=root, process_set=odd, name="odd.obj")
        assert obj == {"from": root}
    g = odd if odd.included() else groups["even"]
    outsider = groups["even"].ranks[0] if g is odd else odd.ranks[0]
    with pytest.raises(ValueError, match=re.escape(f"root_rank {outsider} is not a member of the group {g.ranks}")):
        hvd.broadcast(tf.ones([2]), root_rank=outsider, group=g)


def test_broadcast_variables_keeps_shards_apart(groups):
    """A world broadcast from rank 0 gives every rank rank 0's replica of *its own* shard."""
    mp = groups["mp"]
    model = hybrid_model(30, mp)
    if R >= mp.size():  # not in rank 0's replica: start from different weights
        for w in model.weights:
            w.assign(w + float(R + 1))
    hvd.broadcast_variables(model.weights, root_rank=0)
    assert_weights_match(model, reference_model(30), mp)
    if N != 4:
        return  # below: every rank needs a two-member group that grid() did not make
    with pytest.raises(ValueError, match="sharded over group"):
        lone = ColumnParallelDense(2 * K_GRID, group=groups["even"] if R % 2 == 0 else groups["odd"])
        lone.build((None, 3))
        hvd.broadcast_variables(lone.weights, root_rank=0)


def test_hybrid_fit_matches_single_process(groups):
    mp, dp = groups["mp"], groups["dp"]
    x, y = global_data(20)
    ref = reference_model(30)
    ref.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.5), loss="mse")
    ref_loss = ref.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history["loss"][0]

    model = hybrid_model(30, mp)
    model.compile(optimizer=hvd.keras.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.5), group=dp),
                  loss="mse")
    rows = replica_rows(dp)
    loss = model.fit(x[rows], y[rows], batch_size=BATCH // dp.size(), epochs=1, shuffle=False,
                     verbose=0).history["loss"][0]
    mean_loss = float(hvd.allreduce(tf.constant(loss), op=hvd.Average, group=dp, name="fit.loss"))
    np.testing.assert_allclose(mean_loss, ref_loss, rtol=1e-5)
    assert_weights_match(model, ref, mp)


@pytest.mark.parametrize("mode", MODES)
def test_hybrid_custom_loop_matches_single_process(groups, mode):
    mp, dp = groups["mp"], groups["dp"]
    x, y = global_data(21)
    ref, model = reference_model(40), hybrid_model(40, mp)
    ref_opt, opt = keras.optimizers.SGD(LR), keras.optimizers.SGD(LR)
    mse = keras.losses.MeanSquaredError()

    def ref_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mse(yb, ref(xb))
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
        return loss

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mse(yb, model(xb))
        tape = hvd.keras.DistributedGradientTape(tape, group=dp)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return hvd.allreduce(loss, op=hvd.Average, group=dp, name="loop.loss")

    step = tf.function(step) if mode == "graph" else step
    b = BATCH // dp.size()
    for t in range(STEPS):
        want = float(ref_step(x[t * BATCH:(t + 1) * BATCH], y[t * BATCH:(t + 1) * BATCH]))
        lo = t * BATCH + dp.rank() * b
        got = float(step(tf.constant(x[lo:lo + b]), tf.constant(y[lo:lo + b])))
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"step {t}")
    assert_weights_match(model, ref, mp)


def test_reducing_sharded_gradients_over_the_world_is_an_error(groups):
    mp = groups["mp"]
    model = hybrid_model(50, mp)
    x, y = global_data(22)
    opt = hvd.keras.DistributedOptimizer(keras.optimizers.SGD(LR))  # no group=: the world
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y[:4], model(x[:4]))
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(ValueError, match="sharded over the model-parallel group .* data-parallel group"):
        opt.apply_gradients(zip(grads, model.trainable_variables))


# ---- last: shutdown forgets the groups ---------------------------------------------------

def test_groups_are_gone_after_shutdown_and_init(groups):
    even = groups["even"]
    # A rank's shutdown fails every collective still pending on any rank, also in groups it is
    # not a member of: let every group finish first.
    hvd.barrier()
    hvd.shutdown()
    hvd.init()
    assert even.process_set_id is None
    assert hvd.process_sets() == [hvd.global_process_set]
    again = hvd.Group(range(0, N, 2))  # the same ranks again: a new group of the new runtime
    assert again.process_set_id >= 1
    if again.included():
        total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum, group=again, name="after.reinit")
        assert float(total) == again.size()
    assert hvd.remove_process_set(again)


def test_a_group_bad_on_one_rank_only_is_refused_on_every_rank():
    """The last rank asks for a rank outside the world, the others for group [0]: every rank
    gets the error naming that rank (no rank waits in the creation for another), and the job
    goes on."""
    ranks = [0, N + 5] if R == N - 1 else [0]
    with pytest.raises(ValueError, match=f"rank {N - 1}: group rank {N + 5} is out of range"):
        hvd.add_process_set(ranks)
    assert hvd.allreduce(tf.ones([2]), name="groups.after_bad_one", op=hvd.Sum).numpy().tolist() == [N, N]


def test_removing_different_sets_is_refused_on_every_rank():
    """Rank 0 removes one set, the others another: refused on every rank naming both ids (the
    core used to remove rank 0's choice everywhere); both sets stay usable, then go."""
    first, second = hvd.add_process_set([0]), hvd.add_process_set([N - 1])
    mine = first if R == 0 else second
    with pytest.raises(ValueError, match=f"group id {first.process_set_id} on rank 0 vs {second.process_set_id}"):
        hvd.remove_process_set(mine)
    for ps in (first, second):
        if ps.included():
            out = hvd.allreduce(tf.ones([1]), op=hvd.Sum, process_set=ps, name=f"groups.still.{ps.process_set_id}")
            assert out.numpy().tolist() == [ps.size()]
    assert hvd.remove_process_set(first) and hvd.remove_process_set(second)
