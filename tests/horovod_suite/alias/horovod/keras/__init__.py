"""horovod.keras (Horovod's API for standalone Keras) is mlsl_tf.keras, which serves Keras 3 and Keras 2 (tf_keras)."""

import sys

import mlsl_tf.keras

sys.modules[__name__] = mlsl_tf.keras
