"""A collective's result never shares memory with a tensor someone still reads: an allreduce
may run in place on its input only when TensorFlow holds no other reference to it (issue #13:
fresh gradients reduced in place, warm memory), so an input kept by the user, read again after
the collective, or read from a variable still holds its old value. Eager and in tf.function."""

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

hvd.init()
N, R = hvd.size(), hvd.rank()
BIG = 1 << 18  # elements: a 1 MiB float32 tensor, beyond any small-tensor path


def run(mode, fn):
    return tf.function(fn)() if mode == "graph" else fn()


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("n", [4, BIG])
def test_input_kept_by_the_caller_keeps_its_value(mode, n):
    def body():
        x = tf.fill([n], float(R + 1)) * 2.0  # computed here: a buffer the collective could reuse
        y = hvd.allreduce(x, op=hvd.Sum, name=f"alias.kept.{mode}.{n}")
        return x, y
    x, y = run(mode, body)
    np.testing.assert_array_equal(x.numpy()[:4], [2.0 * (R + 1)] * 4)
    np.testing.assert_array_equal(y.numpy()[:4], [float(N * (N + 1))] * 4)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_input_read_after_the_collective_keeps_its_value(mode):
    def body():
        x = tf.fill([BIG], float(R + 1)) + 0.0
        y = hvd.allreduce(x, op=hvd.Sum, name=f"alias.after.{mode}")
        with tf.control_dependencies([y]):
            later = tf.reduce_sum(x)  # reads x once the allreduce has finished
        return y, later
    y, later = run(mode, body)
    assert later.numpy() == BIG * float(R + 1)
    assert y.numpy()[0] == N * (N + 1) / 2


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_variable_and_grouped_inputs_keep_their_values(mode):
    v = tf.Variable(tf.fill([BIG], float(R)))

    def body():
        a = tf.fill([8], float(R)) * 1.0
        y = hvd.allreduce(v, op=hvd.Sum, name=f"alias.var.{mode}")
        ga, gb = hvd.grouped_allreduce([a, a * 2.0], op=hvd.Sum, name=f"alias.grouped.{mode}")
        return y, a, ga, gb
    y, a, ga, gb = run(mode, body)
    np.testing.assert_array_equal(v.numpy()[:2], [float(R)] * 2)
    np.testing.assert_array_equal(a.numpy(), [float(R)] * 8)
    assert y.numpy()[0] == sum(range(N)) and ga.numpy()[0] == sum(range(N)) and gb.numpy()[0] == 2 * sum(range(N))


def test_fresh_chain_reuses_no_live_buffer():
    # the benchmark's fresh chain: each input is computed, reduced (in place when nobody else holds
    # it) and scaled; every intermediate the function returns must hold its own value
    @tf.function
    def chain(x):
        kept = []
        for i in range(4):
            x = hvd.allreduce(x, op=hvd.Sum, name=f"alias.chain.{i}") * (1.0 / N)
            kept.append(x + float(i))
        return kept
    kept = chain(tf.fill([BIG], float(R + 1)))
    mean = (N + 1) / 2
    for i, k in enumerate(kept):
        assert k.numpy()[0] == pytest.approx(mean + i) and k.numpy()[-1] == pytest.approx(mean + i)
