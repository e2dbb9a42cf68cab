"""The one place that decides which Keras an object belongs to: `of(obj)` is mlsl_tf.keras2_compat
for tf_keras objects, else mlsl_tf.keras3_compat; `default()` the module for `tf.keras`; and
`Callback`, the base of mlsl_tf's callbacks, which both Keras' model.fit take."""

import keras

from mlsl_tf import keras2_compat, keras3_compat


class Callback(keras2_compat.CallbackHooks, keras.callbacks.Callback):
    """Keras 3's Callback, taken by tf_keras' model.fit as well."""


def of(obj):
    """The compat module for `obj` (an optimizer, model, layer or variable)."""
    return keras2_compat if keras2_compat.is_keras2(obj) else keras3_compat


def default():
    """The compat module for whatever `tf.keras` is (tf_keras under TF_USE_LEGACY_KERAS=1)."""
    return keras2_compat if keras2_compat.legacy_keras_active() else keras3_compat
