"""Overlap in real graphs on N ranks: collectives start while the backward pass still runs, and
cross-iteration overlap (mlsl_tf/overlap.py) trains exactly as updates inside the step do --
same weights, losses, iteration counts and learning rates -- with model.fit + DistributedOptimizer
and with a tf.function loop + DistributedGradientTape. Run under `mpiexec -n 2` and `-n 3`."""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf
import mlsl_tf.keras as hvd
from mlsl_tf import _library

hvd.init()
N, R = hvd.size(), hvd.rank()
B = 4  # local batch
STEPS = 3  # steps per epoch


def _parked():
    """Reduced gradients started and not yet applied (deferred updates in flight)."""
    return _library.c_api().mlsl_tf_parked()


def _data(seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * N * B, 4)).astype("float32")
    y = (np.tanh(x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")) + 0.1).astype("float32")
    rows = np.concatenate([x[(s * N + R) * B:(s * N + R + 1) * B] for s in range(steps)])
    targets = np.concatenate([y[(s * N + R) * B:(s * N + R + 1) * B] for s in range(steps)])
    return rows, targets


def _model(seed=0, embedding=False):
    keras.utils.set_random_seed(seed)
    if embedding:
        tokens = keras.Input((3,), dtype="int32")
        h = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(tokens))
        return keras.Model(tokens, keras.layers.Dense(1)(keras.layers.Dense(5, activation="tanh")(h)))
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)])


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam_schedule": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.02, 2, 0.5)),
    "adamw_clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, clipnorm=0.5),
}


def _fit(make_opt, cross, epochs=2, run_eagerly=False, validation=False, embedding=False, x=None, y=None):
    """Trains with model.fit; returns (model, optimizer, per-batch iterations and learning
    rates seen by a callback, results parked when fit returned, history)."""
    model = _model(embedding=embedding)
    if x is None:
        x, y = _data()
    opt = hvd.DistributedOptimizer(make_opt(), cross_iteration=cross)
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    seen = []
    probe = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(
        (int(opt.iterations.numpy()), float(keras.ops.convert_to_numpy(opt.learning_rate)))))
    history = model.fit(x, y, batch_size=B, epochs=epochs, shuffle=False, verbose=0, callbacks=[probe],
                        validation_data=(x, y) if validation else None)
    parked = _parked()
    return model, opt, seen, parked, history.history


def _assert_same(a, b, tol=1e-6):
    for u, v in zip(a, b):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


# ---- collectives start as soon as their input exists ------------------------------------------

def test_collectives_start_while_the_backward_pass_runs():
    """A backward pass whose layers hold an executor thread (py_function sleeps) and hand each
    gradient to an allreduce: with the settings init() chooses, every gradient but the last is
    enqueued before the pass ends (one inter-op thread queued them all behind it)."""
    n = 8
    probe = []

    def layer(t):
        def compute(x):
            probe.append(mlsl_tf.stats()["submitted"])
            time.sleep(0.02)
            return x
        return tf.py_function(compute, [t], tf.float32)

    @tf.function
    def backward(seed):
        t, outs = seed, []
        for i in reversed(range(n)):
            t = layer(t)
            outs.append(hvd.allreduce(tf.ones([1000]) * t[0], op=hvd.Sum, name=f"overlap.backward.{i}", priority=i))
        t = layer(t)  # the end of the pass
        return tf.add_n([o[:1] for o in outs]), t

    seed = tf.ones([1])
    backward(seed)
    for _ in range(2):
        probe.clear()
        before = mlsl_tf.stats()["submitted"]
        total, _ = backward(seed)
        assert float(total[0]) == n * N
        assert probe[-1] - before >= n - 1, f"only {probe[-1] - before} of {n} collectives had started when the " \
                                            "backward pass ended"


# ---- cross-iteration overlap: same training -----------------------------------------------------

@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fit_trains_as_updates_in_the_step(name):
    model_on, opt_on, seen_on, parked_on, _ = _fit(OPTIMIZERS[name], cross=True)
    assert parked_on == len(model_on.trainable_variables)  # the last step's updates were still in flight
    weights_on = model_on.get_weights()
    assert _parked() == 0  # reading the weights applied them
    model_off, opt_off, seen_off, parked_off, _ = _fit(OPTIMIZERS[name], cross=False)
    assert parked_off == 0
    assert seen_on == seen_off  # iteration and learning rate after every step
    assert [v for v, _ in seen_on] == list(range(1, 2 * STEPS + 1))
    _assert_same(weights_on, model_off.get_weights())
    _assert_same([v.numpy() for v in opt_on.variables], [v.numpy() for v in opt_off.variables])


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_schedule"])
def test_tape_loop_trains_as_updates_in_the_step(name):
    x, y = _data(steps=4)

    def train(cross):
        model, opt = _model(), OPTIMIZERS[name]()

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
            tape = hvd.DistributedGradientTape(tape, cross_iteration=cross)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        losses = [float(step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])) for s in range(4)]
        parked = _parked()
        return model, opt, losses, parked

    model_on, opt_on, losses_on, parked_on = train(True)
    assert parked_on == len(model_on.trainable_variables)
    weights_on = model_on.get_weights()
    model_off, opt_off, losses_off, parked_off = train(False)
    assert parked_off == 0
    np.testing.assert_allclose(losses_on, losses_off, rtol=1e-6)
    assert int(opt_on.iterations.numpy()) == int(opt_off.iterations.numpy()) == 4
    _assert_same(weights_on, model_off.get_weights())
    _assert_same([v.numpy() for v in opt_on.variables], [v.numpy() for v in opt_off.variables])


