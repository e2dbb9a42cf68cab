"""mlsl_tf.keras with Keras 2 (tf_keras, imported directly) on N ranks: DistributedOptimizer over
legacy and new tf_keras optimizers, backward_passes_per_step, the callbacks and load_model.

Run under `mpiexec -n 2` and `-n 3`. References are computed on each rank without collectives,
by a plain tf_keras optimizer on the concatenated global batch; SGD, so N-rank training matches
them up to float rounding."""

import os
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import mlsl_tf
import mlsl_tf.keras as hvd

hvd.init()
N, R = hvd.size(), hvd.rank()
B = 4  # local batch
STEPS = 4

OPTIMIZERS = {
    "legacy": lambda lr=0.1: tf_keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9),
    "new": lambda lr=0.1: tf_keras.optimizers.SGD(learning_rate=lr, momentum=0.9),
}


def _data(steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * N * B, 4)).astype("float32")
    y = (np.tanh(x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")) + 0.1).astype("float32")
    return x, y


def _shard(a):
    """This rank's rows of every global batch of N*B rows, in step order."""
    steps = len(a) // (N * B)
    return np.concatenate([a[s * N * B + R * B:s * N * B + (R + 1) * B] for s in range(steps)])


def _model(seed=0):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.layers.Dense(6, activation="tanh", input_shape=(4,)),
                                tf_keras.layers.Dense(1)])


def _reference(kind, x, y, batch, seed=0):
    """Plain single-process training on the global batches of `batch` rows."""
    model = _model(seed)
    model.compile(optimizer=OPTIMIZERS[kind](), loss="mse")
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def _assert_same_on_all_ranks(arrays):
    arrays = [np.asarray(a) for a in arrays]
    for other in hvd.allgather_object(arrays, name="test_tf_keras.same_on_all_ranks"):
        for a, b in zip(arrays, other):
            np.testing.assert_array_equal(a, b)


def _assert_close(actual, expected, tol=1e-5):
    assert len(actual) == len(expected)
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("wrapping", ["keras_wraps", "user_wraps"])
def test_mixed_float16_loss_scaling_reduces_each_gradient_once(kind, wrapping):
    """tf_keras under mixed_float16, both orders: compile wraps the DistributedOptimizer in a
    LossScaleOptimizer, which unscales the reduced gradients into new tensors before applying
    them; or the user passes DistributedOptimizer(LossScaleOptimizer(...)), as Horovod accepts.
    Each gradient is reduced once per step (twice, a Sum would be size^2 x the gradient): with
    op=Sum the weights follow one process at N x the learning rate on the global batch."""
    from tf_keras import mixed_precision
    previous = mixed_precision.global_policy()
    mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data()
        model, ref = _model(), _model()
        initial = ref.get_weights()
        inner = OPTIMIZERS[kind]()
        if wrapping == "user_wraps":
            inner = mixed_precision.LossScaleOptimizer(inner)
        model.compile(optimizer=hvd.DistributedOptimizer(inner, op=hvd.Sum), loss="mse")
        ref.compile(optimizer=OPTIMIZERS[kind](0.1 * N), loss="mse")
        assert "LossScaleOptimizer" in type(model.optimizer).__name__
        before = mlsl_tf.stats()["requests"]
        model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
        assert mlsl_tf.stats()["requests"] - before == STEPS * len(model.trainable_variables)  # once each
        ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
        moved = max(float(np.max(np.abs(r - i))) for r, i in zip(ref.get_weights(), initial))
        apart = max(float(np.max(np.abs(d - r))) for d, r in zip(model.get_weights(), ref.get_weights()))
        assert moved > 0.05 and apart < 0.05 * moved, (apart, moved)
        _assert_same_on_all_ranks(model.get_weights())
    finally:
        mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("wrapping", ["keras_wraps", "user_wraps"])
