"""horovod.tensorflow.mpi_ops: the collectives (mlsl_tf.ops) and `_basics`, whose private
`_get_process_set_ids_and_ranks()` the dynamic process-set test calls."""

import mlsl_tf.groups
from mlsl_tf.ops import *  # noqa: F401,F403


class _basics:
    @staticmethod
    def _get_process_set_ids_and_ranks():
        return mlsl_tf.groups.ids_and_ranks()