def test_reads_between_steps_see_every_update():
    """Validation after each epoch and optimizer slots read from outside both apply the pending
    updates first."""
    _, opt_on, _, _, hist_on = _fit(OPTIMIZERS["sgd_momentum"], cross=True, epochs=3, validation=True)
    slots_on = [v.numpy() for v in opt_on.variables]  # read before the weights: still applied first
    assert _parked() == 0
    _, opt_off, _, _, hist_off = _fit(OPTIMIZERS["sgd_momentum"], cross=False, epochs=3, validation=True)
    np.testing.assert_allclose(hist_on["val_loss"], hist_off["val_loss"], rtol=1e-6)
    np.testing.assert_allclose(hist_on["loss"], hist_off["loss"], rtol=1e-6)
    _assert_same(slots_on, [v.numpy() for v in opt_off.variables])


def test_assigned_weights_are_not_overwritten_by_a_pending_update():
    x, y = _data()
    results = []
    for cross in (True, False):
        model, opt, _, parked, _ = _fit(OPTIMIZERS["sgd_momentum"], cross=cross, epochs=1, x=x, y=y)
        assert parked == (len(model.trainable_variables) if cross else 0)
        start = [np.full(w.shape, 0.1, w.dtype) for w in model.get_weights()]
        model.set_weights(start)
        _assert_same(model.get_weights(), start)
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        results.append(model.get_weights())
    _assert_same(results[0], results[1])


def test_sparse_gradients_apply_in_their_step_dense_ones_later():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 20, size=(STEPS * B, 3)).astype("int32")
    y = rng.normal(size=(STEPS * B, 1)).astype("float32")
    model_on, _, _, parked_on, _ = _fit(OPTIMIZERS["adam_schedule"], cross=True, embedding=True, x=x, y=y)
    assert parked_on == len(model_on.trainable_variables) - 1  # all but the embedding
    weights_on = model_on.get_weights()
    model_off, _, _, _, _ = _fit(OPTIMIZERS["adam_schedule"], cross=False, embedding=True, x=x, y=y)
    _assert_same(weights_on, model_off.get_weights())


def test_eager_training_defers_too():
    model_on, _, seen_on, parked_on, _ = _fit(OPTIMIZERS["adam_schedule"], cross=True, run_eagerly=True, epochs=1)
    assert parked_on == len(model_on.trainable_variables)
    weights_on = model_on.get_weights()
    model_off, _, seen_off, _, _ = _fit(OPTIMIZERS["adam_schedule"], cross=False, run_eagerly=True, epochs=1)
    assert seen_on == seen_off
    _assert_same(weights_on, model_off.get_weights())


def test_optimizers_that_need_every_gradient_apply_in_the_step():
    clipped = lambda: keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.1)  # noqa: E731
    model_on, _, _, parked_on, _ = _fit(clipped, cross=True)
    model_off, _, _, _, _ = _fit(clipped, cross=False)
    assert parked_on == 0
    _assert_same(model_on.get_weights(), model_off.get_weights())


def test_a_result_started_twice_before_it_is_taken_is_an_error():
    v = keras.Variable(np.zeros([3], "float32"))
    handle = v.value.handle
    ops = _library.load_ops()
    ops.mlsl_start_allreduce(tf.ones([3]), handle, reduce_op=hvd.Sum, tensor_name="overlap.twice")
    with pytest.raises(tf.errors.FailedPreconditionError, match="'overlap.twice' was started again"):
        ops.mlsl_start_allreduce(tf.ones([3]), handle, reduce_op=hvd.Sum, tensor_name="overlap.twice")
    found, value = ops.mlsl_take_result(handle, T=tf.float32, shape=[3], tensor_name="overlap.twice")
    assert bool(found) and value.numpy().tolist() == [float(N)] * 3
    found, _ = ops.mlsl_take_result(handle, T=tf.float32, shape=[3], tensor_name="overlap.twice")
    assert not bool(found)


def test_shutdown_applies_pending_updates_first():
    """Last in this file: shuts the runtime down with updates in flight, then starts it again."""
    model_off, _, _, _, _ = _fit(OPTIMIZERS["sgd_momentum"], cross=False, epochs=1)
    model_on, _, _, parked, _ = _fit(OPTIMIZERS["sgd_momentum"], cross=True, epochs=1)
    assert parked == len(model_on.trainable_variables)
    hvd.shutdown()
    try:
        raw = [v.value.numpy() for v in model_on.trainable_variables]  # no runtime: nothing left to take
        _assert_same(raw, model_off.get_weights())
        x, _ = _data()
        # Its graphs still run (their takes find nothing without a runtime).
        np.testing.assert_allclose(model_on.predict(x, verbose=0), model_off.predict(x, verbose=0), rtol=1e-6)
    finally:
        hvd.init()
