"""bf16 collectives on N ranks (run under -n 2, 3 and 4).

The scheme (ops/core/wire.h): each rank's float32 input is rounded once to bfloat16, the
slices are exchanged all-to-all, summed in float32 in rank order, rounded once to bfloat16 and
allgathered. So the result is exactly emulable here, and its error bound does not depend on
the number of ranks N:

    |y - s| <= u * sum_r |x_r| + u * |s_hat| + (N - 1) * 2^-24 * sum_r |x_r|     (u = 2^-8)
            <= (2u + u^2 + N 2^-24) * sum_r |x_r|

where s is the exact sum and s_hat the float32 sum of the rounded inputs. A per-hop scheme
(a ring or tree reduction of bfloat16 data) rounds every partial sum and gets (N - 1 + 1) u.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

N, R = hvd.size(), hvd.rank()
U = 2.0 ** -8


def bf16_round(a):
    """float32 -> bfloat16 -> float32 with round-to-nearest-even, in numpy (no NaN inputs here)."""
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def data(seed, n=300_000):
    """Every rank's input (so each rank can compute the reference); heavy-tailed magnitudes."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 2)).astype(np.float32) for _ in range(N)]


def emulate(xs, factor=1.0):
    """The float32 sum of the rounded inputs in rank order, times factor (an average's 1/N, a
    postscale) in float32, rounded once."""
    acc = bf16_round(xs[0]).copy()
    for x in xs[1:]:
        acc = (acc + bf16_round(x)).astype(np.float32)
    if factor != 1.0:
        acc = (acc.astype(np.float64) * factor).astype(np.float32)
    return bf16_round(acc)


def test_numpy_rounding_matches_tensorflow_cast():
    x = data(1)[0]
    want = tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()
    np.testing.assert_array_equal(bf16_round(x), want)


@pytest.mark.parametrize("graph", [False, True])
def test_bf16_allreduce_is_exactly_two_roundings(graph):
    xs = data(2)  # 1.2 MB: more than one chunk
    fn = lambda t: hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.bf16, name=f"bf16_sum_{graph}")
    if graph:
        fn = tf.function(fn)
    y = fn(tf.constant(xs[R])).numpy()
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.view(np.uint32), emulate(xs).view(np.uint32))


def test_bf16_error_bound_does_not_depend_on_rank_count():
    xs = data(3)
    y = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, compression=hvd.Compression.bf16, name="bound").numpy()
    exact = np.sum(np.array(xs, np.float64), axis=0)
    scale = np.sum(np.abs(np.array(xs, np.float64)), axis=0)
    err = np.abs(y.astype(np.float64) - exact) / scale
    bound = 2 * U + U * U + N * 2.0 ** -24
    assert err.max() <= bound, (err.max(), bound)
    # Per-hop rounding (bfloat16 tensors reduced by MPI, rounding every partial sum) for comparison:
    hop = tf.cast(hvd.allreduce(tf.cast(xs[R], tf.bfloat16), op=hvd.Sum, name="perhop"), tf.float32).numpy()
    hop_err = np.abs(hop.astype(np.float64) - exact) / scale
    assert np.mean(err) <= np.mean(hop_err) * 1.05


def test_bf16_average_and_scaling_divide_in_float32_before_the_last_rounding():
    xs = data(4, 5000)
    y = hvd.allreduce(tf.constant(xs[R]), op=hvd.Average, compression=hvd.Compression.bf16, name="bf16_avg",
                      postscale_factor=2.0).numpy()
    np.testing.assert_array_equal(y.view(np.uint32), emulate(xs, 2.0 / N).view(np.uint32))


def test_bf16_grouped_allreduce_and_fusion():
    xs = [data(10 + k, 1000 + k) for k in range(5)]
    outs = hvd.grouped_allreduce([tf.constant(x[R]) for x in xs], op=hvd.Sum, compression=hvd.Compression.bf16,
                                 name="bf16_grouped")
    for x, y in zip(xs, outs):
        np.testing.assert_array_equal(y.numpy(), emulate(x))


