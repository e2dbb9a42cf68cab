"""horovod.tensorflow is mlsl_tf: every name resolves to mlsl_tf's own (Horovod's private
helper `_executing_eagerly` and the `util` module come from here)."""

import mlsl_tf
from mlsl_tf import *  # noqa: F401,F403
from horovod.tensorflow import mpi_ops, util  # noqa: E402,F401
from horovod.tensorflow.util import _executing_eagerly  # noqa: E402,F401


def __getattr__(name):
    return getattr(mlsl_tf, name)
