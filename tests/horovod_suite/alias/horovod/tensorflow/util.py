"""horovod.tensorflow.util's one name the suite uses."""

import tensorflow as tf


def _executing_eagerly():
    return tf.executing_eagerly()