def test_bf16_leaves_other_dtypes_alone():
    x = tf.constant([R + 1, 2**20 + 1], tf.int32)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16, name="bf16_int").numpy()
    np.testing.assert_array_equal(y, [N * (N + 1) // 2, N * (2**20 + 1)])



def test_bf16_compresses_float64_through_float32():
    """float64 is not sent as it is: it is cast to float32, travels as bfloat16 with the float32
    sum, and comes back as float64 (Horovod's compressors compress every floating dtype)."""
    xs = [x.astype(np.float64) for x in data(11, n=10_000)]
    y = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, compression=hvd.Compression.bf16, name="bf16_f64")
    assert y.dtype == tf.float64
    s_hat = np.zeros_like(xs[0], np.float32)
    for x in xs:
        s_hat = s_hat + bf16_round(x.astype(np.float32))
    np.testing.assert_array_equal(y.numpy(), bf16_round(s_hat).astype(np.float64))
    d = tf.constant([1.0 + 2.0 ** -20], tf.float64)
    yd = hvd.allreduce(d, op=hvd.Sum, compression=hvd.Compression.bf16, name="bf16_f64_small").numpy()
    assert yd[0] == N  # 1 + 2^-20 rounds to 1 in bfloat16


def test_bf16_reducescatter_rounds_only_on_the_way_in():
    xs = [x.reshape(-1, 10) for x in data(5, 10 * (7 * N + 1))]
    y = hvd.reducescatter(tf.constant(xs[R]), op=hvd.Sum, compression=hvd.Compression.bf16, name="bf16_rs").numpy()
    acc = bf16_round(xs[0]).copy()
    for x in xs[1:]:
        acc = (acc + bf16_round(x)).astype(np.float32)
    rows = [len(a) for a in np.array_split(np.arange(len(xs[0])), N)]
    start = sum(rows[:R])
    np.testing.assert_array_equal(y, acc[start:start + rows[R]])


def test_wire_dtype_env_default_and_ranks_must_agree():
    xs = data(6, 4096)
    os.environ["MLSL_TF_WIRE_DTYPE"] = "bfloat16"
    try:
        hvd.shutdown()
        hvd.init()
        y = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, name="env_wire").numpy()
        np.testing.assert_array_equal(y, emulate(xs))
        # An explicit wire on one rank only is a disagreement: an error on every rank, not a hang.
        with pytest.raises(tf.errors.FailedPreconditionError, match="wire dtype"):
            hvd.ops._ops().mlsl_allreduce(tf.constant(xs[R]), "wire_mismatch", reduce_op=hvd.Sum,
                                          wire_dtype="bfloat16" if R == 0 else "none")
    finally:
        del os.environ["MLSL_TF_WIRE_DTYPE"]
        hvd.shutdown()
        hvd.init()
    y = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, name="env_wire_off").numpy()
    np.testing.assert_allclose(y, np.sum(np.array(xs, np.float64), 0), rtol=1e-5, atol=1e-3)


def test_bf16_error_feedback_does_not_accumulate():
    """The same gradient K times: the sum of the K reduced values drifts by K rounding errors
    without feedback, and stays within about one rounding error with it."""
    xs = data(7, 20000)
    exact = np.sum(np.array(xs, np.float64), axis=0)
    scale = np.sum(np.abs(np.array(xs, np.float64)), axis=0)
    K = 16
    totals = {}
    for comp in (hvd.Compression.bf16, hvd.Compression.bf16_ef):
        step = tf.function(lambda t, c=comp: hvd.allreduce(t, op=hvd.Sum, compression=c, name=f"ef_{c.__name__}"))
        total = np.zeros_like(exact)
        for _ in range(K):
            total += step(tf.constant(xs[R])).numpy()
        totals[comp] = np.mean(np.abs(total - K * exact) / (K * scale))
    assert totals[hvd.Compression.bf16_ef] < totals[hvd.Compression.bf16] / 3, totals
    with pytest.raises(ValueError, match="need name="):
        hvd.allreduce(tf.constant(xs[R]), compression=hvd.Compression.bf16_ef)


def test_training_with_bf16_gradients_matches_fp32():
    """A small Keras model on 2+ ranks: the final loss with bf16 gradients is within 2% of fp32's."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * N, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * np.sin(3 * x[:, :1])).astype("float32")
    local = slice(R * 64, (R + 1) * 64)
    losses = {}
    for comp in (hvd.Compression.none, hvd.Compression.bf16):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=comp), loss="mse")
        hist = model.fit(x[local], y[local], batch_size=16, epochs=15, verbose=0, shuffle=False)
        losses[comp] = hist.history["loss"][-1]
    a, b = losses[hvd.Compression.none], losses[hvd.Compression.bf16]
    assert abs(b - a) <= 0.02 * a, losses
    assert a < 0.5 * np.var(y), losses  # it did train
