"""TensorFlow's thread pools sized for several ranks per machine.

TensorFlow gives every process one inter-op thread per core of the machine. With several ranks
on a machine those pools oversubscribe the cores many times over, and every collective's
completion (an AsyncOpKernel calling done) hands the next op to that pool: the hop between
idle-spinning pool threads is most of a small allreduce's latency (4 KiB on 2 ranks of a 2-core
machine: ~35 us with TF's default, ~13 us with one inter-op thread). init() therefore sets the
inter-op pool to what a rank needs (ops that return at once, plus intra-op parallelism inside
kernels, which is left alone) unless the user chose already.
"""

import os

from mlsl_tf import _library

SETTING = "MLSL_TF_INTER_OP_THREADS"


def cores_per_rank(local_size):
    """Cores this rank may use: its affinity mask when the launcher bound it to a subset,
    otherwise the machine's cores shared among the ranks on it."""
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        mine = os.cpu_count() or 1
    machine = os.cpu_count() or mine
    return max(1, mine if mine < machine else machine // max(1, local_size))


def inter_op_threads(spec, cores):
    """The inter-op pool size for setting value `spec` ('auto', 'tf' or a number), or None to
    leave TensorFlow's default."""
    spec = (spec or "auto").strip().lower()
    if spec == "tf":
        return None
    if spec == "auto":
        return 2 if cores >= 16 else 1
    try:
        n = int(spec)
    except ValueError:
        raise ValueError(f"{SETTING}={spec!r}: expected 'auto', 'tf' or a positive number of threads") from None
    if n < 1:
        raise ValueError(f"{SETTING}={spec!r}: expected 'auto', 'tf' or a positive number of threads")
    return n


def configure(local_size):
    """Applies the inter-op setting before TensorFlow starts its runtime. Returns the number set,
    or None when it left TensorFlow alone (user's choice, 'tf', or a runtime already running)."""
    n = inter_op_threads(_library.settings()[SETTING][2], cores_per_rank(local_size))
    if n is None or os.environ.get("TF_NUM_INTEROP_THREADS"):
        return None
    import tensorflow as tf
    if tf.config.threading.get_inter_op_parallelism_threads() != 0:
        return None  # set by the user
    try:
        tf.config.threading.set_inter_op_parallelism_threads(n)
    except RuntimeError:
        return None  # TensorFlow already ran an op: its pools exist and cannot be resized
    return n
