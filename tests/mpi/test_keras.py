"""DistributedOptimizer, DistributedGradientTape and the Keras callbacks on N ranks.

Run under `mpiexec -n 2` and `-n 3`. Every reference is computed locally on each rank, without
collectives, by plain Keras on the concatenated global batch, so N-rank training must match it
step for step (SGD, so the match is exact up to float rounding)."""

import os
import shutil
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf.keras as hvd
from mlsl_tf.optimizer.dispatch import DistributedOptimizer, is_distributed
from mlsl_tf.tape import DistributedGradientTape

hvd.init()
N, R = hvd.size(), hvd.rank()
B = 4  # local batch
STEPS = 3


def _data(steps=STEPS, batch=B, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * N * batch, 4)).astype("float32")
    y = (np.tanh(x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")) + 0.1).astype("float32")
    return x, y


def _global_batch(a, s, batch=B):
    return a[s * N * batch:(s + 1) * N * batch]


def _local_batch(a, s, batch=B):
    return _global_batch(a, s, batch)[R * batch:(R + 1) * batch]


def _shard(a, batch=B):
    """This rank's rows of every global batch, in step order (what fit(shuffle=False) steps over)."""
    return np.concatenate([_local_batch(a, s, batch) for s in range(len(a) // (N * batch))])


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])


def _assert_same_on_all_ranks(arrays):
    arrays = [np.asarray(a) for a in arrays]
    for other in hvd.allgather_object(arrays, name="test.same_on_all_ranks"):
        for a, b in zip(arrays, other):
            np.testing.assert_array_equal(a, b)


def _assert_close(actual, expected, tol=1e-5):
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", ["plain", "num_groups", "groups", "predivide", "sum"])
def test_matches_single_process_step_for_step(case):
    x, y = _data()
    dist, ref = _model(), _model()
    lr = 0.1
    kwargs = {"num_groups": {"num_groups": 2}, "predivide": {"gradient_predivide_factor": 2.0},
              "sum": {"op": hvd.Sum}, "groups": {"groups": [dist.layers[0].trainable_variables]}}.get(case, {})
    dist.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9), **kwargs), loss="mse")
    # Sum adds N local means: the reference takes an N times larger step on the global mean.
    ref.compile(optimizer=keras.optimizers.SGD(lr * N if case == "sum" else lr, momentum=0.9), loss="mse")
    for s in range(STEPS):
        dist.train_on_batch(_local_batch(x, s), _local_batch(y, s))
        ref.train_on_batch(_global_batch(x, s), _global_batch(y, s))
        _assert_close(dist.get_weights(), ref.get_weights())
    _assert_same_on_all_ranks(dist.get_weights() + [v.numpy() for v in dist.optimizer.variables])


