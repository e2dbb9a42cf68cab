"""DistributedOptimizer, DistributedGradientTape and the Keras callbacks at world size 1 (plain
pytest): wrapping, config round trips, fit, save/load, accumulation."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf.keras as hvd
from mlsl_tf.optimizer.dispatch import DistributedOptimizer, is_distributed
from mlsl_tf.tape import DistributedGradientTape

hvd.init()


def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


@pytest.mark.parametrize("make", [lambda: keras.optimizers.SGD(0.1, momentum=0.9), lambda: keras.optimizers.Adam(0.01),
                                  lambda: keras.optimizers.RMSprop(0.01), lambda: keras.optimizers.AdamW(0.01)])
def test_wrap_keeps_class_and_config(make):
    plain = make()
    opt = DistributedOptimizer(plain, backward_passes_per_step=2)
    assert isinstance(opt, type(plain)) and is_distributed(opt) and not is_distributed(plain)
    assert type(opt).__name__ == type(plain).__name__
    assert opt.get_config() == plain.get_config()
    again = type(opt).from_config(opt.get_config())
    assert is_distributed(again) and again._mlsl_passes == 2 and again.get_config() == plain.get_config()
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(restored) is type(plain) and restored.get_config() == plain.get_config()


def test_rewrap_does_not_stack():
    opt = DistributedOptimizer(DistributedOptimizer(keras.optimizers.SGD(0.1)), op=hvd.Sum)
    assert type(opt).__mro__[2] is keras.optimizers.SGD  # generated class, the mixin, then SGD itself
    assert opt._mlsl_options.op == hvd.Sum


def test_bad_arguments():
    with pytest.raises(ValueError):
        DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError):
        DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError):
        DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Max)


def test_built_optimizer_state_is_copied():
    model = _model()
    plain = keras.optimizers.Adam(0.01)
    x, y = _data()
    model.compile(optimizer=plain, loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    opt = DistributedOptimizer(plain)
    assert opt.built and int(opt.iterations.numpy()) == 4
    for a, b in zip(plain.variables, opt.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kwargs", [{}, {"num_groups": 2}, {"gradient_predivide_factor": 4.0},
                                    {"compression": hvd.Compression.fp16}])
def test_fit_matches_plain_keras(kwargs):
    x, y = _data()
    ref, dist = _model(), _model()
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    dist.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5), **kwargs), loss="mse")
    h_ref = ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    h = dist.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
    tol = 1e-2 if "compression" in kwargs else 1e-5
    np.testing.assert_allclose(h.history["loss"], h_ref.history["loss"], rtol=tol, atol=tol)
    for a, b in zip(ref.get_weights(), dist.get_weights()):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_backward_passes_accumulate_then_apply():
    x, y = _data(16)
    ref, dist = _model(), _model()
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    dist.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                                average_aggregated_gradients=True), loss="mse")
    start = dist.get_weights()
    dist.train_on_batch(x[:8], y[:8])
    for a, b in zip(start, dist.get_weights()):
        np.testing.assert_array_equal(a, b)  # first pass only accumulates
    dist.train_on_batch(x[8:], y[8:])
    ref.train_on_batch(x, y)
    for a, b in zip(ref.get_weights(), dist.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(dist.optimizer.iterations.numpy()) == 1


def test_apply_gradients_eager_and_tape():
    model = _model()
    x, y = _data()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = DistributedGradientTape(tape)
    assert isinstance(tape, tf.GradientTape)
    grads = tape.gradient(loss, model.trainable_variables)
    before = [np.asarray(v) for v in model.trainable_variables]
    opt.apply_gradients(zip(grads, model.trainable_variables))
    for b, v, g in zip(before, model.trainable_variables, grads):
        np.testing.assert_allclose(np.asarray(v), b - 0.1 * np.asarray(g), rtol=1e-5, atol=1e-6)


def test_tape_as_context_manager_with_dict_sources():
    v = tf.Variable([1.0, 2.0])
    w = tf.Variable(3.0)
    with DistributedGradientTape(tf.GradientTape(), op=hvd.Sum) as tape:
        loss = tf.reduce_sum(v * w)
    grads = tape.gradient(loss, {"v": v, "w": w})
    np.testing.assert_allclose(grads["v"].numpy(), [3.0, 3.0])
    np.testing.assert_allclose(grads["w"].numpy(), 3.0)


def test_save_load_rewraps(tmp_path):
    x, y = _data()
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    path = str(tmp_path / "ckpt-{epoch}.keras")
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[hvd.callbacks.ModelCheckpoint(path)])
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1.keras", "ckpt-2.keras"]  # no temp files left
    plain = keras.models.load_model(str(tmp_path / "ckpt-2.keras"))
    assert type(plain.optimizer) is keras.optimizers.Adam
    loaded = hvd.load_model(str(tmp_path / "ckpt-2.keras"))
    assert is_distributed(loaded.optimizer) and int(loaded.optimizer.iterations.numpy()) == 8
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_best_checkpoint_and_schedules(tmp_path):
    x, y = _data()
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), loss="mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(float(np.asarray(model.optimizer.learning_rate))))
    path = str(tmp_path / "best.weights.h5")
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(0.04, warmup_epochs=1),
        hvd.callbacks.LearningRateScheduleCallback(0.04, 0.5, start_epoch=2),
        record, hvd.callbacks.BestModelCheckpoint(path, monitor="loss", save_weights_only=True)])
    # size 1: warmup from 0.04 / 1 stays at 0.04; from epoch 2 the multiplier halves it.
    np.testing.assert_allclose(seen, [0.04] * 8 + [0.02] * 4, rtol=1e-6)
    assert os.listdir(tmp_path) == ["best.weights.h5"]


def test_accumulators_are_not_saved_state(tmp_path):
    x, y = _data()
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=2),
                  loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    n_state = len(model.optimizer.variables)
    model.save(str(tmp_path / "m.keras"))
    plain = keras.models.load_model(str(tmp_path / "m.keras"))
    assert len(plain.optimizer.variables) == n_state and int(plain.optimizer.iterations.numpy()) == 2
    loaded = hvd.load_model(str(tmp_path / "m.keras"), backward_passes_per_step=2)
    assert loaded.optimizer._mlsl_passes == 2 and len(loaded.optimizer._mlsl_accumulators) == 4


def test_loss_scale_optimizer_can_be_wrapped():
    x, y = _data()
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05))),
                  loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_broadcast_callback_turns_off_xla():
    x, y = _data()
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", jit_compile=True)
    assert model.jit_compile
    with pytest.warns(UserWarning, match="jit_compile=False"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert not model.jit_compile


def test_checkpoint_is_atomic_when_a_save_fails(tmp_path):
    x, y = _data()
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    path = str(tmp_path / "model.keras")
    checkpoint = hvd.callbacks.ModelCheckpoint(path)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[checkpoint])
    good = open(path, "rb").read()

    def broken_save(filepath, overwrite=True):
        with open(filepath, "wb") as f:
            f.write(b"half a checkpoint")  # what a crash mid-write would leave
        raise OSError("disk full")

    model.save = broken_save
    with pytest.raises(OSError, match="disk full"):
        checkpoint.on_epoch_end(1, {"loss": 0.5})
    assert os.listdir(tmp_path) == ["model.keras"] and open(path, "rb").read() == good
    assert keras.models.load_model(path).get_weights()[0].shape == (4, 8)


def test_checkpoint_bad_arguments():
    with pytest.raises(ValueError, match=r"\.weights\.h5"):
        hvd.callbacks.ModelCheckpoint("w.keras", save_weights_only=True)
    with pytest.raises(ValueError, match="save_freq"):
        hvd.callbacks.ModelCheckpoint("m.keras", save_freq=0)
    with pytest.raises(ValueError, match="mode"):
        hvd.callbacks.ModelCheckpoint("m.keras", mode="up")


def test_progress_output_switch(capfd):
    model = _model()
    try:
        hvd.set_progress_output([])  # no rank prints: not even rank 0
        model.summary()
        assert capfd.readouterr().out == ""
        hvd.set_progress_output(0)
        model.summary()
        assert "Total params" in capfd.readouterr().out
    finally:
        hvd.set_progress_output(0)
    for bad in (1, -1, "everyone", [0, 2], True):
        with pytest.raises(ValueError, match="set_progress_output"):
            hvd.set_progress_output(bad)


def test_horovod_names_at_top_level_and_in_keras():
    import mlsl_tf
    assert mlsl_tf.DistributedOptimizer is hvd.DistributedOptimizer is DistributedOptimizer
    assert mlsl_tf.DistributedGradientTape is hvd.DistributedGradientTape is DistributedGradientTape
    for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
                 "LearningRateScheduleCallback", "BestModelCheckpoint"):
        assert issubclass(getattr(hvd.callbacks, name), keras.callbacks.Callback)


def test_keras_namespace_has_adasum_for_its_optimizer():
    """The README says mlsl_tf.keras' DistributedOptimizer takes op=hvd.Adasum: the name is there
    and is the op's (Horovod's horovod.tensorflow.keras has it too)."""
    import mlsl_tf
    assert hvd.Adasum is mlsl_tf.Adasum and "Adasum" in hvd.__all__
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    model = _model()
    model.compile(optimizer=opt, loss="mse")
    x, y = _data()
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(model.get_weights(), before))
