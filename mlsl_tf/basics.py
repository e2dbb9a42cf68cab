"""Process-level API: init, shutdown and the rank/size queries, with Horovod's names."""

import atexit
import errno
import json
import logging
import os
import re
import sys
import time

from mlsl_tf import _library, cpu_placement, elastic_link
from mlsl_tf._library import NotInitializedError  # noqa: F401 - part of this module's API

_log = logging.getLogger("mlsl_tf")


_atexit_registered = []

# Set by mlslrun's per-rank wrapper: where this rank records why it failed (see runner/task.py).
FAILURE_FILE_ENV = "MLSL_TF_FAILURE_FILE"


def _graph_error_message(text):
    """The op's own message line out of TensorFlow's "Graph execution error:\n\nDetected at node
    ... (most recent call last):\n  File ...\n\n<message>" text; other text unchanged."""
    if not text.startswith("Graph execution error:"):
        return text
    for line in text.splitlines()[1:]:
        if line.strip() and not line[0].isspace() and not line.startswith(("Detected at node", "Node: ")):
            return line
    return text


def caused_by_peer(error):
    """Whether `error` only reports that another rank ended first: a collective (or group
    change) the core failed with StatusCode kUnavailable (an AbortedError whose payload says so)."""
    return _library.status_code(error) == _library.UNAVAILABLE


def _record_failure(error):
    """Writes when and why this rank failed for mlslrun, which blames the first rank whose
    failure was not caused by another rank's."""
    path = os.environ.get(FAILURE_FILE_ENV)
    if not path:
        return
    # TensorFlow wraps an op's message in "{{function_node ...}} ... [Op:Name]", and inside a
    # tf.function puts it after "Graph execution error:" and the node's stack: keep the message
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]\s*$", "", _graph_error_message(str(error)))
    text = f"{type(error).__name__}: {message}"
    record = {"time": time.time(), "pid": os.getpid(), "error": text.splitlines()[0][:500] if text else "",
              "caused_by_peer": caused_by_peer(error)}
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _exit_promptly_on_error(previous):
    """An uncaught exception ends the process without MPI_Finalize, which would wait for every
    other rank to finish (a rank busy elsewhere keeps the failed one alive, and the launcher
    cannot see the failure). The traceback is printed first, and the exit handlers still run:
    shutdown() tells the other ranks at once."""
    def hook(kind, value, tb):
        previous(kind, value, tb)
        _record_failure(value)
        _library.c_api().mlsl_tf_exit_failing()
    hook.mlsl_tf = True
    return hook


def init(comm=None):
    """Starts the runtime: initialises MPI if needed (or reuses the one mpi4py initialised) and
    the background thread. Collective over all ranks. Calling it again is harmless. The public
    mlsl_tf.init (mlsl_tf/groups.py) calls this, then registers Horovod's static process sets."""
    if comm is not None:
        try:
            from mpi4py import MPI
        except ImportError:  # pragma: no cover - comm given without mpi4py is a user error
            MPI = None
        if MPI is None or comm != MPI.COMM_WORLD:
            raise ValueError("mlsl_tf.init(comm=...) supports only None or mpi4py's MPI.COMM_WORLD")
    lib = _library.c_api()
    config = _library.settings()
    comm_cores = _comm_cores(config)
    if lib.mlsl_tf_init() != 0:
        raise RuntimeError("mlsl_tf.init() failed: " + _library.last_error())
    _pin_background_thread(lib, comm_cores)
    # Both before TensorFlow starts its pools: it sizes them from the cores a thread may use.
    cpu_placement.bind(local_rank(), local_size(), config[cpu_placement.BIND][2], comm_cores)
    cpu_placement.configure_threads()
    try:
        elastic_link.connect(rank())
    except OSError as e:
        raise RuntimeError(f"mlsl_tf.init() failed: cannot reach elastic mlslrun at "
                           f"{os.environ.get(elastic_link.DRIVER_ENV)}: {e}") from None
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered.append(True)
    if not getattr(sys.excepthook, "mlsl_tf", False):
        sys.excepthook = _exit_promptly_on_error(sys.excepthook)
    if "keras" in sys.modules or "tf_keras" in sys.modules:
        # A Keras script: progress bars and epoch lines on rank 0 only, as with mlsl_tf.keras.init
        # (set_progress_output("all") brings them back).
        set_progress_output(0)


def _comm_cores(config):
    """MLSL_TF_COMM_CORE as a list of cores ([]: not set), or init()'s error for a bad value. mlsl_tf/cpu_placement.py
    is the setting's one parser (mlslrun's rank wrapper needs it before the library loads; the library's
    table only documents it and its init() does not check it), so what it allows comes from there too."""
    setting = config[cpu_placement.COMM_CORE]
    try:
        return cpu_placement.parse_comm_cores(setting.value)
    except ValueError:
        raise RuntimeError(f"mlsl_tf.init() failed: {cpu_placement.COMM_CORE}={setting.value} is not valid: expected "
                           f"{cpu_placement.COMM_CORE_ALLOWED}") from None


def _pin_background_thread(lib, comm_cores):
    """MLSL_TF_COMM_CORE: the library pins its background thread to this local rank's core."""
    core = cpu_placement.comm_core_for(comm_cores, local_rank())
    if core is None:
        return
    if lib.mlsl_tf_pin_background_thread(core) != 0:
        _log.warning("mlsl_tf: %s (%s=%s)", _library.last_error(), cpu_placement.COMM_CORE, ",".join(map(str, comm_cores)))


