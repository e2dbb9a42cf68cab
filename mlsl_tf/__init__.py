"""mlsl_tf: fast data- and model-parallel training for TensorFlow 2 / Keras 3, a drop-in for
Horovod's TensorFlow API (`import mlsl_tf as hvd`).

Names are loaded on first use, so `python -m mlsl_tf.runner` (mlslrun) starts without
importing TensorFlow; `import mlsl_tf as hvd; hvd.init()` imports it then."""

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "mlsl_tf._library": ["settings", "stats"],
    "mlsl_tf.basics": ["NotInitializedError", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
                       "gloo_built", "gloo_enabled", "gpu_available", "is_homogeneous", "is_initialized",
                       "local_rank", "local_size",
                       "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "rocm_built",
                       "shutdown", "size", "start_timeline", "stop_timeline"],
    "mlsl_tf.compression": ["Compression"],
    "mlsl_tf.functions": ["allgather_object", "broadcast_", "broadcast_global_variables", "broadcast_object",
                          "broadcast_object_fn", "broadcast_variables"],
    "mlsl_tf.groups": ["Group", "ProcessSet", "add_process_set", "global_process_set", "init", "process_set_by_id",
                       "process_sets", "remove_process_set"],
    "mlsl_tf.optimizer.dispatch": ["DistributedOptimizer"],
    "mlsl_tf.tape": ["DistributedGradientTape", "PartialDistributedGradientTape"],
    "mlsl_tf.keras.sync_batch_norm": ["SyncBatchNormalization"],
    "mlsl_tf.ops": ["Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allreduce", "alltoall",
                    "barrier", "broadcast", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join", "local_rank_op", "local_size_op",
                    "process_set_included_op", "rank_op", "reducescatter", "size_op"],
}
# submodules reachable as attributes (mlsl_tf.groups.grid, mlsl_tf.parallel.all_gather)
_SUBMODULES = ["elastic", "groups", "parallel"]
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE) + _SUBMODULES


def __getattr__(name):
    if name in _SUBMODULES:
        value = importlib.import_module(f"mlsl_tf.{name}")
        globals()[name] = value
        return value
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'mlsl_tf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE) | set(_SUBMODULES))
