"""TensorFlow's inter-op thread pool sized for several ranks per machine.

TensorFlow gives every process one inter-op thread per core of the machine; with several ranks
on a machine those pools oversubscribe the cores many times over. One thread is too few: the
executor runs one chain of ops inline and queues every side branch (in backprop, each weight's
gradient) behind it, so no gradient is reduced before the whole backward pass has run. init()
therefore sets 2 inter-op threads per rank (intra-op parallelism inside kernels is left alone)
unless the user chose already. The collective kernels themselves run inline on the thread that
produced their input (ops/tf/kernels.cc), so a reduction starts as soon as its gradient exists.
"""

import os

from mlsl_tf import _library

SETTING = "MLSL_TF_INTER_OP_THREADS"


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


def configure():
    """Applies the inter-op setting before TensorFlow starts its runtime. Returns the number set,
    or None when it left TensorFlow alone (user's choice, 'tf', or a runtime already running)."""
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
