"""horovod.keras (Horovod's API for standalone Keras) is mlsl_tf.keras: Keras 3 is the only Keras."""

import sys

import mlsl_tf.keras

sys.modules[__name__] = mlsl_tf.keras
