"""mlsl_tf for Keras 3, with the names of horovod.tensorflow.keras (`import mlsl_tf.keras as hvd`):
the basic API, DistributedOptimizer, load_model and `callbacks`."""

import keras

from mlsl_tf.basics import (cross_rank, cross_size, init, is_initialized, local_rank, local_size,
                            mpi_threads_supported, rank, shutdown, size)
from mlsl_tf.compression import Compression
from mlsl_tf.functions import allgather_object, broadcast_object, broadcast_variables
from mlsl_tf.keras import callbacks
from mlsl_tf.ops import (Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier, broadcast,
                         grouped_allreduce, join, reducescatter)
from mlsl_tf.optimizer import DistributedOptimizer, is_distributed
from mlsl_tf.tape import DistributedGradientTape


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, **kwargs):
    """Loads a model saved with `model.save` (.keras) and makes its optimizer distributed, state
    included: the optimizer loaded by Keras becomes a DistributedOptimizer in place, so iteration
    count, slots and learning rate carry on.

    custom_optimizers: optimizer classes the file names besides Keras' own.
    custom_objects: as for keras.models.load_model.
    compression and further keyword arguments (backward_passes_per_step, op, ...) go to
    DistributedOptimizer."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression, _in_place=True, **kwargs)
    return model


__all__ = [
    "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer", "Max", "Min", "Product", "Sum",
    "allgather", "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_object",
    "broadcast_variables", "callbacks", "cross_rank", "cross_size", "grouped_allreduce", "init", "is_distributed",
    "is_initialized", "join", "load_model", "local_rank", "local_size", "mpi_threads_supported", "rank",
    "reducescatter", "shutdown", "size",
]
