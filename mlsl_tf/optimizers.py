"""DistributedOptimizer for any optimizer a Horovod script passes: picks the wrapper by the kind
of optimizer -- Keras 3 (mlsl_tf/optimizer.py) or TensorFlow 1 (mlsl_tf/optimizer_v1.py)."""

import tensorflow as tf

import mlsl_tf.optimizer as keras3
import mlsl_tf.optimizer_v1 as tf1


def DistributedOptimizer(optimizer, *args, **kwargs):
    """Returns `optimizer_` wrapped so that its gradients are reduced over the ranks (Horovod's
    DistributedOptimizer; the arguments are Horovod's, see mlsl_tf.optimizer.DistributedOptimizer)."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        for keras_only in ("cross_iteration", "_in_place"):
            kwargs.pop(keras_only, None)
        return tf1.DistributedOptimizer(optimizer, *args, **kwargs)
    return keras3.DistributedOptimizer(optimizer, *args, **kwargs)


DistributedOptimizer.__doc__ += "\n\n" + (keras3.DistributedOptimizer.__doc__ or "")