@pytest.mark.parametrize("path", ["fit", "no_overlap", "tape"])
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_policy_matches_single_process(policy, path):
    """Keras' mixed policies (bf16 or float16 compute, float32 variables) through
    DistributedOptimizer with the defaults (cross-iteration overlap; under mixed_float16 compile
    wraps it in a LossScaleOptimizer), without the overlap, and through DistributedGradientTape in
    a custom step with an explicit LossScaleOptimizer under mixed_float16: the float32 weights
    follow a single process on the global batch under the same policy to within the compute
    dtype's rounding -- a small fraction of what the steps moved them -- and are bit-identical on
    every rank."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        x, y = _data(steps=4)
        dist, ref = _model(), _model()
        assert dist.layers[0].compute_dtype == policy[len("mixed_"):] and dist.layers[0].kernel.dtype == "float32"
        initial = ref.get_weights()
        ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        if path == "tape":
            opt = keras.optimizers.SGD(0.1, momentum=0.9)
            if policy == "mixed_float16":
                opt = keras.optimizers.LossScaleOptimizer(opt)

            @tf.function
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((tf.cast(dist(xb, training=True), "float32") - yb) ** 2)
                    scaled = opt.scale_loss(loss) if policy == "mixed_float16" else loss
                grads = DistributedGradientTape(tape).gradient(scaled, dist.trainable_variables)
                assert all(g.dtype == tf.float32 for g in grads)
                opt.apply(grads, dist.trainable_variables)

            for s in range(4):
                step(_local_batch(x, s), _local_batch(y, s))
                ref.train_on_batch(_global_batch(x, s), _global_batch(y, s))
            state = [v.numpy() for v in opt.variables]
        else:
            dist.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                        cross_iteration=path == "fit"), loss="mse")
            assert isinstance(dist.optimizer, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
            dist.fit(_shard(x[:2 * N * B]), _shard(y[:2 * N * B]), batch_size=B, epochs=1, shuffle=False, verbose=0)
            for s in range(2):
                ref.train_on_batch(_global_batch(x, s), _global_batch(y, s))
            for s in range(2, 4):
                dist.train_on_batch(_local_batch(x, s), _local_batch(y, s))
                ref.train_on_batch(_global_batch(x, s), _global_batch(y, s))
            state = [v.numpy() for v in dist.optimizer.variables]
        moved = max(float(np.max(np.abs(r - i))) for r, i in zip(ref.get_weights(), initial))
        apart = max(float(np.max(np.abs(d - r))) for d, r in zip(dist.get_weights(), ref.get_weights()))
        assert moved > 0.05 and apart < 0.05 * moved, (apart, moved)
        assert all(w.dtype == np.float32 for w in dist.get_weights())
        _assert_same_on_all_ranks(dist.get_weights() + state)
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("cross_iteration", [True, False])
def test_mixed_float16_overflow_on_one_rank_is_skipped_on_every_rank(cross_iteration):
    """Keras 3 under mixed_float16: compile wraps the DistributedOptimizer in a
    LossScaleOptimizer, which checks its gradients for inf/NaN before the inner optimizer reduces
    them. The last rank's batch overflows float16, the others' do not: every rank skips that step
    and halves the loss scale (the ranks used to take different branches and stall), then the
    next, finite step is applied on every rank alike."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data(steps=2)
        model = _model()
        model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1), cross_iteration=cross_iteration),
                      loss="mse")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        scale = float(model.optimizer.initial_scale)  # dynamic_scale is made at the first step
        before = model.get_weights()
        bad_x = _local_batch(x, 0) * (1e6 if R == N - 1 else 1.0)  # 1e6 is inf in float16
        model.train_on_batch(bad_x, _local_batch(y, 0))
        _assert_close(model.get_weights(), before, tol=0)  # skipped everywhere
        assert float(model.optimizer.dynamic_scale.numpy()) == scale / 2
        model.train_on_batch(_local_batch(x, 1), _local_batch(y, 1))
        moved = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), before))
        assert moved > 0  # applied
        _assert_same_on_all_ranks(model.get_weights() + [model.optimizer.dynamic_scale.numpy()])
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("average", [True, False])
def test_backward_passes_per_step_matches_k_times_batch(average):
    k = 2
    x, y = _data(steps=2 * k)
    dist, ref = _model(), _model()
    dist.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=k,
                                                average_aggregated_gradients=average), loss="mse")
    # Without averaging the k accumulated means are summed: a k times larger step.
    ref.compile(optimizer=keras.optimizers.SGD(0.1 if average else 0.1 * k), loss="mse")
    for step in range(2):
        before = dist.get_weights()
        for p in range(k):
            if p > 0:
                _assert_close(dist.get_weights(), before, tol=0)  # only accumulating so far
            dist.train_on_batch(_local_batch(x, step * k + p), _local_batch(y, step * k + p))
        big = slice(step * k * N * B, (step + 1) * k * N * B)
        ref.train_on_batch(x[big], y[big])
        _assert_close(dist.get_weights(), ref.get_weights())
    assert int(dist.optimizer.iterations.numpy()) == 2
    _assert_same_on_all_ranks(dist.get_weights())


