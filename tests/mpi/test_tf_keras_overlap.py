"""Cross-iteration overlap under Keras 2 (tf_keras) on N ranks: legacy and new tf_keras optimizers
leave each step with their gradients' reductions in flight (mlsl_tf/overlap.py), and train
exactly as the update inside the step does (cross_iteration=False, MLSL_TF_CROSS_ITERATION=0):
the same weights, optimizer state, iterations and learning rates, bit-identical on every rank;
every read from outside (get_weights, evaluate, predict, save, callbacks, ModelCheckpoint,
elastic commits) sees the pending update; optimizers that need every gradient at once apply in
the step with one log line. Run under `mpiexec -n 2` and `-n 3`."""

import logging
import os
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import mlsl_tf
import mlsl_tf.keras as hvd
from mlsl_tf import _library, keras2_compat, overlap

hvd.init()
N, R = hvd.size(), hvd.rank()
B = 4  # local batch
STEPS = 3  # steps per epoch
schedules = tf_keras.optimizers.schedules

OPTIMIZERS = {
    "legacy_sgd_momentum_lr": lambda: tf_keras.optimizers.legacy.SGD(lr=0.05, momentum=0.9),
    "legacy_adam_decay": lambda: tf_keras.optimizers.legacy.Adam(0.02, decay=0.1, clipnorm=0.5),
    "legacy_adam_schedule": lambda: tf_keras.optimizers.legacy.Adam(schedules.ExponentialDecay(0.02, 2, 0.5)),
    "new_sgd_momentum": lambda: tf_keras.optimizers.SGD(0.05, momentum=0.9, clipvalue=0.5),
    "new_adam_schedule": lambda: tf_keras.optimizers.Adam(schedules.ExponentialDecay(0.02, 2, 0.5)),
    "new_adamw_weight_decay": lambda: tf_keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "new_sgd_weight_decay_xla": lambda: _jit(tf_keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.05)),
}


def _jit(opt):
    opt.jit_compile = True  # tf_keras turns XLA off without a GPU; the XLA update path, on the CPU
    return opt


@pytest.fixture(autouse=True)
def nothing_left_in_flight():
    """Every test starts with no deferred update pending (a model a test drops keeps its last
    step's results parked until shutdown)."""
    overlap.flush_all()
    assert _parked() == 0
    yield
    overlap.flush_all()


def _parked():
    """Reduced gradients started and not yet applied (deferred updates in flight)."""
    return _library.c_api().mlsl_tf_parked()


def _raw(variables):
    """The variables' values as stored, read past the access hooks (a pending update not applied)."""
    return [tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=v.dtype).numpy() for v in variables]


