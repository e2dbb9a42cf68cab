"""The public DistributedOptimizer: checks Horovod's arguments once and picks the wrapper by the
kind of optimizer -- Keras 3 (keras3.py), Keras 2 / tf_keras (keras2.py) or TensorFlow 1
(tf1.py) -- and is_distributed, which knows them all."""

import tensorflow as tf

from mlsl_tf import keras2_compat, ops, overlap
from mlsl_tf.compression import Compression
from mlsl_tf.optimizer import keras2, keras3, tf1
from mlsl_tf.optimizer.reduce import ReduceOptions


def DistributedOptimizer(optimizer, *args, **kwargs):
    """Returns `optimizer` wrapped so that its gradients are reduced over the ranks (Horovod's
    DistributedOptimizer; the arguments are Horovod's, see keras_optimizer below)."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        for keras_only in ("cross_iteration", "_in_place"):
            kwargs.pop(keras_only, None)
        return tf1.DistributedOptimizer(optimizer, *args, **kwargs)
    return keras_optimizer(optimizer, *args, **kwargs)


def is_distributed(optimizer):
    """Whether `optimizer` was made by DistributedOptimizer (or re-wrapped by load_model)."""
    return keras3.is_distributed(optimizer) or keras2.is_distributed(optimizer)


def keras_optimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                    sparse_as_dense=False, backward_passes_per_step=1, op=ops.Average,
                    gradient_predivide_factor=1.0, average_aggregated_gradients=False, num_groups=0,
                    groups=None, process_set=None, scale_local_gradients=True, group=None, cross_iteration=None,
                    _in_place=False):
    """Returns a copy of the Keras 3 `optimizer` (same class, config and, if built, state) whose
    `apply`/`apply_gradients` first reduce the gradients over all ranks. A Keras 2 (tf_keras)
    optimizer, legacy or new, gets Horovod's Keras 2 wrapper instead (mlsl_tf/optimizer/keras2.py):
    gradients reduced where they are computed, with cross-iteration overlap as for Keras 3.

    name: prefix of the collectives' names (default "DistributedOptimizer").
    compression: Compression.none or .fp16, applied around each allreduce.
    sparse_as_dense: allreduce IndexedSlices gradients as dense tensors instead of allgathering.
    backward_passes_per_step: k > 1 accumulates k local gradients, then reduces and applies their
        sum (their mean with average_aggregated_gradients=True) once.
    op: mlsl_tf.Average (default), mlsl_tf.Sum or mlsl_tf.Adasum (Horovod's Keras semantics: the
        gradients themselves are Adasum-combined).
    gradient_predivide_factor: f divides gradients by f before the sum and by size/f after (Average).
    num_groups / groups: an int n fuses the gradients into n grouped allreduces; a list of lists
        of variables fuses each list's gradients into one.
    process_set (or its alias group): reduce within this group of ranks only.
    scale_local_gradients: the gradients of variables registered with register_local_var are
        divided by the group's size (as Horovod does), or with False applied as they are.
    device_dense / device_sparse: accepted for Horovod compatibility (mlsl_tf reduces on the host).
    cross_iteration: apply each variable's update just before its next access (the next step's
        forward pass), so the reductions overlap the next step; same weights after every step
        (mlsl_tf/overlap.py). Default: MLSL_TF_CROSS_ITERATION (on).
    """
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if op == ops.Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients=True (as in Horovod)")
    options = ReduceOptions(name or "DistributedOptimizer", compression, sparse_as_dense, op,
                            gradient_predivide_factor, num_groups, groups, process_set if group is None else group,
                            device_dense, device_sparse)
    if keras2_compat.is_keras2(optimizer):
        return keras2.distributed_optimizer(optimizer, options, backward_passes_per_step, average_aggregated_gradients,
                                            scale_local_gradients, _in_place, cross_iteration)
    return keras3.distributed_optimizer(optimizer, options, backward_passes_per_step, average_aggregated_gradients,
                                        cross_iteration, scale_local_gradients, _in_place)


DistributedOptimizer.__doc__ += "\n\n" + (keras_optimizer.__doc__ or "")