def test_fit_leaves_identical_weights_on_every_rank():
    x, y = _data(steps=4)
    model = _model(seed=10 + R)  # different initial weights on every rank
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=2, shuffle=True, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    _assert_same_on_all_ranks(model.get_weights() + [v.numpy() for v in model.optimizer.variables])


def test_broadcast_callback_makes_weights_and_optimizer_state_agree():
    x, y = _data(steps=2)
    model = _model(seed=20 + R)
    root_weights = hvd.broadcast_object(model.get_weights(), 0, name="test.root_weights")
    opt = DistributedOptimizer(keras.optimizers.SGD(0.0, momentum=0.5))
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    for m in opt.momentums:
        m.assign(tf.fill(m.shape, float(R + 1)))  # rank-specific optimizer state before fit
    opt.iterations.assign(7 * R)
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    # lr 0: m <- 0.5 m, w <- w + m, from root's weights and root's momentum (1.0), over 2 steps.
    _assert_close(model.get_weights(), [w + 0.75 for w in root_weights], tol=1e-6)
    for m in opt.momentums:
        np.testing.assert_allclose(m.numpy(), np.full(m.shape, 0.25, "float32"), atol=1e-7)
    assert int(opt.iterations.numpy()) == 2


def test_metric_average_gives_mean_over_ranks():
    logs = {"loss": float(R), "accuracy": np.float32(2.0 * R), "name": "not a number"}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs["loss"] == pytest.approx((N - 1) / 2) and logs["accuracy"] == pytest.approx(N - 1)
    assert logs["name"] == "not a number"

    x, y = _data(steps=2, seed=R + 1)  # different data on every rank, lr 0: fixed local losses
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse", metrics=["mae"])
    local = model.evaluate(_shard(x), _shard(y), batch_size=B, verbose=0, return_dict=True)
    history = model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.MetricAverageCallback()])
    every = hvd.allgather_object(local, name="test.local_metrics")
    for key in ("loss", "mae"):
        assert history.history[key][0] == pytest.approx(np.mean([d[key] for d in every]), rel=1e-5)


def test_learning_rate_warmup_and_schedule():
    x, y = _data(steps=2)
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), loss="mse")
    seen = []
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=4, shuffle=False, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(0.8, warmup_epochs=2),
        hvd.callbacks.LearningRateScheduleCallback(0.8, lambda e: 0.1 ** (e - 1), start_epoch=2),
        keras.callbacks.LambdaCallback(on_train_batch_begin=lambda b, logs: seen.append(
            float(np.asarray(model.optimizer.learning_rate))))])
    warm = [0.8 / N * ((e + b / 2 + 0.5) * (N - 1) / 2 + 1) for e in range(2) for b in range(2)]
    np.testing.assert_allclose(seen, warm + [0.08, 0.08, 0.008, 0.008], rtol=1e-5)


def test_save_load_continue_training():
    x, y = _data(steps=2)
    directory = hvd.broadcast_object(tempfile.mkdtemp() if R == 0 else None, 0, name="test.tmpdir")
    path = os.path.join(directory, "model.keras")
    try:
        model = _model()
        model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.ModelCheckpoint(path)])
        hvd.barrier()
        if R == 0:
            assert os.listdir(directory) == ["model.keras"]
        loaded = hvd.load_model(path)
        assert is_distributed(loaded.optimizer) and int(loaded.optimizer.iterations.numpy()) == 2
        _assert_close(loaded.get_weights(), model.get_weights(), tol=0)
        for m in (model, loaded):
            m.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
        _assert_close(loaded.get_weights(), model.get_weights(), tol=1e-6)
        _assert_same_on_all_ranks(loaded.get_weights())
    finally:
        hvd.barrier()
        if R == 0:
            shutil.rmtree(directory, ignore_errors=True)