def _data(steps=STEPS, seed=0):
    """This rank's rows of `steps` global batches of N*B rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * N * B, 4)).astype("float32")
    y = (np.tanh(x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")) + 0.1).astype("float32")
    rows = np.concatenate([np.arange((s * N + R) * B, (s * N + R + 1) * B) for s in range(steps)])
    return x[rows], y[rows]


def _model(seed=0):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.layers.Dense(6, activation="tanh", input_shape=(4,)),
                                tf_keras.layers.Dense(5, activation="tanh"), tf_keras.layers.Dense(1)])


def _fit(make_opt, cross, epochs=2, callbacks=()):
    """model.fit with a DistributedOptimizer; returns (model, optimizer, (iteration, learning
    rate) after each batch, results parked when fit returned)."""
    model = _model()
    x, y = _data()
    opt = hvd.DistributedOptimizer(make_opt(), cross_iteration=cross)
    model.compile(optimizer=opt, loss="mse")
    seen = []
    probe = tf_keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(
        (int(opt.iterations.numpy()), keras2_compat.get_learning_rate(opt))))
    model.fit(x, y, batch_size=B, epochs=epochs, shuffle=False, verbose=0, callbacks=[probe, *callbacks])
    return model, opt, seen, _parked()


def _assert_same(a, b, tol=1e-6):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


def _assert_same_on_all_ranks(arrays, name):
    arrays = [np.asarray(a) for a in arrays]
    for other in hvd.allgather_object(arrays, name=f"test_tf_keras_overlap.{name}"):
        for a, b in zip(arrays, other):
            np.testing.assert_array_equal(a, b)


def _slots(opt):
    return [v.numpy() for v in keras2_compat.optimizer_variables(opt)]


# ---- same training as the update inside the step ------------------------------------------------

@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fit_trains_as_updates_in_the_step(name):
    before = mlsl_tf.stats()["requests"]
    model_on, opt_on, seen_on, parked_on = _fit(OPTIMIZERS[name], cross=True)
    n = len(model_on.trainable_variables)
    assert parked_on == n  # the last step's updates were still in flight when fit returned
    raw = _raw(model_on.trainable_variables)
    weights_on = model_on.get_weights()  # applies them
    assert _parked() == 0
    assert mlsl_tf.stats()["requests"] - before == 2 * STEPS * n  # each gradient reduced once per step
    assert any(not np.array_equal(a, b) for a, b in zip(raw, weights_on))
    model_off, opt_off, seen_off, parked_off = _fit(OPTIMIZERS[name], cross=False)
    assert parked_off == 0
    assert [i for i, _ in seen_on] == list(range(1, 2 * STEPS + 1))
    assert seen_on == seen_off  # iteration and learning rate after every step
    _assert_same(weights_on, model_off.get_weights())
    _assert_same(_slots(opt_on), _slots(opt_off))
    _assert_same_on_all_ranks(weights_on + _slots(opt_on), f"fit.{name}")


def test_a_tape_loop_defers_too():
    """A tf.function step with a plain tf.GradientTape and apply_gradients: the optimizer reduces
    the gradients itself, deferred."""
    x, y = _data(steps=4)

    def train(cross):
        model = _model()
        opt = hvd.DistributedOptimizer(tf_keras.optimizers.legacy.Adam(0.02), cross_iteration=cross)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        losses = [float(step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])) for s in range(4)]
        return model, losses, _parked()

    model_on, losses_on, parked_on = train(True)
    assert parked_on == len(model_on.trainable_variables)
    weights_on = model_on.get_weights()
    model_off, losses_off, parked_off = train(False)
    assert parked_off == 0
    np.testing.assert_allclose(losses_on, losses_off, rtol=1e-6)
    _assert_same(weights_on, model_off.get_weights())


# ---- reads from outside see the pending update ---------------------------------------------------

def test_a_callback_reading_the_weights_after_every_batch_sees_every_update():
    x, y = _data()
    per_batch = {}
    for cross in (True, False):
        model = _model()
        model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["new_sgd_momentum"](), cross_iteration=cross),
                      loss="mse")
        seen = per_batch[cross] = []
        reader = tf_keras.callbacks.LambdaCallback(on_batch_end=lambda b, logs, seen=seen, model=model: seen.append(
            (_parked(), model.get_weights())))
        model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[reader])
    n = len(model.trainable_variables)
    assert [p for p, _ in per_batch[True]] == [n] * 2 * STEPS  # each batch's update pending when it ended
    assert [p for p, _ in per_batch[False]] == [0] * 2 * STEPS
    for (_, a), (_, b) in zip(per_batch[True], per_batch[False]):
        _assert_same(a, b)


def test_evaluate_and_predict_see_the_pending_update():
    """Validation after each epoch (the epoch's last updates in flight), and predict and evaluate
    right after fit, while the last step's updates are in flight; evaluate and predict also ran before fit, so tf_keras had
    traced their functions before the variables had access hooks (they are traced again)."""
    x, y = _data()
    results = {}
    for cross in (True, False):
        model = _model()
        model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["legacy_sgd_momentum_lr"](),
                                                         cross_iteration=cross), loss="mse")
        first = model.evaluate(x, y, batch_size=B, verbose=0), model.predict(x, batch_size=B, verbose=0)
        history = model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, validation_data=(x, y))
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        parked = _parked()
        after = model.predict(x, batch_size=B, verbose=0), model.evaluate(x, y, batch_size=B, verbose=0)
        results[cross] = first, history.history, parked, after, _raw(model.trainable_variables)
    on, off = results[True], results[False]
    assert on[2] == len(model.trainable_variables) and off[2] == 0
    np.testing.assert_allclose(on[0][0], off[0][0], rtol=1e-6)
    np.testing.assert_allclose(on[1]["val_loss"], off[1]["val_loss"], rtol=1e-6)
    np.testing.assert_allclose(on[1]["loss"], off[1]["loss"], rtol=1e-6)
    _assert_same([on[3][0]], [off[3][0]])
    np.testing.assert_allclose(on[3][1], off[3][1], rtol=1e-6)
    _assert_same(on[4], off[4])  # predict applied the updates in its own function


@pytest.mark.parametrize("fmt", ["model.h5", "savedmodel"])
def test_save_right_after_fit_writes_the_pending_update(fmt):
    model_off, _, _, _ = _fit(OPTIMIZERS["new_adam_schedule"], cross=False)
    model_on, _, _, parked = _fit(OPTIMIZERS["new_adam_schedule"], cross=True)
    assert parked == len(model_on.trainable_variables)
    directory = tempfile.mkdtemp(prefix=f"mlsl-tko-{R}-")
    try:
        path = os.path.join(directory, fmt)
        model_on.save(path)
        loaded = hvd.load_model(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    _assert_same(loaded.get_weights(), model_off.get_weights())
    _assert_same(model_on.get_weights(), model_off.get_weights())


@pytest.mark.parametrize("filename", ["weights.h5", "ckpt"])
def test_model_checkpoint_writes_the_pending_update(filename):
    model_off, _, _, _ = _fit(OPTIMIZERS["legacy_adam_schedule"], cross=False)
    directory = tempfile.mkdtemp(prefix=f"mlsl-tko-{R}-")
    try:
        path = os.path.join(directory, filename)
        checkpoint = tf_keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
        model_on, _, _, _ = _fit(OPTIMIZERS["legacy_adam_schedule"], cross=True, callbacks=[checkpoint])
        fresh = _model(seed=1)
        fresh.load_weights(path)  # written at the last epoch's end, its last update pending
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    _assert_same(fresh.get_weights(), model_off.get_weights())


def test_elastic_commit_saves_the_pending_update():
    model_off, _, _, _ = _fit(OPTIMIZERS["new_sgd_momentum"], cross=False)
    x, y = _data()
    model = _model()
    model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["new_sgd_momentum"]()), loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    commit = hvd.elastic.CommitStateCallback(state, batches_per_commit=STEPS)
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[commit])
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    state.restore()  # the commit at the last epoch's end, when that step's update was pending
    _assert_same(model.get_weights(), model_off.get_weights())


# ---- what stays in the step ---------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: tf_keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.1),
                                  lambda: tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9, global_clipnorm=0.1)],
                         ids=["new", "legacy"])
def test_optimizers_that_need_every_gradient_apply_in_the_step(make, caplog):
    with caplog.at_level(logging.INFO, logger="mlsl_tf"):
        model_on, _, _, parked_on = _fit(make, cross=True)
    lines = [r.getMessage() for r in caplog.records if "applies synchronously" in r.getMessage()]
    assert lines == ["mlsl_tf: SGD applies synchronously: global_clipnorm needs every gradient at once"]
    assert parked_on == 0
    _assert_same(_raw(model_on.trainable_variables), model_on.get_weights(), tol=0)
    model_off, _, _, _ = _fit(make, cross=False)
    _assert_same(model_on.get_weights(), model_off.get_weights())


def test_the_setting_turns_it_off(monkeypatch):
    """MLSL_TF_CROSS_ITERATION=0: the update is inside the step -- nothing in flight when fit
    returns, the stored values are the final weights -- and the weights are those with overlap."""
    monkeypatch.setenv("MLSL_TF_CROSS_ITERATION", "0")
    model_off, _, _, parked = _fit(OPTIMIZERS["legacy_sgd_momentum_lr"], cross=None)
    assert parked == 0
    _assert_same(_raw(model_off.trainable_variables), model_off.get_weights(), tol=0)
    monkeypatch.delenv("MLSL_TF_CROSS_ITERATION")
    model_on, _, _, parked = _fit(OPTIMIZERS["legacy_sgd_momentum_lr"], cross=None)  # the default: on
    assert parked == len(model_on.trainable_variables)
    _assert_same(model_on.get_weights(), model_off.get_weights())