def set_progress_output(ranks=0):
    """Chooses which ranks print Keras' interactive output (progress bars, epoch lines,
    model.summary): a rank, a list of ranks, or "all". On the others Keras writes it to absl
    logging at INFO level instead of stdout. Keras keeps this switch per thread: call it from
    the thread that runs fit."""
    if isinstance(ranks, str):
        if ranks != "all":
            raise ValueError(f"set_progress_output: ranks must be a rank, a list of ranks or 'all', got {ranks!r}")
        show = True
    else:
        chosen = [ranks] if isinstance(ranks, int) else list(ranks)
        bad = [r for r in chosen if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < size()]
        if bad:
            raise ValueError(f"set_progress_output: ranks must be ranks in [0, {size()}) or 'all', got {ranks!r}")
        show = rank() in chosen
    import keras
    if show:
        keras.config.enable_interactive_logging()
    else:
        keras.config.disable_interactive_logging()
    tf_keras = sys.modules.get("tf_keras")  # Keras 2, when the script uses it: the same switch
    if tf_keras is not None and hasattr(tf_keras, "utils"):
        (tf_keras.utils.enable_interactive_logging if show else tf_keras.utils.disable_interactive_logging)()


# What modules above this one do around shutdown(), registered by them when imported (this
# module never imports upward): before the core stops (cross-iteration overlap applies the updates
# it deferred) and after (process sets forget their ids).
_before_shutdown = []
_after_shutdown = []


def on_shutdown(before=None, after=None):
    """Registers `before()` to run while the runtime still works and `after()` once it stopped."""
    if before is not None:
        _before_shutdown.append(before)
    if after is not None:
        _after_shutdown.append(after)


def shutdown():
    """Stops the runtime on this rank. Other ranks' pending collectives then fail with an error
    naming this rank. init() may be called again afterwards. Optimizer updates still deferred
    (cross-iteration overlap) are applied first."""
    if is_initialized():
        for hook in _before_shutdown:
            try:
                hook()
            except Exception as e:  # a peer already gone: its reductions fail, shut down anyway
                print(f"mlsl_tf: shutdown could not apply deferred updates: {e}", file=sys.stderr)
    _library.c_api().mlsl_tf_shutdown()
    for hook in _after_shutdown:
        hook()


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline to `file_path`, as Horovod's hvd.start_timeline:
    rank 0 writes it (every rank when the path holds '{rank}', replaced by the rank); the other
    ranks only note mark_cycles. Not collective. The file is a valid trace while the job runs
    (flushed every few tens of ms) and complete after stop_timeline() or shutdown(). Another
    path closes the file being written and starts the new one; the same path again keeps
    writing it and only changes mark_cycles (CYCLE_START marks of every background cycle).
    Raises NotInitializedError (a ValueError, as Horovod) before init(), an OSError naming the
    file when this rank cannot create or write it (an empty path: FileNotFoundError, as open),
    and ValueError for a path with a NUL byte."""
    import ctypes

    lib = _library.c_api()
    path = os.fsencode(file_path)
    if b"\0" in path:  # the C string would end there: another file
        raise ValueError(f"mlsl_tf.start_timeline: embedded null byte in the path {file_path!r}")
    if not path:  # as open(''); stop_timeline() is how a timeline stops
        raise FileNotFoundError(errno.ENOENT, "mlsl_tf.start_timeline: empty path (stop_timeline() stops a timeline)",
                                file_path)
    os_error = ctypes.c_int(0)
    rc = lib.mlsl_tf_start_timeline(path, int(bool(mark_cycles)), ctypes.byref(os_error))
    if rc == -1:
        raise NotInitializedError(_library.last_error())
    if rc != 0:
        raise OSError(os_error.value, "mlsl_tf.start_timeline: " + _library.last_error())


def stop_timeline():
    """Stops the timeline started by start_timeline (or MLSL_TF_TIMELINE / HOROVOD_TIMELINE):
    the file is complete when it returns. Nothing to stop is no error (as Horovod). Raises
    NotInitializedError before init()."""
    if _library.c_api().mlsl_tf_stop_timeline() != 0:
        raise NotInitializedError(_library.last_error())


def is_initialized():
    return bool(_library.c_api().mlsl_tf_is_initialized())


def _query(fn):
    value = getattr(_library.c_api(), "mlsl_tf_" + fn)()
    if value < 0:
        raise NotInitializedError(_library.last_error())
    return value


def rank():
    """This process's rank among all ranks."""
    return _query("rank")


def size():
    """The number of ranks."""
    return _query("size")


def local_rank():
    """This process's rank among the ranks on its machine."""
    return _query("local_rank")


def local_size():
    """The number of ranks on this machine."""
    return _query("local_size")


def cross_rank():
    """The index of this machine among machines (ranks with the same local_rank)."""
    return _query("cross_rank")


def cross_size():
    """The number of machines (ranks with the same local_rank as this one)."""
    return _query("cross_size")


def is_homogeneous():
    """Whether every machine runs the same number of ranks (Horovod's is_homogeneous)."""
    return bool(_query("is_homogeneous"))


def gpu_available(ext_base_name, verbose=False):
    """Whether the `ext_base_name` extension ("tensorflow", ...) runs with a GPU: never here,
    mlsl_tf reduces on the host (Horovod's horovod.common.util.gpu_available)."""
    return False


def mpi_threads_supported():
    """Whether MPI runs with MPI_THREAD_MULTIPLE."""
    return bool(_library.c_api().mlsl_tf_mpi_threads_supported())


def mpi_enabled():
    return True


def mpi_built():
    return True


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False
