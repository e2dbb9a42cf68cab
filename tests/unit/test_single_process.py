"""World size 1 (plain pytest, no mpiexec): every op works and is the identity it should be,
in eager mode and in tf.function; the process-level API behaves as Horovod's does."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]


@pytest.fixture(scope="module", autouse=True)
def initialised():
    hvd.init()
    yield


def run_python(code, timeout=120, env=None):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_world_of_one():
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == \
        (0, 1, 0, 1, 0, 1)
    assert hvd.is_initialized()
    hvd.init()  # twice is harmless
    assert hvd.size() == 1


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_op_is_identity_on_one_rank(graph, dtype):
    x = tf.cast(tf.reshape(tf.range(6), [3, 2]), dtype)

    def ops(x):
        return (hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Max), hvd.grouped_allreduce([x, x], op=hvd.Sum),
                hvd.allgather(x), hvd.broadcast(x, 0), hvd.alltoall(x), hvd.reducescatter(x, op=hvd.Sum))

    outs = (tf.function(ops) if graph else ops)(x)
    flat = [outs[0], outs[1], *outs[2], *outs[3:]]
    for out in flat:
        assert out.dtype == dtype
        np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(), tf.cast(x, tf.float64).numpy())


def test_scaling_and_average_on_one_rank():
    x = tf.constant([2.0, 4.0])
    np.testing.assert_allclose(hvd.allreduce(x).numpy(), [2.0, 4.0])  # Average is the default
    np.testing.assert_allclose(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25).numpy(),
                               [1.0, 2.0])
    np.testing.assert_allclose(hvd.allreduce(x, average=False).numpy(), [2.0, 4.0])
    with pytest.raises(ValueError, match="either op= or"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    # Adasum over one rank is the tensor itself, scaled (prescale, then postscale)
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25).numpy(),
                                  [1.0, 2.0])


def test_indexed_slices_and_compression():
    s = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([3]), dense_shape=tf.constant([5, 2]))
    out = hvd.allreduce(s, op=hvd.Sum)
    assert isinstance(out, tf.IndexedSlices)
    np.testing.assert_array_equal(out.indices.numpy(), [3])
    x = tf.constant([1.5, -2.25], tf.float32)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy(), x.numpy())


def test_objects_variables_barrier_join():
    assert hvd.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
    assert hvd.allgather_object("x") == ["x"]
    v = tf.Variable([1.0, 2.0])
    hvd.broadcast_variables([v], root_rank=0)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    hvd.barrier()
    assert hvd.join() == 0


def test_gradients_on_one_rank():
    x = tf.constant([1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        a = tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum) * 3.0)
        b = tf.reduce_sum(hvd.allgather(x) * 2.0)
        c = tf.reduce_sum(hvd.broadcast(x, 0) * 4.0)
    np.testing.assert_allclose(tape.gradient(a, x).numpy(), [3.0, 3.0])
    np.testing.assert_allclose(tape.gradient(b, x).numpy(), [2.0, 2.0])
    np.testing.assert_allclose(tape.gradient(c, x).numpy(), [4.0, 4.0])


def test_bad_input_errors():
    # Checked by the ranks together (the negotiation), reported as Horovod does: an invalid input
    # is InvalidArgument (submissions that disagree between ranks are FailedPrecondition)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rank >= 1"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="root_rank 3 is out of range"):
        hvd.broadcast(tf.ones([1]), root_rank=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits sum to 1 but the first dimension is 2"):
        hvd.alltoall(tf.ones([2]), splits=[1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in the list of allowed values"):
        hvd.allreduce(tf.constant(["a"]))
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(tf.ones([1]), op=42)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="must be rank 1|must be a vector"):
        hvd.alltoall(tf.ones([2, 2]), splits=[[1], [1]])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="must be rank 1|must be a vector"):
        tf.function(lambda x: hvd.alltoall(x, splits=[[2]]))(tf.ones([2]))


def test_settings_come_from_the_library():
    s = hvd.settings()
    assert "MLSL_TF_HEARTBEAT_MS" in s
    default, doc, value, allowed = s["MLSL_TF_HEARTBEAT_MS"]
    assert default == "10" and doc and allowed == "an integer from 1 to 60000"
    assert "KiB" in s["MLSL_TF_CHUNK_BYTES"].allowed
    assert s["MLSL_TF_PRIORITY"].allowed == "one of priority, fifo"


BAD_SETTINGS = [
    ("MLSL_TF_CHUNK_BYTES", "abc", "a size in bytes from 256"),
    ("MLSL_TF_CHUNK_BYTES", "0", "a size in bytes from 256"),
    ("MLSL_TF_CHUNK_BYTES", "1e6", "a size in bytes from 256 to 2147483648, optionally with a unit"),
    ("MLSL_TF_CHUNK_BYTES", "4 parsecs", "a size in bytes from 256"),
    ("MLSL_TF_INFLIGHT", "0", "an integer from 1 to 64"),
    ("MLSL_TF_INFLIGHT", "-3", "an integer from 1 to 64"),
    ("MLSL_TF_FUSION_THRESHOLD", "-5", "a size in bytes from 0"),
    ("MLSL_TF_HEARTBEAT_MS", "abc", "an integer from 1 to 60000"),
    ("MLSL_TF_LOG_LEVEL", "loud", "one of debug, info, warning, error"),
    ("MLSL_TF_STALL_WARNING_SECONDS", "-1", "an integer from 0"),
    ("MLSL_TF_PRIORITY", "lifo", "one of priority, fifo"),
    ("MLSL_TF_WIRE_DTYPE", "int8", "one of float32, bfloat16"),
    ("MLSL_TF_COMM_CORE", "one", "empty, or a core number or a comma-separated list"),
    ("MLSL_TF_BIND", "core", "one of auto, none"),
    ("MLSL_TF_CROSS_ITERATION", "maybe", "one of 1, 0"),
    ("MLSL_TF_THREAD_SPINNING", "sometimes", "one of 1, 0"),
    ("MLSL_TF_INTER_OP_THREADS", "0", "one of auto, tf, or an integer from 1"),
    ("MLSL_TF_TIMELINE_MARK_CYCLES", "2", "one of 1, 0"),
    ("HOROVOD_TIMELINE_MARK_CYCLES", "sometimes", "one of 1, 0"),  # Horovod's name, checked alike
]


def test_bad_settings_are_refused_at_init():
    """Each value alone in the environment: init() fails naming the variable, the value and
    what is allowed (one process tries them all; a refused init leaves nothing behind)."""
    r = run_python(f"""
        import os, mlsl_tf as hvd
        for var, value, _ in {BAD_SETTINGS!r}:
            os.environ[var] = value
            try:
                hvd.init(); print("accepted", var, value); hvd.shutdown()
            except RuntimeError as e:
                print("refused:", str(e).replace(chr(10), " | "))
            del os.environ[var]
        """)
    for var, value, allowed in BAD_SETTINGS:
        assert f"refused: mlsl_tf.init() failed: {var}={value} is not valid: expected {allowed}" in r.stdout, \
            r.stdout + r.stderr


def test_every_bad_setting_is_reported_at_once():
    r = run_python("""
        import mlsl_tf as hvd
        try:
            hvd.init()
        except RuntimeError as e:
            print("refused:", str(e).replace(chr(10), " | "))
        """, env={"MLSL_TF_INFLIGHT": "0", "MLSL_TF_PRIORITY": "lifo"})
    assert "MLSL_TF_INFLIGHT=0 is not valid" in r.stdout and "MLSL_TF_PRIORITY=lifo is not valid" in r.stdout


def test_good_settings_with_units_are_accepted():
    r = run_python("""
        import os, tensorflow as tf, mlsl_tf as hvd
        for var, value in [("MLSL_TF_CHUNK_BYTES", "4MB"), ("MLSL_TF_CHUNK_BYTES", "1 MiB"),
                           ("MLSL_TF_CHUNK_BYTES", "0.5MiB"), ("MLSL_TF_CHUNK_BYTES", "256"),
                           ("MLSL_TF_FUSION_THRESHOLD", "0"), ("MLSL_TF_PRIORITY", "FIFO"),
                           ("MLSL_TF_INFLIGHT", " 8 "), ("MLSL_TF_COMM_CORE", ""), ("MLSL_TF_CROSS_ITERATION", "off")]:
            os.environ[var] = value
            hvd.init()
            print("sum", var, value, float(hvd.allreduce(tf.ones([300000]), op=hvd.Sum)[0]))
            hvd.shutdown()
            del os.environ[var]
        """)
    assert r.stdout.count(" 1.0\n") == 9, r.stdout + r.stderr


def test_use_before_init_is_a_clear_error():
    r = run_python("""
        import tensorflow as tf, mlsl_tf as hvd
        for fn in (hvd.rank, hvd.size):
            try:
                fn(); print("no error")
            except hvd.NotInitializedError as e:
                print("ok:", e)
        try:
            hvd.allreduce(tf.ones([1]))
        except tf.errors.FailedPreconditionError as e:
            print("ok:", e.message)
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and all(l.startswith("ok:") and "call mlsl_tf.init()" in l for l in lines), r.stdout


