"""Loads the compiled library once: as a TensorFlow op library (the kernels) and through
ctypes (the C API of ops/core/c_api.h). Both are the same shared object, so they share the one
Runtime the C API holds."""

import collections
import ctypes
import functools
import os

class NotInitializedError(ValueError):
    """Raised when the API is used before mlsl_tf.init()."""


# ops/core/status.h StatusCode: a collective that failed because a peer rank shut down or failed
# ends with UNAVAILABLE. TensorFlow ops raise it as AbortedError (as Horovod does) with the code
# in the payload STATUS_CODE_PAYLOAD; the C API gives it by mlsl_tf_last_error_code().
UNAVAILABLE = 5
STATUS_CODE_PAYLOAD = "mlsl_tf.status_code"

# The library is the package's own, unless MLSL_TF_LIBRARY names another build of the same
# sources (e.g. build/openmpi/_mlsl_tf.so from `make openmpi-lib`, compiled against Open MPI).
LIBRARY_ENV = "MLSL_TF_LIBRARY"
PACKAGE_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mlsl_tf.so")
LIBRARY_PATH = os.path.abspath(os.environ[LIBRARY_ENV]) if os.environ.get(LIBRARY_ENV) else PACKAGE_LIBRARY


def _check_built():
    if LIBRARY_PATH != PACKAGE_LIBRARY and not os.path.isfile(LIBRARY_PATH):
        raise ImportError(f"{LIBRARY_ENV}={os.environ.get(LIBRARY_ENV)}: no such library file "
                          f"({LIBRARY_PATH}); unset it to use the package's own {PACKAGE_LIBRARY}")
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(
            f"mlsl_tf's compiled ops are missing ({LIBRARY_PATH}); build them with `make lib` "
            "or install the package with `pip install .` into an environment with TensorFlow and MPI")


@functools.lru_cache(maxsize=None)
def load_ops():
    """The TensorFlow op module (tf.load_op_library) with the Mlsl* ops."""
    _check_built()
    import tensorflow as tf
    return tf.load_op_library(LIBRARY_PATH)


@functools.lru_cache(maxsize=None)
def c_api():
    """The ctypes handle on the C API, with argument and result types declared."""
    load_ops()  # resolves the TensorFlow symbols the library needs first
    lib = ctypes.CDLL(LIBRARY_PATH, mode=ctypes.RTLD_GLOBAL)
    for fn in ("init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
               "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "setting_count", "parked", "exit_failing",
               "last_error_code"):
        getattr(lib, "mlsl_tf_" + fn).restype = ctypes.c_int
        getattr(lib, "mlsl_tf_" + fn).argtypes = []
    for fn in ("last_error", "stats_json"):
        getattr(lib, "mlsl_tf_" + fn).restype = ctypes.c_char_p
        getattr(lib, "mlsl_tf_" + fn).argtypes = []
    for fn in ("name", "default", "doc", "allowed", "alias"):
        getattr(lib, "mlsl_tf_setting_" + fn).restype = ctypes.c_char_p
        getattr(lib, "mlsl_tf_setting_" + fn).argtypes = [ctypes.c_int]
    lib.mlsl_tf_start_timeline.restype = ctypes.c_int
    lib.mlsl_tf_start_timeline.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.mlsl_tf_stop_timeline.restype = ctypes.c_int
    lib.mlsl_tf_stop_timeline.argtypes = []
    lib.mlsl_tf_pin_background_thread.restype = ctypes.c_int
    lib.mlsl_tf_pin_background_thread.argtypes = [ctypes.c_int]
    return lib


def last_error():
    return c_api().mlsl_tf_last_error().decode()


def status_code(error):
    """The core's StatusCode an exception carries (an op's error or one raised from the C API's
    last error), or None for other exceptions."""
    code = getattr(error, "mlsl_status_code", None)
    if code is not None:
        return int(code)
    payloads = getattr(error, "experimental_payloads", None) or {}
    raw = payloads.get(STATUS_CODE_PAYLOAD, payloads.get(STATUS_CODE_PAYLOAD.encode()))
    try:
        return None if raw is None else int(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError:
        return None


def error(cls, message):
    """An exception of class `cls` saying `message` and the C API's last error, carrying that
    error's StatusCode as `mlsl_status_code` (basics tells a peer's failure by it)."""
    e = cls(f"{message}: {last_error()}")
    e.mlsl_status_code = c_api().mlsl_tf_last_error_code()
    return e


Setting = collections.namedtuple("Setting", "default doc value allowed")

# The words of a yes/no setting, as the library's table allows them ("one of 1, 0, true, ...").
YES_WORDS = ("1", "true", "on", "yes")
NO_WORDS = ("0", "false", "off", "no")


def yes_no(name, value, yes="on", no="off"):
    """The bool a yes/no setting's `value` says: True for a word of YES_WORDS, False for one of
    NO_WORDS (any case, spaces around ignored); else a ValueError naming the setting `name` and
    the value. `yes` and `no` say what 1 and 0 mean for that setting, in the message."""
    word = value.strip().lower()
    if word in YES_WORDS:
        return True
    if word in NO_WORDS:
        return False
    raise ValueError(f"{name}={value!r}: expected 1 ({yes}) or 0 ({no}); "
                     f"also {'/'.join(YES_WORDS[1:])} or {'/'.join(NO_WORDS[1:])}")


def settings():
    """Every MLSL_TF_* setting the library declares: {name: Setting(default, doc, current value,
    what it allows)}. init() refuses values it does not allow. The value of a setting with a
    Horovod alias (MLSL_TF_TIMELINE: HOROVOD_TIMELINE) comes from the alias when only that is set."""
    lib = c_api()
    out = {}
    for i in range(lib.mlsl_tf_setting_count()):
        name = lib.mlsl_tf_setting_name(i).decode()
        default = lib.mlsl_tf_setting_default(i).decode()
        alias = lib.mlsl_tf_setting_alias(i).decode()
        value = os.environ.get(name) or (alias and os.environ.get(alias)) or default
        out[name] = Setting(default, lib.mlsl_tf_setting_doc(i).decode(), value,
                            lib.mlsl_tf_setting_allowed(i).decode())
    return out


def stats():
    """The runtime's counters: requests, bytes_sent, chunks, in_place (allreduces that wrote
    into their input's buffer), preemptions, fused_buffers, fused_tensors, wait_by_priority
    ({priority: {count, total_s, mean_s}}) and ways ({way: count}: how the collectives and the
    allreduce chunks ran, e.g. eager, chunks, ring_allreduce, native_allreduce, broadcast; the
    choice is ops/core/operations.h's) and autotune ({enabled, frozen, values: the tuned settings'
    values in force, tuned, candidates, applied: [[cycle, final, value...]] -- the same on every
    rank}; None until the background thread has started: docs/autotune.md)."""
    import json

    raw = c_api().mlsl_tf_stats_json()
    if raw is None:
        raise NotInitializedError(last_error())
    return json.loads(raw.decode())