def _embedding_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_embedding_gradients_match_dense_reference(sparse_as_dense):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 10, size=(STEPS * N * B, 3)).astype("int32")  # repeated ids across ranks
    y = rng.normal(size=(STEPS * N * B, 1)).astype("float32")
    dist, ref = _embedding_model(), _embedding_model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(dist(_local_batch(ids, 0)))
    assert isinstance(tape.gradient(loss, dist.layers[0].embeddings), tf.IndexedSlices)
    dist.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.5), sparse_as_dense=sparse_as_dense),
                 loss="mse")
    ref.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    for s in range(STEPS):
        dist.train_on_batch(_local_batch(ids, s), _local_batch(y, s))
        ref.train_on_batch(_global_batch(ids, s), _global_batch(y, s))
        _assert_close(dist.get_weights(), ref.get_weights())
    _assert_same_on_all_ranks(dist.get_weights())


def test_gradient_tape_custom_loop_matches_reference():
    x, y = _data()
    dist, ref = _model(), _model()
    dist_opt, ref_opt = keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.SGD(0.1, momentum=0.9)

    def make_step(model, opt, distributed):
        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
            if distributed:
                tape = DistributedGradientTape(tape, num_groups=1)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return step

    dist_step, ref_step = make_step(dist, dist_opt, True), make_step(ref, ref_opt, False)
    for s in range(STEPS):
        dist_step(_local_batch(x, s), _local_batch(y, s))
        ref_step(_global_batch(x, s), _global_batch(y, s))
        _assert_close(dist.get_weights(), ref.get_weights())
    _assert_same_on_all_ranks(dist.get_weights())


def test_two_optimizers_and_a_persistent_tape_in_one_step():
    """Default names stay unique when two reductions are traced into one tf.function."""
    x, y = _data()
    def small():
        keras.utils.set_random_seed(2)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), keras.layers.Dense(1)])

    models = {}
    for kind in ("opt", "tape", "ref"):
        models[kind + "_a"], models[kind + "_b"] = _model(1), small()
    opts = {k: keras.optimizers.SGD(0.1) for k in models}
    opts["opt_a"], opts["opt_b"] = DistributedOptimizer(opts["opt_a"]), DistributedOptimizer(opts["opt_b"])

    def make_step(a, b, wrap_tape):
        @tf.function
        def step(xb, yb):
            with tf.GradientTape(persistent=True) as tape:
                la = tf.reduce_mean((models[a](xb) - yb) ** 2)
                lb = tf.reduce_mean((models[b](xb) - yb) ** 2)
            if wrap_tape:
                tape = DistributedGradientTape(tape)
            for m, loss in ((a, la), (b, lb)):
                opts[m].apply(tape.gradient(loss, models[m].trainable_variables), models[m].trainable_variables)
        return step

    by_opts, by_tape, ref = make_step("opt_a", "opt_b", False), make_step("tape_a", "tape_b", True), \
        make_step("ref_a", "ref_b", False)
    for s in range(STEPS):
        by_opts(_local_batch(x, s), _local_batch(y, s))
        by_tape(_local_batch(x, s), _local_batch(y, s))
        ref(_global_batch(x, s), _global_batch(y, s))
        for k in ("a", "b"):
            _assert_close(models["opt_" + k].get_weights(), models["ref_" + k].get_weights())
            _assert_close(models["tape_" + k].get_weights(), models["ref_" + k].get_weights())


