"""Keras 3: the optimizer helpers the callbacks, elastic state and load_model use, with the same
names and meaning as mlsl_tf.keras2_compat's (mlsl_tf.keras_flavour picks one per object).
Keras 3's DistributedOptimizer itself is mlsl_tf/optimizer.py, its overlap mlsl_tf/overlap.py.

Private Keras 3 members relied on here: `optimizer.built` and `keras.name_scope(..., caller=)`
(public), nothing private."""

import keras
import numpy as np


def optimizer_variables(optimizer):
    return list(optimizer.variables)


def optimizer_built(optimizer):
    return bool(optimizer.built)


def build_optimizer(optimizer, variables):
    """Creates the optimizer's state (slots) for `variables`, as its first apply would."""
    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(list(variables))


def get_learning_rate(optimizer):
    return float(np.asarray(keras.ops.convert_to_numpy(optimizer.learning_rate)))


def momentum_buffers(optimizer):
    """SGD's momentum buffers (rescaled by the learning-rate callbacks); [] for other optimizers."""
    return list(getattr(optimizer, "momentums", None) or [])


def load_model(filepath, custom_objects=None):
    return keras.models.load_model(filepath, custom_objects=custom_objects)


def batch_normalization_base():
    return keras.layers.BatchNormalization
