"""TensorFlow's inter-op thread pool sized for several ranks per machine.

TensorFlow gives every process one inter-op thread per core of the machine; with several ranks
on a machine those pools oversubscribe the cores many times over. One thread is too few: the
executor runs one chain of ops inline and queues every side branch (in backprop, each weight's
gradient) behind it, so no gradient is reduced before the whole backward pass has run. init()
therefore sets 2 inter-op threads per rank (intra-op parallelism inside kernels is left alone)
unless the user chose already. The collective kernels themselves run inline on the thread that
produced their input (ops/tf/kernels.cc), so a reduction starts as soon as its gradient exists.

init() also stops TensorFlow's pools from spinning (MLSL_TF_THREAD_SPINNING=0, the default).
A pool thread that runs out of work keeps a core busy for a while in case more arrives; in a
process with a background thread that must answer MPI within microseconds, and on a machine
shared by several ranks, that core is the one the background thread or another rank needed.
Measured on 2 ranks sharing 2 cores (benchmarks/allreduce.py, fresh inputs): a 4 KiB allreduce
chain took 80-145 us per collective with spinning and 21-23 us without; ResNet-50 compute alone
was unchanged and the overlapped training step 7% faster.
"""

import os

from mlsl_tf import _library

SETTING = "MLSL_TF_INTER_OP_THREADS"
SPINNING = "MLSL_TF_THREAD_SPINNING"


def inter_op_threads(spec):
    """The inter-op pool size for setting value `spec` ('auto', 'tf' or a number), or None to
    leave TensorFlow's default."""
    spec = (spec or "auto").strip().lower()
    if spec == "tf":
        return None
    if spec == "auto":
        return 2
    try:
        n = int(spec)
    except ValueError:
        raise ValueError(f"{SETTING}={spec!r}: expected 'auto', 'tf' or a positive number of threads") from None
    if n < 1:
        raise ValueError(f"{SETTING}={spec!r}: expected 'auto', 'tf' or a positive number of threads")
    return n


def spinning(spec):
    """Whether TensorFlow's pools may spin, for setting value `spec` ('1'/'0', on/off, ...)."""
    return _library.yes_no(SPINNING, spec or "0", yes="TensorFlow's spinning pools", no="pools that sleep")


def configure():
    """Applies the thread settings before TensorFlow starts its runtime. Returns the inter-op
    pool size set, or None when it left that alone (user's choice, 'tf', or a runtime already
    running)."""
    configure_spinning()
    n = inter_op_threads(_library.settings()[SETTING][2])
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


def configure_spinning():
    """Turns spinning off in the eager context's configuration (from which TensorFlow builds its
    inter-op and intra-op pools) unless MLSL_TF_THREAD_SPINNING=1. Returns True when it did,
    False when spinning stays (the setting, or a runtime whose pools already exist)."""
    if spinning(_library.settings()[SPINNING][2]):
        return False
    from tensorflow.python.eager import context  # TensorFlow has no public switch for this field
    ctx = context.context()
    if getattr(ctx, "_context_handle", None) is not None or not hasattr(ctx, "_config"):
        return False  # the pools exist (or an unknown TensorFlow): they keep their behaviour
    from tensorflow.core.protobuf import config_pb2
    config = config_pb2.ConfigProto()
    if ctx._config is not None:
        config.CopyFrom(ctx._config)
    config.experimental.disable_thread_spinning = True
    ctx._config = config
    return True
