"""Groups, model-parallel ops and layers at world size 1 (plain pytest): the world is the only
group, every parallel op is the identity with the identity's gradient, the parallel layers are
plain Dense layers, and bad input fails with errors that say what was wrong. The N-rank
behaviour is in tests/mpi/test_groups.py."""

import numpy as np
import pytest
import tensorflow as tf

import keras
import mlsl_tf as hvd
from mlsl_tf import parallel
from mlsl_tf.keras.layers import ColumnParallelDense, RowParallelDense


@pytest.fixture(scope="module", autouse=True)
def initialised():
    hvd.init()
    yield


def test_exports():
    for name in ["Group", "ProcessSet", "add_process_set", "remove_process_set", "global_process_set", "groups",
                 "parallel"]:
        assert name in dir(hvd) and getattr(hvd, name) is not None
    assert hvd.groups.grid is not None and hvd.parallel.all_gather is parallel.all_gather


def test_global_process_set():
    g = hvd.global_process_set
    assert (g.process_set_id, g.ranks, g.size(), g.rank(), g.included()) == (0, [0], 1, 0, True)
    assert hvd.process_sets() == [g] and hvd.process_set_by_id(0) is g
    assert hvd.remove_process_set(g) is False
    assert "process_set_id=0" in repr(g) and "ranks=[0]" in repr(g)


def test_process_set_validation():
    ps = hvd.ProcessSet([3, 1, 2])
    assert ps.ranks == [1, 2, 3] and ps.process_set_id is None
    assert ps.size() is None and ps.rank() is None
    # as Horovod: membership is known from the ranks, registered or not (this rank is 0)
    assert ps.included() is False and hvd.ProcessSet([0]).included() is True
    with pytest.raises(ValueError, match="list of ranks"):
        hvd.ProcessSet(3)
    with pytest.raises(ValueError, match="must be ints"):
        hvd.ProcessSet([0, 1.0])
    with pytest.raises(ValueError, match=r"\[1\] appear more than once"):
        hvd.ProcessSet([1, 0, 1])
    with pytest.raises(ValueError, match=r"rank 0: group rank 1 is out of range for 1 ranks"):
        hvd.Group([0, 1])
    with pytest.raises(ValueError, match="at least one rank"):
        hvd.add_process_set([])
    with pytest.raises(ValueError, match=r"a group of ranks \[0\] already exists \(process set id 0\)"):
        hvd.Group([0])  # the world


