"""Ranks that disagree get an error on every rank, naming the tensor and what differs --
never a hang. Shutdown on one rank fails the others' pending collectives, and init works
again afterwards."""

import time

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()


def expect_error(fn, *patterns):
    start = time.monotonic()
    with pytest.raises(tf.errors.OpError) as info:
        fn()
    assert time.monotonic() - start < 10, "the error took too long to arrive"
    for p in patterns:
        assert p in str(info.value), f"{p!r} not in {info.value}"


MODES = ["eager", "graph"]


def run(mode, fn, *args):
    return tf.function(fn)(*args) if mode == "graph" else fn(*args)


@pytest.mark.parametrize("mode", MODES)
def test_shape_mismatch(mode):
    expect_error(lambda: run(mode, lambda t: hvd.allreduce(t, name=f"bad_shape.{mode}"), tf.ones([2 + (R == N - 1)])),
                 f"'bad_shape.{mode}'", "shape [2] on rank 0 vs [3] on rank " + str(N - 1))


@pytest.mark.parametrize("mode", MODES)
def test_dtype_mismatch(mode):
    x = tf.ones([2], tf.float32 if R == 0 else tf.float64)
    expect_error(lambda: run(mode, lambda t: hvd.allreduce(t, name=f"bad_dtype.{mode}"), x),
                 f"'bad_dtype.{mode}'", "dtype float32 on rank 0 vs float64 on rank 1")


@pytest.mark.parametrize("mode", MODES)
def test_op_mismatch(mode):
    op = hvd.Sum if R == 0 else hvd.Max
    expect_error(lambda: run(mode, lambda t: hvd.allreduce(t, op=op, name=f"bad_op.{mode}"), tf.ones([2])),
                 f"'bad_op.{mode}'", "reduction Sum on rank 0 vs Max on rank 1")


@pytest.mark.parametrize("mode", MODES)
def test_collective_kind_mismatch(mode):
    name = f"bad_kind.{mode}"
    fn = (lambda t: hvd.allreduce(t, name=name)) if R == 0 else (lambda t: hvd.allgather(t, name=name))
    expect_error(lambda: run(mode, fn, tf.ones([2])), f"'{name}'", "operation allreduce on rank 0 vs allgather on rank 1")


@pytest.mark.parametrize("mode", MODES)
def test_root_mismatch(mode):
    expect_error(lambda: run(mode, lambda t: hvd.broadcast(t, root_rank=R, name=f"bad_root.{mode}"), tf.ones([2])),
                 f"'bad_root.{mode}'", "root_rank 0 on rank 0 vs 1 on rank 1")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_count_mismatch(mode):
    xs = [tf.ones([2])] * (2 if R == 0 else 3)
    expect_error(lambda: run(mode, lambda *t: hvd.grouped_allreduce(list(t), name=f"bad_group.{mode}"), *xs),
                 f"'bad_group.{mode}'", "on rank 0 vs", "on rank 1")


def test_scale_mismatch():
    expect_error(lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, prescale_factor=1.0 + R, name="bad_scale"),
                 "'bad_scale'", "on rank 0 vs", "on rank 1")


def test_reducescatter_dtype_mismatch():
    x = tf.ones([2 * N], tf.float32 if R == 0 else tf.int32)
    expect_error(lambda: hvd.reducescatter(x, op=hvd.Sum, name="bad_rs"), "'bad_rs'",
                 "dtype float32 on rank 0 vs int32 on rank 1")


def test_allgather_trailing_shape_mismatch():
    expect_error(lambda: hvd.allgather(tf.ones([2, 2 + (R == 1)]), name="bad_gather"),
                 "'bad_gather'", "shape after the first dimension [2] on rank 0 vs [3] on rank 1")


def test_bad_splits_on_one_rank():
    splits = [1] * N if R == 1 else [2] * N  # rank 1's splits do not sum to its first dimension
    expect_error(lambda: hvd.alltoall(tf.ones([2 * N]), splits=splits, name="bad_splits"),
                 "rank 1: alltoall splits sum to", "'bad_splits'")


