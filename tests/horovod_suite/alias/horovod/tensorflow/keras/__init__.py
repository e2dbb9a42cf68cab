"""horovod.tensorflow.keras is mlsl_tf.keras."""

import sys

import mlsl_tf.keras

sys.modules[__name__] = mlsl_tf.keras
