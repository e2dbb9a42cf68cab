"""mlsl_tf for Keras 3 and Keras 2 (tf_keras), with horovod.tensorflow.keras' names.

`import mlsl_tf.keras as hvd`: the basic API, DistributedOptimizer, load_model and `callbacks`;
each takes Keras 3 or tf_keras objects alike (mlsl_tf/keras2_compat.py and
mlsl_tf/optimizer/keras2.py for the latter).

Keras' interactive output (the progress bars and epoch lines of fit/evaluate/predict,
model.summary) is printed by rank 0 only: `init()` here, or importing this module after
mlsl_tf.init(), sends it to absl logging (not shown by default) on the other ranks, so that
`model.fit(..., verbose=1)` needs no `if hvd.rank() == 0`. `set_progress_output("all")` asks for
it on every rank again."""

import json
import os
import zipfile

from mlsl_tf import basics, groups, keras2_compat, keras3_compat
from mlsl_tf.basics import (cross_rank, cross_size, is_initialized, local_rank, local_size, mpi_threads_supported,
                            rank, shutdown, size)
from mlsl_tf.compression import Compression
from mlsl_tf.functions import allgather_object, broadcast_object, broadcast_variables
from mlsl_tf.groups import ProcessSet, add_process_set, global_process_set, remove_process_set
from mlsl_tf.keras import callbacks, elastic
from mlsl_tf.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier, broadcast,
                         grouped_allreduce, join, reducescatter)
from mlsl_tf.optimizer.dispatch import DistributedOptimizer, is_distributed
from mlsl_tf.tape import DistributedGradientTape


def set_progress_output(ranks=0):
    """mlsl_tf.set_progress_output, for Keras 3 and, when used, tf_keras alike."""
    basics.set_progress_output(ranks)
    keras2_compat.follow_interactive_logging()


def init(*args, **kwargs):
    """mlsl_tf.init (same arguments: comm, process_sets), then `set_progress_output(0)`: Keras
    prints on rank 0 only."""
    groups.init(*args, **kwargs)
    set_progress_output(0)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                                process_set=None, local_layers=None, scale_local_gradients=True, **kwargs):
    """DistributedOptimizer whose `local_layers`' trainable weights are this rank's own
    (register_local_var): their gradients are not reduced (Horovod's PartialDistributedOptimizer)."""
    opt = DistributedOptimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                               compression=compression, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                               process_set=process_set, scale_local_gradients=scale_local_gradients, **kwargs)
    for layer in local_layers or []:
        for v in layer.trainable_weights:
            opt.register_local_var(v)
    return opt


def saved_by_keras2(filepath):
    """Whether the model file was written by Keras 2: a SavedModel directory (Keras 3 writes
    none), or an .h5 / .keras file whose recorded keras_version is 2.x."""
    path = os.fspath(filepath)
    if os.path.isdir(path):
        return True
    version = ""
    try:
        if path.endswith(".keras"):
            with zipfile.ZipFile(path) as archive:
                version = json.loads(archive.read("metadata.json")).get("keras_version", "")
        else:
            import h5py
            with h5py.File(path, "r") as f:
                version = f.attrs.get("keras_version", "")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False
    if isinstance(version, bytes):
        version = version.decode()
    return str(version).startswith("2.")


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, **kwargs):
    """Loads a model saved with `model.save` and makes its optimizer distributed, state included:
    the optimizer loaded by Keras becomes a DistributedOptimizer in place, so iteration count,
    slots and learning rate carry on. The Keras that wrote the file reads it: tf_keras for a
    SavedModel directory and for .h5 / .keras files recording a 2.x keras_version, else Keras 3.

    custom_optimizers: optimizer classes the file names besides Keras' own.
    custom_objects: as for keras.models.load_model / tf_keras.models.load_model.
    compression and further keyword arguments (backward_passes_per_step, op, ...) go to
    DistributedOptimizer."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    compat = keras2_compat if keras2_compat.available() and saved_by_keras2(filepath) else keras3_compat
    model = compat.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression, _in_place=True, **kwargs)
    return model


__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer", "Max", "Min",
    "PartialDistributedOptimizer", "ProcessSet", "Product", "Sum", "add_process_set", "global_process_set",
    "remove_process_set",
    "allgather", "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_object",
    "broadcast_variables", "callbacks", "cross_rank", "cross_size", "grouped_allreduce", "init", "is_distributed",
    "is_initialized", "join", "load_model", "local_rank", "local_size", "mpi_threads_supported", "rank",
    "reducescatter", "set_progress_output", "shutdown", "size",
]


if is_initialized():  # mlsl_tf.init() ran before this import
    set_progress_output(0)
