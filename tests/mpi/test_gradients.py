"""Gradients of the collectives under tf.GradientTape, eager and in tf.function, against
what the math says on N ranks."""

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()
MODES = ["eager", "graph"]


def grad_of(mode, loss_fn, x):
    def g(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_fn(x)
        return tape.gradient(loss, x)
    return (tf.function(g) if mode == "graph" else g)(x)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_gradient(mode):
    x = tf.constant([1.0, 2.0]) * (R + 1)
    w = tf.constant([1.0, -1.0]) * (R + 1)  # rank-dependent upstream weights
    g = grad_of(mode, lambda x: tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum, name=f"gar.{mode}") * w), x)
    # d/dx_r sum_s(w_s . sum_q x_q) = sum_s w_s
    np.testing.assert_allclose(g.numpy(), np.array([1.0, -1.0]) * sum(range(1, N + 1)))
    g = grad_of(mode, lambda x: tf.reduce_sum(hvd.allreduce(x, op=hvd.Average, name=f"gavg.{mode}") * w), x)
    np.testing.assert_allclose(g.numpy(), np.array([1.0, -1.0]) * sum(range(1, N + 1)) / N, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_gradient(mode):
    x = tf.constant([1.0, 2.0, 3.0])
    g = grad_of(mode, lambda x: tf.reduce_sum(hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum,
                                                                    name=f"ggr.{mode}")[1] * (R + 1)), x)
    np.testing.assert_allclose(g.numpy(), [2.0 * sum(range(1, N + 1))] * 3)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_uneven(mode):
    x = tf.ones([R + 1, 2])
    # loss = mean_s sum(allgather(x) * c_s) with row weights c_s[i] = (s+1)*(i+1): Horovod's
    # gradient averages the ranks' upstream gradients
    total = sum(r + 1 for r in range(N))

    def loss(x):
        y = hvd.allgather(x, name=f"gag.{mode}")
        c = tf.reshape(tf.range(1, total + 1, dtype=tf.float32), [total, 1]) * (R + 1)
        return tf.reduce_sum(y * c)

    g = grad_of(mode, loss, x)
    offset = sum(r + 1 for r in range(R))
    want = np.arange(offset + 1, offset + R + 2, dtype=np.float32).reshape(-1, 1) * sum(range(1, N + 1)) / N
    np.testing.assert_allclose(g.numpy(), np.broadcast_to(want, (R + 1, 2)), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_gradient(mode):
    x = tf.constant([1.0, 1.0])
    g = grad_of(mode, lambda x: tf.reduce_sum(hvd.broadcast(x, root_rank=N - 1, name=f"gbc.{mode}") * (R + 1)), x)
    want = sum(range(1, N + 1)) / N if R == N - 1 else 0.0  # averaged at the root, as Horovod
    np.testing.assert_allclose(g.numpy(), [want, want], rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_gradient(mode):
    splits = [R + d + 1 for d in range(N)]
    x = tf.ones([sum(splits), 1])

    def loss(x):
        y, _ = hvd.alltoall(x, splits=splits, name=f"ga2a.{mode}")
        return tf.reduce_sum(y * float(R + 1))

    g = grad_of(mode, loss, x)
    # rows sent to rank d come back scaled by (d + 1)
    want = np.concatenate([np.full([splits[d], 1], d + 1.0) for d in range(N)])
    np.testing.assert_allclose(g.numpy(), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_gradient(mode, op):
    x = tf.ones([2 * N, 1])
    g = grad_of(mode, lambda x: tf.reduce_sum(hvd.reducescatter(x, op=op, name=f"grs.{mode}.{op}") * (R + 1)), x)
    # row block b of the input reaches rank b, whose weight is b + 1
    want = np.repeat(np.arange(1, N + 1, dtype=np.float32), 2).reshape(-1, 1)
    if op == hvd.Average:
        want = want / N
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("scale", [True, False])
def test_local_sources_are_not_reduced(scale):
    shared, local = tf.Variable(1.0), tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = float(R + 1) * shared + float(R + 1) * local
    tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
    tape.register_local_source(local)
    g_shared, g_local = tape.gradient(loss, [shared, local])
    assert float(g_shared) == pytest.approx((N + 1) / 2)  # averaged over ranks
    assert float(g_local) == pytest.approx((R + 1) / N if scale else R + 1)  # this rank's own


def test_partial_tape_keeps_local_layers_local():
    import keras
    common, mine = keras.layers.Dense(1, use_bias=False), keras.layers.Dense(1, use_bias=False)
    x = tf.ones([1, 1]) * float(R + 1)
    common.build((None, 1)), mine.build((None, 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(common(x) + mine(x))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[mine])
    g_common, g_mine = tape.gradient(loss, [common.kernel, mine.kernel])
    assert float(g_common[0, 0]) == pytest.approx((N + 1) / 2)
    assert float(g_mine[0, 0]) == pytest.approx((R + 1) / N)