def test_unregistered_or_bad_group_in_an_op():
    with pytest.raises(ValueError, match="is not registered"):
        hvd.allreduce(tf.ones([2]), group=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match="expected a group"):
        hvd.allgather(tf.ones([2]), group="world")
    with pytest.raises(ValueError, match="either process_set= or group="):
        hvd.broadcast(tf.ones([2]), 0, process_set=0, group=hvd.global_process_set)
    with pytest.raises(ValueError, match="no registered group has id 5"):
        hvd.process_set_by_id(5)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_every_op_takes_group(graph):
    g = hvd.global_process_set

    def body():
        x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
        return [hvd.allreduce(x, group=g), hvd.grouped_allreduce([x], group=g)[0], hvd.allgather(x, group=g),
                hvd.broadcast(x, 0, group=g), hvd.alltoall(x, group=g), hvd.reducescatter(x, group=g),
                hvd.allreduce(x, process_set=g, group=g)]

    outs = (tf.function(body) if graph else body)()
    for out in outs:
        np.testing.assert_allclose(out.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    hvd.barrier(group=g)


def test_grid_on_one_rank():
    mp, dp = hvd.groups.grid(model_parallel=1)
    assert mp is hvd.global_process_set and dp is hvd.global_process_set
    assert hvd.groups.grid(1).model_parallel is mp
    with pytest.raises(ValueError, match="world size 1 is not a multiple of model_parallel=2"):
        hvd.groups.grid(model_parallel=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="model_parallel must be a positive int"):
            hvd.groups.grid(model_parallel=bad)


OPS = {
    "all_gather": lambda x, g: parallel.all_gather(x, axis=1, group=g),
    "reduce_scatter": lambda x, g: parallel.reduce_scatter(x, axis=-1, group=g),
    "reduce_scatter_avg": lambda x, g: parallel.reduce_scatter(x, axis=0, group=g, op=hvd.Average),
    "all_reduce": lambda x, g: parallel.all_reduce(x, group=g),
    "all_to_all": lambda x, g: parallel.all_to_all(x, 2, 0, group=g),
    "copy_to_group": lambda x, g: parallel.copy_to_group(x, group=g),
    "reduce_from_group": lambda x, g: parallel.reduce_from_group(x, group=g),
    "scatter_to_group": lambda x, g: parallel.scatter_to_group(x, axis=1, group=g),
    "gather_from_group": lambda x, g: parallel.gather_from_group(x, axis=0, group=g),
}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("group", [None, "global"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_parallel_ops_are_identity_on_one_rank(op, group, graph):
    g = hvd.global_process_set if group == "global" else None
    x = tf.reshape(tf.range(24, dtype=tf.float32), [2, 3, 4]) / 10

    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = OPS[op](x, g)
            loss = tf.reduce_sum(tf.sin(y))
        return y, tape.gradient(loss, x)

    y, grad = (tf.function(body) if graph else body)(x)
    assert y.shape == x.shape
    np.testing.assert_allclose(y.numpy(), x.numpy())
    np.testing.assert_allclose(grad.numpy(), np.cos(x.numpy()), rtol=1e-6)


def test_parallel_op_errors():
    with pytest.raises(ValueError, match="all_gather: axis 3 is out of range for a tensor of rank 3"):
        parallel.all_gather(tf.ones([2, 3, 4]), axis=3)
    with pytest.raises(ValueError, match="scatter_to_group: needs a tensor with at least one dimension"):
        parallel.scatter_to_group(tf.constant(1.0))
    with pytest.raises(ValueError, match="reduce_scatter: op must be"):
        parallel.reduce_scatter(tf.ones([2]), op=hvd.Max)
    with pytest.raises(ValueError, match="all_reduce: op must be"):
        parallel.all_reduce(tf.ones([2]), op=hvd.Min)
    with pytest.raises(ValueError, match="is not registered"):
        parallel.copy_to_group(tf.ones([2]), group=hvd.ProcessSet([0]))


def seeded(seed):
    return keras.initializers.GlorotUniform(seed=seed)


def test_parallel_mlp_equals_dense_on_one_rank():
    x = np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32)
    y = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    model = keras.Sequential([
        keras.Input((5,)),
        ColumnParallelDense(8, gather_output=False, activation="relu", kernel_initializer=seeded(1)),
        RowParallelDense(6, input_is_parallel=True, activation="tanh", kernel_initializer=seeded(2),
                         bias_initializer="ones"),
        RowParallelDense(4, kernel_initializer=seeded(3)),
        ColumnParallelDense(3, kernel_initializer=seeded(4), use_bias=False),
    ])
    ref = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="relu", kernel_initializer=seeded(1)),
        keras.layers.Dense(6, activation="tanh", kernel_initializer=seeded(2), bias_initializer="ones"),
        keras.layers.Dense(4, kernel_initializer=seeded(3)),
        keras.layers.Dense(3, kernel_initializer=seeded(4), use_bias=False),
    ])
    for a, b in zip(model.weights, ref.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(model(x).numpy(), ref(x).numpy(), rtol=1e-6)
    model.compile(optimizer=hvd.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), group=hvd.global_process_set),
                  loss="mse")
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    got = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    want = ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(model.weights, ref.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_layer_seed_defaults_and_shapes():
    a, b = ColumnParallelDense(4), ColumnParallelDense(4)
    assert a.seed != b.seed  # each layer its own seed, from the construction order
    a.build((None, 3))
    again = ColumnParallelDense(4, seed=a.seed)
    again.build((None, 3))
    np.testing.assert_array_equal(a.kernel.numpy(), again.kernel.numpy())
    assert a.compute_output_shape((None, 7, 3)) == (None, 7, 4)
    assert ColumnParallelDense(4, gather_output=False).compute_output_shape((2, 3)) == (2, 4)
    assert RowParallelDense(5, input_is_parallel=True).compute_output_shape((2, 3)) == (2, 5)
    y = a(tf.ones([2, 7, 3]))  # inputs of rank > 2
    assert y.shape == (2, 7, 4)


def test_layer_errors():
    with pytest.raises(ValueError, match="units must be a positive int"):
        ColumnParallelDense(0)
    with pytest.raises(ValueError, match="units must be a positive int"):
        RowParallelDense(2.5)
    with pytest.raises(ValueError, match=r"no registered group has ranks \[0, 1\]"):
        RowParallelDense(2, group=[0, 1])


def test_layers_save_and_load(tmp_path):
    model = keras.Sequential([keras.Input((4,)), ColumnParallelDense(6, gather_output=False, activation="relu"),
                              RowParallelDense(2, input_is_parallel=True)])
    path = str(tmp_path / "mp.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)
    assert isinstance(loaded.layers[0], ColumnParallelDense) and loaded.layers[0].gather_output is False
    assert loaded.layers[1].input_is_parallel is True and loaded.layers[1].group is None  # the world
