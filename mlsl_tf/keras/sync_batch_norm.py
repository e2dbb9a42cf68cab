"""SyncBatchNormalization: BatchNormalization whose training statistics are those of the global
batch (every rank's samples), as Horovod's SyncBatchNormalization. A Keras 3 layer, or under
TF_USE_LEGACY_KERAS=1 a tf_keras (Keras 2) one (`keras2_sync_batch_normalization()` gives that
class in either mode)."""

import functools

import tensorflow as tf

from mlsl_tf import keras2_compat, keras3_compat, ops


def _global_moments(x, axes, weights, group, keepdims=False):
    """Mean and variance of `x` over `axes` and over the ranks of `group`: each rank's
    per-channel sum, sum of squares and count travel in one allreduce. `weights` (or None)
    broadcast to x's shape weigh the samples (masks)."""
    x = tf.convert_to_tensor(x)
    if weights is None:
        total = tf.reduce_sum(x, axes, keepdims=keepdims)
        squares = tf.reduce_sum(tf.square(x), axes, keepdims=keepdims)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype) * tf.ones_like(total)
    else:
        weights = tf.cast(tf.broadcast_to(weights, tf.shape(x)), x.dtype)
        total = tf.reduce_sum(weights * x, axes, keepdims=keepdims)
        squares = tf.reduce_sum(weights * tf.square(x), axes, keepdims=keepdims)
        count = tf.reduce_sum(weights, axes, keepdims=keepdims)
    summed = ops.allreduce(tf.stack([total, squares, count]), op=ops.Sum, process_set=group)
    total, squares, count = tf.unstack(summed)
    count = tf.maximum(count, tf.ones_like(count))
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), tf.zeros_like(mean))
    return mean, variance


class SyncBatchNormalization(keras3_compat.BatchNormalizationMoments):
    """In training, the mean and variance over the batch axes come from the samples of every
    rank (of `group`, default all). Inference, moving statistics and every other argument are
    BatchNormalization's. Small per-rank batches then normalise as one large batch would."""

    def __init__(self, *args, group=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._mlsl_group = group

    def batch_moments(self, inputs, reduction_axes, mask):
        weights = None if mask is None else tf.expand_dims(mask, -1)
        return _global_moments(inputs, reduction_axes, weights, self._mlsl_group)

    def get_config(self):
        return super().get_config()  # the group is a runtime object, not part of the saved config


@functools.lru_cache(maxsize=None)
def keras2_sync_batch_normalization():
    """The tf_keras (Keras 2) SyncBatchNormalization class: tf_keras' BatchNormalization with
    fused=False, whose training statistics come from every rank of `group`."""
    base = keras2_compat.batch_normalization_moments_base()

    class SyncBatchNormalization(base):  # noqa: F811 - the Keras 2 flavour, same name for saved configs
        __doc__ = keras2_sync_batch_normalization.__doc__

        def __init__(self, *args, group=None, fused=False, **kwargs):
            if fused:
                raise ValueError("SyncBatchNormalization: fused=True cannot gather the global batch statistics")
            super().__init__(*args, fused=False, **kwargs)
            self._mlsl_group = group

        def batch_moments(self, inputs, reduction_axes, keep_dims, mask):
            weights = None if mask is None else tf.expand_dims(mask, -1)
            return _global_moments(inputs, list(reduction_axes), weights, self._mlsl_group, keepdims=keep_dims)

        def get_config(self):
            config = super().get_config()
            config.pop("fused", None)
            return config

    SyncBatchNormalization.__module__ = __name__
    return SyncBatchNormalization


if keras2_compat.legacy_keras_active():  # tf.keras is tf_keras: so is mlsl_tf's layer
    SyncBatchNormalization = keras2_sync_batch_normalization()  # noqa: F811
