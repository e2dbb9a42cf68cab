"""SyncBatchNormalization: Keras 3 BatchNormalization whose training statistics are those of the
global batch (every rank's samples), as Horovod's SyncBatchNormalization."""

import keras
import tensorflow as tf

from mlsl_tf import ops


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """In training, the mean and variance over the batch axes come from the samples of every
    rank (of `group`, default all): each rank's per-channel sum, sum of squares and count travel
    in one allreduce. Inference, moving statistics and every other argument are
    BatchNormalization's. Small per-rank batches then normalise as one large batch would."""

    def __init__(self, *args, group=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._mlsl_group = group

    def _moments(self, inputs, mask):
        axes = list(self._reduction_axes)
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            total = tf.reduce_sum(x, axes)
            squares = tf.reduce_sum(tf.square(x), axes)
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype) * tf.ones_like(total)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            total = tf.reduce_sum(weights * x, axes)
            squares = tf.reduce_sum(weights * tf.square(x), axes)
            count = tf.reduce_sum(weights, axes)
        summed = ops.allreduce(tf.stack([total, squares, count]), op=ops.Sum, process_set=self._mlsl_group)
        total, squares, count = tf.unstack(summed)
        count = tf.maximum(count, tf.ones_like(count))
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), tf.zeros_like(mean))
        return mean, variance

    def get_config(self):
        return super().get_config()  # the group is a runtime object, not part of the saved config