def test_mixed_float16_overflow_on_one_rank_is_skipped_on_every_rank(kind, wrapping):
    """tf_keras under mixed_float16, both orders: the last rank's batch overflows float16, the
    others' do not. The gradients are checked for inf/NaN after they are reduced, so every rank
    skips the step and halves its loss scale alike; the next, finite step is applied everywhere."""
    from tf_keras import mixed_precision
    previous = mixed_precision.global_policy()
    mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data(steps=2)
        model = _model()
        inner = OPTIMIZERS[kind]()
        if wrapping == "user_wraps":
            inner = mixed_precision.LossScaleOptimizer(inner)
        model.compile(optimizer=hvd.DistributedOptimizer(inner), loss="mse")
        lso = model.optimizer  # user_wraps: DistributedOptimizer made an LSO of its own from inner's config
        assert isinstance(lso, mixed_precision.LossScaleOptimizer)
        scale = float(lso.loss_scale)
        before = model.get_weights()
        xs, ys = _shard(x), _shard(y)
        bad = xs[:B] * (1e6 if R == N - 1 else 1.0)  # 1e6 is inf in float16
        model.train_on_batch(bad, ys[:B])
        _assert_close(model.get_weights(), before, tol=0)  # skipped everywhere
        assert float(lso.loss_scale) == scale / 2
        model.train_on_batch(xs[B:2 * B], ys[B:2 * B])
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), before)) > 0
        _assert_same_on_all_ranks(model.get_weights() + [np.float32(lso.loss_scale)])
    finally:
        mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_mixed_bfloat16_fit_matches_one_process(kind):
    """tf_keras under mixed_bfloat16 (bf16 compute, float32 variables): the float32 weights follow
    one process on the global batch under the same policy to within bf16's rounding."""
    from tf_keras import mixed_precision
    previous = mixed_precision.global_policy()
    mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        x, y = _data()
        model, ref = _model(), _model()
        assert model.layers[0].compute_dtype == "bfloat16" and model.layers[0].kernel.dtype == tf.float32
        initial = ref.get_weights()
        model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS[kind]()), loss="mse")
        ref.compile(optimizer=OPTIMIZERS[kind](), loss="mse")
        model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
        ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
        moved = max(float(np.max(np.abs(r - i))) for r, i in zip(ref.get_weights(), initial))
        apart = max(float(np.max(np.abs(d - r))) for d, r in zip(model.get_weights(), ref.get_weights()))
        assert moved > 0.05 and apart < 0.05 * moved, (apart, moved)
        _assert_same_on_all_ranks(model.get_weights())
    finally:
        mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_fit_matches_one_process_on_the_global_batch(kind):
    x, y = _data()
    model = _model()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[kind]())
    assert hvd.is_distributed(opt) and type(opt).__name__ == "SGD"
    model.compile(optimizer=opt, loss="mse")
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == STEPS
    _assert_close(model.get_weights(), _reference(kind, x, y, N * B))
    _assert_same_on_all_ranks(model.get_weights())


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_backward_passes_per_step_applies_the_mean_of_two_passes(kind):
    x, y = _data()
    model = _model()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[kind](), backward_passes_per_step=2, average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == STEPS  # every pass counts, as in Horovod
    assert int(opt._agg_helper.counter.numpy()) == 0
    # Two passes of B rows on N ranks = one step on 2*N*B rows, where the rows of pass 2 follow those of pass 1.
    order = np.concatenate([np.arange(s * N * B, (s + 1) * N * B) for s in range(STEPS)])
    pairs = order.reshape(STEPS // 2, 2, N, B).transpose(0, 2, 1, 3).reshape(-1)
    reference = _reference(kind, x[pairs], y[pairs], 2 * N * B)
    _assert_close(model.get_weights(), reference)
    _assert_same_on_all_ranks(model.get_weights())


def _reference_step(x, y, lr):
    model = _model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    tf_keras.optimizers.SGD(learning_rate=lr).apply_gradients(
        zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return model.get_weights()


@pytest.mark.parametrize("path", ["tape_then_apply", "compute_then_apply", "minimize"])
def test_each_path_reduces_exactly_once(path):
    """op=Sum with lr/N equals the global-batch step only if the gradients are summed once."""
    x, y = _data(steps=1)
    model = _model()
    opt = hvd.DistributedOptimizer(tf_keras.optimizers.SGD(learning_rate=0.1 / N), op=hvd.Sum)

    def loss():
        return tf.reduce_mean(tf.square(model(_shard(x)) - _shard(y)))

    if path == "tape_then_apply":
        with tf.GradientTape() as tape:
            value = loss()
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
    elif path == "compute_then_apply":
        opt.apply_gradients(opt._compute_gradients(loss, var_list=model.trainable_variables))
    else:
        opt.minimize(loss, model.trainable_variables)
    _assert_close(model.get_weights(), _reference_step(x, y, 0.1))


def test_groups_and_predivide_factor_give_the_same_weights():
    x, y = _data()
    model = _model()
    opt = hvd.DistributedOptimizer(OPTIMIZERS["legacy"](), num_groups=2, gradient_predivide_factor=2.0)
    model.compile(optimizer=opt, loss="mse")
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    _assert_close(model.get_weights(), _reference("legacy", x, y, N * B))
    _assert_same_on_all_ranks(model.get_weights())


def test_wrapping_an_optimizer_with_state_is_refused():
    model = _model()
    opt = tf_keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    with pytest.raises(ValueError, match="already has state"):
        hvd.DistributedOptimizer(opt)


def test_callbacks_broadcast_average_and_schedule():
    x, y = _data()
    model = _model(seed=R)  # different initial weights on every rank
    opt = hvd.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(learning_rate=0.1, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    seen = []

    class Record(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((float(self.model.optimizer.lr.numpy()), logs["loss"]))

    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    callbacks = [broadcast, hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=lambda e: 0.5 ** e), Record()]
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=3, shuffle=False, verbose=0, callbacks=callbacks)
    assert broadcast.broadcast_done
    np.testing.assert_allclose([lr for lr, _ in seen], [0.1, 0.05, 0.025], rtol=1e-6)
    losses = [loss for _, loss in seen]
    all_losses = hvd.allgather_object(losses, name="test_tf_keras.losses")
    assert all(other == losses for other in all_losses)  # MetricAverageCallback: the global mean everywhere
    _assert_same_on_all_ranks(model.get_weights() + [v.numpy() for v in opt.variables()])


def _fit_half(model, x, y, second):
    half = STEPS // 2 * B
    rows = slice(half, None) if second else slice(None, half)
    model.fit(_shard(x)[rows], _shard(y)[rows], batch_size=B, epochs=1, shuffle=False, verbose=0)


def _saved_and_loaded(model, name):
    directory = tempfile.mkdtemp(prefix=f"mlsl-tf-keras-{R}-")
    try:
        path = os.path.join(directory, name)
        model.save(path)
        return hvd.load_model(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_load_model_h5_round_trip_keeps_state_and_stays_distributed():
    x, y = _data()
    model = _model()
    model.compile(optimizer=hvd.DistributedOptimizer(tf_keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)),
                  loss="mse")
    _fit_half(model, x, y, second=False)
    loaded = _saved_and_loaded(model, "model.h5")
    assert isinstance(loaded, tf_keras.Model)
    assert hvd.is_distributed(loaded.optimizer)
    assert int(loaded.optimizer.iterations.numpy()) == STEPS // 2
    _assert_close([m.numpy() for m in loaded.optimizer.momentums], [m.numpy() for m in model.optimizer.momentums],
                  tol=0)
    for m in (model, loaded):  # both continue, distributed, on the second half
        _fit_half(m, x, y, second=True)
    _assert_close(loaded.get_weights(), model.get_weights(), tol=1e-6)
    _assert_close(model.get_weights(), _reference("new", x, y, N * B))
    _assert_same_on_all_ranks(loaded.get_weights())


def test_load_model_savedmodel_round_trip_stays_distributed():
    """tf_keras' SavedModel keeps the weights and the optimizer's config, not its slots (tf_keras
    itself starts a fresh optimizer); the loaded one is distributed and trains alike everywhere."""
    x, y = _data()
    model = _model()
    model.compile(optimizer=hvd.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(learning_rate=0.05)), loss="mse")
    _fit_half(model, x, y, second=False)
    loaded = _saved_and_loaded(model, "model")
    assert hvd.is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "SGD"
    assert loaded.optimizer.get_config()["learning_rate"] == pytest.approx(0.05)
    _assert_close(loaded.get_weights(), model.get_weights(), tol=0)
    for m in (model, loaded):
        _fit_half(m, x, y, second=True)
    _assert_close(loaded.get_weights(), model.get_weights(), tol=1e-6)  # plain SGD: no state to lose
    _assert_same_on_all_ranks(loaded.get_weights())


def test_sync_batch_norm_normalises_with_the_global_batch():
    from mlsl_tf.keras.sync_batch_norm import keras2_sync_batch_normalization
    cls = keras2_sync_batch_normalization()
    assert issubclass(cls, tf_keras.layers.BatchNormalization)
    rng = np.random.default_rng(1)
    # The same global batch on every rank; each rank's rows have their own mean, so local statistics differ.
    x = (rng.normal(size=(N * B, 3)) + np.repeat(np.arange(N), B)[:, None]).astype("float32")
    sync, plain = cls(momentum=0.5), tf_keras.layers.BatchNormalization(momentum=0.5)
    mine = sync(x[R * B:(R + 1) * B], training=True)
    everyone = plain(x, training=True)
    _assert_close([mine], [everyone[R * B:(R + 1) * B]])
    _assert_close(sync.get_weights(), plain.get_weights())  # moving mean and variance too
