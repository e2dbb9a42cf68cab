"""Keras 3 ports of the Horovod 0.28.1 tests that only Keras 2 names keep from running as written
(tests/horovod_suite/skips.py names the port of each), and tests of the Horovod names added for
that suite: elastic state, BroadcastGlobalVariablesCallback(local_variables=), 16-bit integer
collectives, broadcast_object / allgather_object in TF1 graphs. Run under mpiexec -n 2 and -n 3."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd
import mlsl_tf.keras as hvd_keras

hvd.init()
N, R = hvd.size(), hvd.rank()


def _same_on_every_rank(value):
    value = np.asarray(value)
    gathered = hvd.allgather(tf.constant(value[None])).numpy()
    for other in gathered:
        np.testing.assert_array_equal(other, value)


class AddGradient(keras.optimizers.Optimizer):
    """variable += gradient: the applied (reduced, aggregated) gradient is the weight change."""

    def __init__(self, name="add_gradient", **kwargs):
        kwargs.setdefault("learning_rate", 0.1)
        super().__init__(name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        variable.assign_add(tf.convert_to_tensor(gradient))


class SetGradient(AddGradient):
    """variable = gradient: the weight shows exactly the last gradient applied."""

    def update_step(self, gradient, variable, learning_rate):
        variable.assign(tf.convert_to_tensor(gradient))


# Port of test_gradient_aggregation / test_gradient_aggregation_with_local_vars: OptimizerV2's
# _compute_gradients and _create_slots become a tape and Keras 3's update_step; tf.gather still
# makes IndexedSlices gradients. Keras 3's `iterations` counts applied updates (as with its own
# gradient_accumulation_steps), where Keras 2 Horovod counted backward passes.
@pytest.mark.parametrize("local_vars", [False, True], ids=["shared", "local_vars"])
@pytest.mark.parametrize("average", [True, False], ids=["average", "sum"])
def test_gradient_aggregation(average, local_vars):
    k, total, num_local = 4, 8, (4 if local_vars else 0)
    opt = hvd.DistributedOptimizer(AddGradient(), backward_passes_per_step=k,
                                   average_aggregated_gradients=average, sparse_as_dense=True)
    xs = [tf.Variable([0.0]) for _ in range(total)]
    ys = [tf.Variable([1.0, 2.0]) for _ in range(total)]
    for i in range(num_local):
        opt.register_local_var(xs[i])
        opt.register_local_var(ys[i])
    variables = xs + ys
    factor = float(R + 1) if local_vars else 1.0

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.stack(xs) - factor * tf.gather(tf.stack(ys), [0], axis=1)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))

    for idx in range(10):
        step()
        applied = (idx + 1) // k * (1 if average else k)
        # shared variables: the gradient averaged over ranks; local: this rank's, divided by size
        mean_factor = (N + 1) / 2 if local_vars else 1.0
        expect_x = [applied * (1.0 / N if i < num_local else 1.0) for i in range(total)]
        expect_y0 = [1.0 - applied * ((R + 1) / N if i < num_local else mean_factor) for i in range(total)]
        np.testing.assert_allclose([x.numpy()[0] for x in xs], expect_x, rtol=1e-6)
        np.testing.assert_allclose([y.numpy()[0] for y in ys], expect_y0, rtol=1e-6)
        np.testing.assert_allclose([y.numpy()[1] for y in ys], [2.0] * total)
        assert int(opt.iterations.numpy()) == (idx + 1) // k


# Port of test_grad_aggregation_with_inf_grad: an infinite gradient in the first aggregation
# cycle must not leak into the second (the accumulators are cleared after each apply).
def test_aggregation_clears_an_infinite_gradient_after_apply():
    opt = hvd.DistributedOptimizer(SetGradient(), backward_passes_per_step=2, sparse_as_dense=True)
    x = tf.Variable(1.0)
    passes = tf.Variable(0)

    @tf.function
    def step():
        passes.assign_add(1)
        with tf.GradientTape() as tape:
            loss = tf.cond(passes > 1, lambda: 3.0 * x, lambda: x * float("inf"))
        opt.apply_gradients([(tape.gradient(loss, x), x)])

    step(), step()
    assert np.isinf(x.numpy())  # the first cycle applied inf + 3
    step(), step()
    assert x.numpy() == 6.0  # 3 + 3: nothing of the first cycle is left


# Port of test_sparse_as_dense and test_sparse_as_dense_with_grad_aggregation: RMSprop(lr=) and
# Embedding(input_length=) are Keras 2 names; the behaviour is the same.
@pytest.mark.parametrize("passes", [1, 2])
def test_sparse_as_dense_embedding_trains_alike_on_every_rank(passes):
    keras.utils.set_random_seed(7)  # same initial weights on every rank
    model = keras.Sequential([keras.Input((10,), dtype="int32"), keras.layers.Embedding(1000, 64)])
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.RMSprop(learning_rate=0.01), sparse_as_dense=True,
                                         backward_passes_per_step=passes)
    model.compile(loss="mse", optimizer=opt)
    rng = np.random.default_rng(R)
    x, y = rng.integers(1000, size=(32, 10)), rng.random((32, 10, 64)).astype("float32")
    before = model.get_weights()[0].copy()
    for _ in range(3):
        model.train_on_batch(x, y)
    after = model.get_weights()[0]
    assert not np.allclose(before, after)
    _same_on_every_rank(after)


# Port of test_train_model_lr_schedule: ThresholdedReLU, keras.losses.mean_squared_error,
# experimental_run_tf_function and optimizer.lr are Keras 2 names.
def test_train_model_lr_schedule():
    initial_lr = 0.1 * N
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.Adam())
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.RepeatVector(3),
                              keras.layers.ReLU(threshold=0.5)])
    model.compile(loss="mse", optimizer=opt, metrics=["categorical_accuracy"])
    rng = np.random.default_rng(R)
    x, y = rng.random((10, 3)), rng.random((10, 3, 2))
    seen = {}

    class StoreLearningRate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch] = float(np.asarray(self.model.optimizer.learning_rate))

    history = model.fit(x, y, steps_per_epoch=5, epochs=20, verbose=0, callbacks=[
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd_keras.callbacks.MetricAverageCallback(),
        hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=5),
        hvd_keras.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-1, start_epoch=5,
                                                         end_epoch=10),
        hvd_keras.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-2, start_epoch=10,
                                                         end_epoch=15),
        hvd_keras.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=lambda e: e,
                                                         start_epoch=15, end_epoch=20),
        StoreLearningRate()])
    for epoch, lr in seen.items():
        if epoch < 5:
            assert lr <= initial_lr * (1 + 1e-6)
        elif 5 < epoch < 10:
            assert lr == pytest.approx(initial_lr * 1e-1, rel=1e-5)
        elif 10 < epoch < 15:
            assert lr == pytest.approx(initial_lr * 1e-2, rel=1e-5)
        elif epoch >= 15:
            assert lr == pytest.approx(initial_lr * epoch, rel=1e-5)
    _same_on_every_rank(np.asarray(history.history["loss"], np.float32))  # the averaged metric


def test_elastic_tensorflow_state_sync_restore_commit():
    v = 1.0 if R == 0 else 2.0
    variables = [tf.Variable(np.full((2, 2), v)), tf.Variable(np.full((2,), v))]
    state = hvd.elastic.TensorFlowState(variables, batch=20 + R, epoch=10 + R)
    state.sync()
    for var in variables:
        np.testing.assert_allclose(var.numpy(), 1.0)
    assert (state.batch, state.epoch) == (20, 10)
    variables[0].assign(np.full((2, 2), 5.0))
    state.batch, state.epoch = 21, 11
    state.restore()
    np.testing.assert_allclose(variables[0].numpy(), 1.0)
    assert (state.batch, state.epoch) == (20, 10)
    variables[0].assign(np.full((2, 2), 5.0))
    state.batch = 21
    state.commit()
    state.restore()
    np.testing.assert_allclose(variables[0].numpy(), 5.0)
    assert state.batch == 21


def test_elastic_run_syncs_before_calling():
    var = tf.Variable(float(R))
    state = hvd.elastic.TensorFlowState([var], epoch=R)

    @hvd.elastic.run
    def train(state, scale):
        return var.numpy() * scale, state.epoch

    assert train(state, 3.0) == (0.0, 0)


def test_elastic_keras_state_and_callbacks():
    keras.utils.set_random_seed(R)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    opt = keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
    opt.iterations.assign(5 + R)
    state = hvd_keras.elastic.KerasState(model, opt, batch=0, epoch=R)
    state.sync()
    _same_on_every_rank(np.concatenate([w.ravel() for w in model.get_weights()]))
    assert int(opt.iterations.numpy()) == 5 and state.epoch == 0
    saved = model.get_weights()
    model.compile(optimizer=opt, loss="mse")
    x, y = np.ones((8, 2), np.float32), np.zeros((8, 2), np.float32)
    model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[
        hvd_keras.elastic.UpdateBatchStateCallback(state), hvd_keras.elastic.UpdateEpochStateCallback(state)])
    assert (state.epoch, state.batch) == (2, 0)
    state.restore()  # back to the synced weights and epoch 0: fit did not commit
    for a, b in zip(model.get_weights(), saved):
        np.testing.assert_allclose(a, b)
    assert state.epoch == 0
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[
        hvd_keras.elastic.UpdateEpochStateCallback(state), hvd_keras.elastic.CommitStateCallback(state)])
    state.restore()
    assert state.epoch == 1 and not np.allclose(model.get_weights()[0], saved[0])


def test_keras_state_needs_a_built_model():
    with pytest.raises(ValueError, match="must be built"):
        hvd_keras.elastic.KerasState(keras.Sequential([keras.layers.Dense(2)]))


def test_broadcast_callback_keeps_local_variables():
    root = N - 1
    init = keras.initializers.Constant(float(R))
    model = keras.Sequential([keras.Input((3,))] + [
        keras.layers.Dense(3, kernel_initializer=init, bias_initializer=init, trainable=False) for _ in range(3)])
    model.compile(loss="mse")
    local = list(model.layers[0].variables)
    model.fit(np.ones((1, 3)), np.ones((1, 3)), verbose=0, callbacks=[
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(root_rank=root, local_variables=local)])
    for var in model.variables:
        expected = float(R) if any(var is v for v in local) else float(root)
        np.testing.assert_allclose(np.asarray(var), expected)


@pytest.mark.parametrize("dtype", [tf.int16, tf.uint16])
def test_sixteen_bit_integers(dtype):
    x = tf.cast(tf.range(6) + 10 * R, dtype)
    gathered = hvd.allgather(x).numpy()
    np.testing.assert_array_equal(gathered, np.concatenate([np.arange(6) + 10 * r for r in range(N)]))
    assert gathered.dtype == dtype.as_numpy_dtype
    np.testing.assert_array_equal(hvd.broadcast(x, N - 1).numpy(), np.arange(6) + 10 * (N - 1))
    got = hvd.alltoall(tf.cast(tf.fill([N], 100 * R), dtype)).numpy()
    np.testing.assert_array_equal(got, [100 * r for r in range(N)])
    summed = hvd.allreduce(x, op=hvd.Sum).numpy()
    np.testing.assert_array_equal(summed, N * np.arange(6) + 10 * sum(range(N)))
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Max).numpy(), np.arange(6) + 10 * (N - 1))


@pytest.mark.parametrize("session", ["default", "none"])
def test_objects_in_a_tf1_graph(session):
    with tf.Graph().as_default():
        if session == "default":
            with tf.compat.v1.Session().as_default():
                got = hvd.broadcast_object({"rank": R, "x": [1, R]} if R == 0 else None, root_rank=0)
                every = hvd.allgather_object({"r": R})
        else:
            got = hvd.broadcast_object({"rank": R, "x": [1, R]} if R == 0 else None, root_rank=0)
            every = hvd.allgather_object({"r": R})
    assert got == {"rank": 0, "x": [1, 0]}
    assert every == [{"r": r} for r in range(N)]


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_inplace_broadcast_in_a_tf1_graph(use_resource):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        v = tf.compat.v1.Variable(tf.fill([3], float(R)), use_resource=use_resource)
        sess.run(v.initializer)
        out, = hvd.broadcast_([v], N - 1)
        np.testing.assert_array_equal(sess.run(out), [N - 1.0] * 3)
        np.testing.assert_array_equal(sess.run(v), [N - 1.0] * 3)