def test_root_out_of_range():
    expect_error(lambda: hvd.broadcast(tf.ones([1]), root_rank=N, name="bad_range"), "root_rank", "out of range")


def test_mismatch_in_graph_mode_and_recovery():
    @tf.function
    def f(x):
        return hvd.allreduce(x, name="graph_bad")

    expect_error(lambda: f(tf.ones([1 + R])), "'graph_bad'", "shape [1] on rank 0 vs [2] on rank 1")
    # the same name with agreeing shapes works afterwards
    np.testing.assert_allclose(f(tf.ones([4])).numpy(), np.ones(4))


def test_changed_shape_under_cached_name():
    for step in range(3):
        hvd.allreduce(tf.ones([3]), name="cached")
    expect_error(lambda: hvd.allreduce(tf.ones([3 + (R == 1)]), name="cached"), "shape [3] on rank 0 vs [4] on rank 1")


def test_shutdown_fails_peers_and_init_again():
    if R == 1:
        time.sleep(0.3)
        hvd.shutdown()
        assert not hvd.is_initialized()
        with pytest.raises(tf.errors.FailedPreconditionError, match="not been initialised"):
            hvd.allreduce(tf.ones([1]), name="after_shutdown")
    else:
        expect_error(lambda: hvd.allreduce(tf.ones([1]), name="orphan"), "rank 1 shut down", "'orphan'")
        hvd.shutdown()
    hvd.init()
    assert hvd.size() == N
    np.testing.assert_allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="again").numpy(), [N, N])


def test_join_returns_last_rank():
    if R == 0:
        assert hvd.join() == N - 1
    else:
        time.sleep(0.1 * R)
        # rank 0 has joined and contributes zeros
        got = hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum, name=f"while_joined")
        assert got.numpy()[0] == sum(range(1, N))
        time.sleep(0.3 * (R - 1))  # the allreduce finished everywhere at once: join in rank order
        assert hvd.join() == N - 1


def test_join_in_tf_function():
    """join works inside a tf.function too (a tensor there), with the same answer on every rank."""
    time.sleep(0.5 * R)  # join in rank order
    last = tf.function(hvd.join)()
    assert isinstance(last, tf.Tensor) and last.dtype == tf.int32
    assert int(last) == N - 1
    assert hvd.allgather_object(int(last)) == [N - 1] * N


@pytest.mark.parametrize("name,mine", [("MLSL_TF_RING_BYTES", "0"), ("MLSL_TF_CHUNK_BYTES", "65536"),
                                       ("MLSL_TF_PRIORITY", "fifo"), ("MLSL_TF_CACHE_CAPACITY", "64"),
                                       ("MLSL_TF_EAGER_BYTES", "0"), ("MLSL_TF_WIRE_DTYPE", "bfloat16")])
def test_settings_that_shape_collectives_must_agree(name, mine):
    """One rank with a different chunk size, ring threshold or order would start other MPI
    operations than its peers: init() fails on every rank, naming the setting and the values."""
    import os
    default = hvd.settings()[name].default
    try:
        if R == N - 1:
            os.environ[name] = mine
        hvd.shutdown()
        with pytest.raises(RuntimeError, match=f"{name} must be the same on every rank") as e:
            hvd.init()
        assert f"rank {N - 1} has {mine}" in str(e.value) and f"rank 0 has {default}" in str(e.value)
        assert not hvd.is_initialized()
    finally:
        os.environ.pop(name, None)
        hvd.init()
    np.testing.assert_allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum, name=f"agreed.{name}").numpy(), [N, N])


def test_wire_dtype_aliases_agree():
    """bf16 and bfloat16 name the same wire: init() accepts them on different ranks."""
    import os
    try:
        os.environ["MLSL_TF_WIRE_DTYPE"] = "bf16" if R == 0 else "bfloat16"
        hvd.shutdown()
        hvd.init()
        assert hvd.is_initialized()
    finally:
        os.environ.pop("MLSL_TF_WIRE_DTYPE", None)
        hvd.shutdown()
        hvd.init()
