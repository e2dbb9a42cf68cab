"""op=Adasum on N ranks against a numpy implementation of Horovod's tree reduction ((0,1), (2,3)
... then the pair results): allreduce (float16/32/64, eager and tf.function), grouped allreduce
(each tensor combined on its own), scaling, a group, the gradient, DistributedOptimizer and
DistributedGradientTape, and the errors (a non-power-of-two rank count, bf16 wire compression,
integer tensors, ranks disagreeing on the op). At 3 ranks the power-of-two cases check that
every rank gets the clear error instead (Horovod's CPU Adasum runs on 1, 2, 4, 8 ... ranks)."""

import numpy as np
import pytest
import tensorflow as tf

import keras
import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()
POW2 = N & (N - 1) == 0
MODES = ["eager", "graph"]
DTYPES = [np.float16, np.float32, np.float64]
TOL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}


def run(mode, fn, *args):
    return (tf.function(fn) if mode == "graph" else fn)(*args)


def np_combine(a, b, dtype):
    """Horovod's pairwise rule in float64, rounded to dtype."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, aa, bb = a64 @ b64, a64 @ a64, b64 @ b64
    ca = 1.0 - dot / aa * 0.5 if aa != 0 else 1.0
    cb = 1.0 - dot / bb * 0.5 if bb != 0 else 1.0
    return (ca * a.astype(np.float64) + cb * b.astype(np.float64)).astype(dtype)


def np_adasum(values, dtype):
    """The tree over len(values) (a power of two) ranks' arrays."""
    level = [np.asarray(v, dtype) for v in values]
    while len(level) > 1:
        level = [np_combine(level[2 * i], level[2 * i + 1], dtype) for i in range(len(level) // 2)]
    return level[0]


def inputs(shape, dtype, seed, ranks=N):
    """Every rank's input (the same on every rank), both signs so dot products vary."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 2.0, size=shape).astype(dtype) for _ in range(ranks)]


def check_close(got, want, dtype):
    assert got.shape == want.shape
    scale = max(1e-30, float(np.max(np.abs(want.astype(np.float64))))) if want.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64) / scale, want.astype(np.float64) / scale, rtol=0,
                               atol=TOL[dtype])


def check_same_bits_everywhere(result, name):
    """Every rank holds the same bits (gathered as raw bytes)."""
    raw = np.frombuffer(np.ascontiguousarray(result).tobytes(), np.uint8)
    everyone = hvd.allgather(tf.constant(raw[None]), name=name).numpy()
    assert all(np.array_equal(row, everyone[0]) for row in everyone)


def power_of_two_only(fn, count=N):
    """fn() where Adasum runs; elsewhere the clear error, on every rank."""
    if count & (count - 1) == 0:
        return fn()
    with pytest.raises(NotImplementedError, match=rf"power-of-two number of ranks .*has {count}$"):
        fn()
    return None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_matches_numpy_tree(mode, dtype):
    xs = inputs((5, 7), dtype, seed=1)
    got = power_of_two_only(lambda: run(mode, lambda x: hvd.allreduce(x, op=hvd.Adasum), tf.constant(xs[R])))
    if got is None:
        return
    got = got.numpy()
    assert got.dtype == dtype and got.shape == (5, 7)
    check_close(got, np_adasum(xs, dtype), dtype)
    check_same_bits_everywhere(got, f"adasum.bits.{mode}.{np.dtype(dtype).name}")


def test_grouped_allreduce_combines_each_tensor_on_its_own():
    shapes = [(3,), (4, 2), (1,), (0,)]
    per_tensor = [inputs(s, np.float32, seed=10 + i) for i, s in enumerate(shapes)]
    mine = [tf.constant(xs[R]) for xs in per_tensor]
    for mode in MODES:
        got = power_of_two_only(lambda: run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Adasum), *mine))
        if got is None:
            return
        for g, xs in zip(got, per_tensor):
            check_close(g.numpy(), np_adasum(xs, np.float32), np.float32)
    # A fused dot product would differ: one-hot vectors are orthogonal at every level of the
    # tree (the answer is all ones) while a tensor equal on every rank stays itself.
    same = tf.constant([1.0, 2.0, -3.0])
    one_hot = tf.one_hot(R, N)
    a, b = hvd.grouped_allreduce([same, one_hot], op=hvd.Adasum, name="adasum.split")
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0, -3.0])
    np.testing.assert_array_equal(b.numpy(), np.ones(N, np.float32))


def test_prescale_and_postscale_around_the_combination():
    xs = inputs((6,), np.float64, seed=3)
    got = power_of_two_only(lambda: hvd.allreduce(tf.constant(xs[R]), op=hvd.Adasum, prescale_factor=3.0,
                                                  postscale_factor=0.5, name="adasum.scaled"))
    if got is not None:
        check_close(got.numpy(), 0.5 * np_adasum([3.0 * x for x in xs], np.float64), np.float64)


@pytest.fixture(scope="module")
def pair():
    """Ranks 0 and 1 as a group (at 2 ranks that is the world: the global process set)."""
    group = hvd.Group([0, 1]) if N > 2 else hvd.global_process_set
    yield group
    if N > 2:
        hvd.barrier()
        hvd.remove_process_set(group)


def test_in_a_group_of_two(pair):
    xs = inputs((9,), np.float32, seed=4, ranks=2)
    if R < 2:
        for mode in MODES:
            got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Adasum, process_set=pair), tf.constant(xs[R]))
            check_close(got.numpy(), np_adasum(xs, np.float32), np.float32)
    if N == 3:
        # The world of 3 is refused even though the group of 2 works.
        with pytest.raises(NotImplementedError, match="power-of-two number of ranks .*job has 3"):
            hvd.allreduce(tf.constant(xs[0]), op=hvd.Adasum)


def test_ranks_disagreeing_on_the_op_fail_on_every_rank(pair):
    if R < 2:
        with pytest.raises(Exception, match="reduction Adasum on rank 0 vs Sum on rank 1"):
            hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Adasum if R == 0 else hvd.Sum, name="adasum.mixed",
                          process_set=pair)
        # the runtime carries on
        np.testing.assert_array_equal(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, process_set=pair).numpy(), [2.0])


def test_refused_inputs_fail_on_every_rank():
    x = tf.constant([1.0, 2.0])
    for compression in (hvd.Compression.bf16, hvd.Compression.bf16_ef):
        with pytest.raises(ValueError, match="Adasum reduction cannot be combined with"):
            hvd.allreduce(x, op=hvd.Adasum, compression=compression, name="adasum.bf16")
    with pytest.raises(NotImplementedError, match="IndexedSlices support only Sum and Average, not Adasum"):
        hvd.allreduce(tf.IndexedSlices(x, tf.constant([0, 1]), dense_shape=tf.constant([2])), op=hvd.Adasum)
    if POW2:
        with pytest.raises(Exception, match="supports float16, bfloat16, float32 and float64 tensors, not int32"):
            hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum, name="adasum.int")
        # fp16 compression casts around the collective: Adasum of the float16 values
        xs = inputs((4,), np.float32, seed=5)
        got = hvd.allreduce(tf.constant(xs[R]), op=hvd.Adasum, compression=hvd.Compression.fp16, name="adasum.fp16")
        assert got.dtype == tf.float32
        check_close(got.numpy(), np_adasum([x.astype(np.float16) for x in xs], np.float16).astype(np.float32),
                    np.float16)
    else:
        power_of_two_only(lambda: hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum))


@pytest.mark.parametrize("mode", MODES)
def test_gradient_is_the_adasum_of_the_gradients(mode):
    # Horovod's gradient of allreduce(op=Adasum): allreduce(grad, op=Adasum).
    weights = inputs((4,), np.float32, seed=6)
    x = tf.constant(np.ones(4, np.float32))

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = hvd.allreduce(x, op=hvd.Adasum, name="adasum.grad")
            loss = tf.reduce_sum(y * weights[R])
        return tape.gradient(loss, x)

    got = power_of_two_only(lambda: run(mode, grad, x))
    if got is not None:
        check_close(got.numpy(), np_adasum(weights, np.float32), np.float32)


# ---- DistributedOptimizer / DistributedGradientTape -------------------------------------------

LR = 0.1
FEATURES, BATCH, STEPS = 3, 4, 3


def model_and_data():
    tf.keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(2)])
    rng = np.random.default_rng(8)
    data = [(rng.normal(size=(BATCH, FEATURES)).astype(np.float32), rng.normal(size=(BATCH, 2)).astype(np.float32))
            for _ in range(N)]
    return model, data


def loss_fn(model, x, y):
    return tf.reduce_mean(tf.square(model(x) - y))


def reference_weights(model, data):
    """Each step: every rank's gradients on its own batch, Adasum-combined per variable in
    numpy, then plain SGD -- computed in this one process."""
    weights = [w.numpy() for w in model.trainable_variables]
    ref = keras.models.clone_model(model)
    for _ in range(STEPS):
        ref.set_weights(weights)
        per_rank = []
        for x, y in data:
            with tf.GradientTape() as tape:
                loss = loss_fn(ref, x, y)
            per_rank.append([g.numpy() for g in tape.gradient(loss, ref.trainable_variables)])
        combined = [np_adasum([g[i] for g in per_rank], np.float32) for i in range(len(weights))]
        weights = [w - LR * g for w, g in zip(weights, combined)]
    return weights


def check_trained(model, data, start):
    ref = keras.models.clone_model(model)
    ref.set_weights(start)
    want = reference_weights(ref, data)
    for got, w in zip(model.trainable_variables, want):
        check_close(got.numpy(), w, np.float32)
        check_same_bits_everywhere(got.numpy(), f"adasum.weights.{got.name}")


@pytest.mark.parametrize("mode", MODES)
def test_distributed_optimizer_trains_like_numpy(mode):
    model, data = model_and_data()
    start = [w.numpy() for w in model.trainable_variables]
    opt = power_of_two_only(lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Adasum,
                                                             name=f"adasum.opt.{mode}"))
    if opt is None:
        return
    x, y = (tf.constant(a) for a in data[R])

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step_fn = tf.function(step) if mode == "graph" else step
    for _ in range(STEPS):
        step_fn(x, y)
    check_trained(model, data, start)


def test_distributed_gradient_tape_and_refused_options():
    model, data = model_and_data()
    start = [w.numpy() for w in model.trainable_variables]
    opt = keras.optimizers.SGD(LR)
    x, y = (tf.constant(a) for a in data[R])

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    if power_of_two_only(lambda: [step() for _ in range(STEPS)]) is not None:
        check_trained(model, data, start)
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Adasum, backward_passes_per_step=2,
                                 average_aggregated_gradients=True)


def test_basics_horovod_names():
    assert hvd.gpu_available("tensorflow") is False
    assert hvd.gpu_available("tensorflow", verbose=True) is False
    homogeneous = hvd.is_homogeneous()
    assert isinstance(homogeneous, bool)
    # every rank agrees, and it says whether every machine has the same number of ranks
    sizes = hvd.allgather(tf.constant([[hvd.local_size(), int(homogeneous)]]), name="adasum.homog").numpy()
    assert (sizes[:, 1] == sizes[0, 1]).all()
    assert homogeneous == (sizes[:, 0].min() == sizes[:, 0].max())