def test_broadcast_callback_for_a_model_built_in_its_first_step():
    """No Input: the weights appear inside the first step, and are broadcast right after it."""
    x, y = _data(steps=3)
    keras.utils.set_random_seed(30 + R)
    model = keras.Sequential([keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    assert not model.built
    model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert len(model.get_weights()) == 4
    _assert_same_on_all_ranks(model.get_weights() + [v.numpy() for v in model.optimizer.variables])


def test_checkpoint_written_by_rank_0_only():
    x, y = _data(steps=1)
    directory = tempfile.mkdtemp()  # each rank its own: what the other ranks would write shows
    try:
        model = _model()
        model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        model.fit(_shard(x), _shard(y), batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[
            hvd.callbacks.ModelCheckpoint(os.path.join(directory, "w-{epoch}.weights.h5"), save_weights_only=True)])
        assert sorted(os.listdir(directory)) == (["w-1.weights.h5", "w-2.weights.h5"] if R == 0 else [])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_keras_progress_output_only_on_rank_0_unless_asked(capfd):
    x, y = _data(steps=1)
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")

    def printed():
        capfd.readouterr()
        model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, verbose=2)
        model.summary()
        return capfd.readouterr().out

    try:
        out = printed()
        if R == 0:
            assert "loss:" in out and "Total params" in out
        else:
            assert out == ""
        hvd.set_progress_output("all")
        assert "loss:" in printed()
        hvd.set_progress_output([N - 1])
        assert ("loss:" in printed()) == (R == N - 1)
    finally:
        hvd.set_progress_output(0)
    with pytest.raises(ValueError, match="set_progress_output"):
        hvd.set_progress_output(N)
    with pytest.raises(ValueError, match="set_progress_output"):
        hvd.set_progress_output("rank0")


def test_top_level_init_in_a_keras_script_keeps_progress_on_rank_0(capfd):
    """`import mlsl_tf as hvd; hvd.init()` (not mlsl_tf.keras.init) with Keras imported."""
    import mlsl_tf
    x, y = _data(steps=1)
    model = _model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    hvd.set_progress_output("all")
    try:
        mlsl_tf.init()
        capfd.readouterr()
        model.fit(_shard(x), _shard(y), batch_size=B, epochs=1, verbose=2)
        out = capfd.readouterr().out
        assert ("loss:" in out) == (R == 0), out
    finally:
        hvd.set_progress_output(0)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "fit"])
def test_partial_optimizer_keeps_local_layers_local(graph):
    # a shared layer and a rank-local head: the head's update is this rank's gradient / size, the
    # shared layer's the average; SGD(1.0) makes the weight change equal the applied gradient
    r, n = hvd.rank(), hvd.size()
    shared, head = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"), \
        keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    model = keras.Sequential([keras.Input((1,)), shared, head])
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[head])
    x, y = np.full([1, 1], float(r + 1), np.float32), np.zeros([1, 1], np.float32)
    if graph:
        model.compile(optimizer=opt, loss=lambda t, p: keras.ops.sum(p))
        model.fit(x, y, epochs=1, batch_size=1, verbose=0)
    else:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    # d loss / d shared = head * x = r + 1; d loss / d head = shared * x = r + 1
    np.testing.assert_allclose(shared.kernel.numpy(), [[1.0 - (n + 1) / 2]], rtol=1e-6)
    np.testing.assert_allclose(head.kernel.numpy(), [[1.0 - (r + 1) / n]], rtol=1e-6)


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_sync_batch_norm_uses_the_global_batch(masked):
    import mlsl_tf
    r, n = hvd.rank(), hvd.size()
    rng = np.random.default_rng(7)
    data = [rng.normal(loc=3.0 * k, scale=1.0 + k, size=(2 + k, 5, 3)).astype(np.float32) for k in range(n)]
    masks = [np.arange(5)[None, :].repeat(2 + k, 0) < 3 + (k % 2) for k in range(n)]  # [batch, 5] per rank
    layer = mlsl_tf.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    out = layer(data[r], training=True, mask=masks[r] if masked else None).numpy()
    every = np.concatenate([d.reshape(-1, 3) for d in data])
    if masked:
        every = np.concatenate([d[m].reshape(-1, 3) for d, m in zip(data, masks)])
    mean, var = every.mean(0), every.var(0)
    np.testing.assert_allclose(layer.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.moving_variance.numpy(), var, rtol=1e-4, atol=1e-4)
    if not masked:
        np.testing.assert_allclose(out, (data[r] - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-4)