def test_shutdown_then_init_then_ops():
    r = run_python("""
        import tensorflow as tf, mlsl_tf as hvd
        hvd.init(); hvd.shutdown()
        print(hvd.is_initialized())
        try:
            hvd.allreduce(tf.ones([1]))
        except tf.errors.FailedPreconditionError:
            print("refused")
        hvd.init(); print(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy().tolist())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "refused", "[1.0,", "1.0]"]


def test_init_reuses_mpi4py_world():
    r = run_python("""
        from mpi4py import MPI
        import mlsl_tf as hvd
        hvd.init(comm=MPI.COMM_WORLD)
        print(hvd.size(), MPI.COMM_WORLD.Get_size(), hvd.mpi_threads_supported())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "True"]


def test_stats_count_requests_and_chunks():
    before = hvd.stats()
    hvd.allreduce(tf.ones([1000]), op=hvd.Sum, name="stats_probe")
    after = hvd.stats()
    assert after["requests"] == before["requests"] + 1
    assert after["chunks"] >= before["chunks"] + 1
    assert after["bytes_sent"] >= before["bytes_sent"] + 4000
    assert set(after) >= {"preemptions", "fused_buffers", "wait_by_priority"}


# Horovod 0.28.1's horovod.tensorflow parameters, in order: a script that passes them
# positionally or by name runs unchanged (mlsl_tf's own, like priority=, come after them).
HOROVOD_SIGNATURES = {
    "allreduce": ["tensor", "average", "device_dense", "device_sparse", "compression", "op", "prescale_factor",
                  "postscale_factor", "name", "process_set", "ignore_name_scope"],
    "grouped_allreduce": ["tensors", "average", "device_dense", "device_sparse", "compression", "op",
                          "prescale_factor", "postscale_factor"],
    "allgather": ["tensor", "name", "ignore_name_scope", "process_set"],
    "broadcast": ["tensor", "root_rank", "name", "ignore_name_scope", "process_set"],
    "alltoall": ["tensor", "splits", "name", "ignore_name_scope", "process_set"],
    "reducescatter": ["tensor", "device_dense", "compression", "op", "name", "process_set", "ignore_name_scope",
                      "prescale_factor", "postscale_factor"],
    "broadcast_variables": ["variables", "root_rank"],
    "broadcast_object": ["obj", "root_rank", "session", "name", "process_set"],
    "allgather_object": ["obj", "session", "name", "process_set"],
    "broadcast_global_variables": ["root_rank"],
    "broadcast_": ["variables", "root_rank", "name", "process_set"],
    "broadcast_object_fn": ["root_rank", "session", "name", "process_set"],
    "grouped_allgather": ["tensors", "name", "ignore_name_scope", "process_set"],
    "grouped_reducescatter": ["tensors", "device_dense", "compression", "op", "process_set", "prescale_factor",
                              "postscale_factor"],
    "rank_op": ["name"],
    "local_rank_op": ["name"],
    "size_op": ["process_set_id", "name"],
    "local_size_op": ["name"],
    "start_timeline": ["file_path", "mark_cycles"],
    "stop_timeline": [],
}


def test_timeline_api_reachable_as_horovods():
    """hvd.start_timeline / stop_timeline, also through the Horovod alias package."""
    alias = os.path.join(os.path.dirname(__file__), "..", "horovod_suite", "alias")
    sys.path.insert(0, alias)
    try:
        import horovod.tensorflow as horovod_tf
    finally:
        sys.path.remove(alias)
    assert horovod_tf.start_timeline is hvd.start_timeline and horovod_tf.stop_timeline is hvd.stop_timeline
    assert "start_timeline" in hvd.__all__ and "stop_timeline" in hvd.__all__


@pytest.mark.parametrize("fn", sorted(HOROVOD_SIGNATURES))
def test_signatures_start_like_horovods(fn):
    import inspect
    params = list(inspect.signature(getattr(hvd, fn)).parameters)
    assert params[:len(HOROVOD_SIGNATURES[fn])] == HOROVOD_SIGNATURES[fn]
