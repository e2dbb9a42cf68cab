"""Keras 2 (tf_keras) behind one seam: every private tf_keras member mlsl_tf relies on is used
here and only here, behind named functions and mixins: the optimizer helpers the callbacks,
elastic state and load_model need (same names and meaning as mlsl_tf.keras3_compat's), the
gradient hook of DistributedOptimizer's Keras 2 wrapper (mlsl_tf/optimizer/keras2.py), and the
callback and batch-normalization hooks.

Which Keras an object belongs to is read off the object (`is_keras2`): a tf_keras optimizer,
model or variable, whatever TF_USE_LEGACY_KERAS says. `tf.keras` being tf_keras
(`legacy_keras_active`) only decides what to do without an object (load_model, the layer base
classes).

The gradient hook (GradientHooks). tf_keras' `model.fit` calls `optimizer.minimize(loss, vars,
tape=tape)`, which is `compute_gradients` (new optimizers) or `_compute_gradients` (legacy
OptimizerV2) followed by `apply_gradients`. GradientHooks answers both and passes what the
optimizer computed through the subclass's `_mlsl_allreduce(grads, variables)`, so
`opt._compute_gradients(...)` returns reduced gradients, as in Horovod.

Private tf_keras members relied on, all here and nowhere else in mlsl_tf (PRIVATE_MEMBERS;
tests/unit/test_keras_contract.py checks each against the installed tf_keras):
- legacy OptimizerV2: `_compute_gradients(loss, var_list, grad_loss=, tape=)` (overridden by
  GradientHooks, and called through super), `_create_all_weights(var_list)` and `_name` (builds
  the slots before a conditional apply, in the scope apply_gradients uses), `_slots` (var key ->
  {slot name: var}), `_iterations` (whether it has state), `_momentum` (SGD uses momentum).
- new Keras 2 optimizer (tf_keras.src.optimizers.optimizer): `_built` (whether it has state).
  Otherwise only public members: compute_gradients, apply_gradients, build, iterations,
  variables, learning_rate, momentums (SGD).
- an optimizer's `__class__` (swap_class: load_model re-wraps a loaded optimizer in place).
- tf_keras' CallbackList calls `_implements_{train,test,predict}_batch_hooks()` on every
  callback (CallbackHooks answers them).
- class paths: tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2,
  tf_keras.src.optimizers.optimizer.Optimizer, tf_keras.src.engine.base_layer.Layer.
- BatchNormalization's `_calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=None)`
  (overridden by batch_normalization_moments_base, for SyncBatchNormalization).
"""

import json
import os
import sys
import zipfile

import tensorflow as tf

# (class or module, member, kind, used by): kind is "attribute" (on an instance), "class", or
# the method's leading parameter names after self.
OPTIMIZER_V2 = "tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2"
LEGACY_SGD = "tf_keras.src.optimizers.legacy.gradient_descent.SGD"
NEW_OPTIMIZER = "tf_keras.src.optimizers.optimizer.Optimizer"
BATCH_NORMALIZATION = "tf_keras.layers.BatchNormalization"
CALLBACK = "tf_keras.callbacks.Callback"
PRIVATE_MEMBERS = (
    ("tf_keras.src.optimizers.legacy.optimizer_v2", "OptimizerV2", "class", "optimizer_base_classes"),
    ("tf_keras.src.optimizers.optimizer", "Optimizer", "class", "optimizer_base_classes"),
    ("tf_keras.src.engine.base_layer", "Layer", "class", "is_keras2"),
    (OPTIMIZER_V2, "_compute_gradients", ("loss", "var_list", "grad_loss", "tape"),
     "GradientHooks._compute_gradients (overridden, called through super)"),
    (OPTIMIZER_V2, "_create_all_weights", ("var_list",), "build_optimizer"),
    (LEGACY_SGD, "_name", "attribute", "build_optimizer"),
    (LEGACY_SGD, "_slots", "attribute", "optimizer_built, momentum_buffers"),
    (LEGACY_SGD, "_iterations", "attribute", "optimizer_built"),
    (LEGACY_SGD, "_momentum", "attribute", "momentum_buffers"),
    (NEW_OPTIMIZER, "_built", "attribute", "optimizer_built"),
    (CALLBACK, "_implements_train_batch_hooks", (), "CallbackHooks (answered for tf_keras' CallbackList)"),
    (CALLBACK, "_implements_test_batch_hooks", (), "CallbackHooks (answered for tf_keras' CallbackList)"),
    (CALLBACK, "_implements_predict_batch_hooks", (), "CallbackHooks (answered for tf_keras' CallbackList)"),
    (BATCH_NORMALIZATION, "_calculate_mean_and_var", ("inputs", "reduction_axes", "keep_dims", "mask"),
     "batch_normalization_moments_base (overridden)"),
)

def _tf_keras():
    import tf_keras
    return tf_keras


def available():
    try:
        _tf_keras()
        return True
    except ImportError:
        return False


def legacy_keras_active():
    """Whether `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1 before tensorflow was imported)."""
    return getattr(tf.keras, "__name__", "").startswith("tf_keras")


def optimizer_base_classes():
    """(legacy OptimizerV2, new Keras 2 Optimizer) of tf_keras; () when tf_keras is missing."""
    if not available():
        return ()
    from tf_keras.src.optimizers.legacy.optimizer_v2 import OptimizerV2
    from tf_keras.src.optimizers.optimizer import Optimizer
    return OptimizerV2, Optimizer


def is_keras2(obj):
    """Whether `obj` (optimizer, model, layer or callback) belongs to tf_keras. Nothing is
    imported: an object of tf_keras exists only once tf_keras has been imported."""
    if obj is None or "tf_keras" not in sys.modules:
        return False
    module = type(obj).__module__ or ""
    if module.startswith("tf_keras"):
        return True
    bases = optimizer_base_classes()
    if isinstance(obj, bases):
        return True
    from tf_keras.src.engine.base_layer import Layer
    return isinstance(obj, Layer)


def is_legacy_optimizer(optimizer):
    return isinstance(optimizer, optimizer_base_classes()[0])


# ----------------------------------------------------------------------------------------------
# helpers shared with mlsl_tf.keras3_compat (same names, same meaning)

def optimizer_variables(optimizer):
    """The optimizer's variables as a list (legacy OptimizerV2 has a `variables()` method)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer, variables):
    """Creates the optimizer's state (slots) for `variables`, as its first apply would."""
    variables = list(variables)
    with tf.init_scope():
        if is_legacy_optimizer(optimizer):
            with tf.name_scope(optimizer._name):
                optimizer._create_all_weights(variables)
        else:
            optimizer.build(variables)


def optimizer_built(optimizer):
    """Whether the optimizer has state (slots, or steps taken); a LossScaleOptimizer's is its
    inner optimizer's (the legacy one keeps no slots of its own)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None and inner is not optimizer:
        return optimizer_built(inner)
    if is_legacy_optimizer(optimizer):
        iterations = getattr(optimizer, "_iterations", None)
        return bool(optimizer._slots) or (iterations is not None and int(iterations.numpy()) > 0)
    return bool(getattr(optimizer, "_built", False))


def get_learning_rate(optimizer):
    lr = optimizer.learning_rate
    if callable(lr) and not isinstance(lr, tf.Variable):
        lr = lr(optimizer.iterations)
    return float(tf.convert_to_tensor(lr).numpy())


def momentum_buffers(optimizer):
    """SGD's momentum buffers (rescaled by the learning-rate callbacks); [] for other optimizers."""
    if is_legacy_optimizer(optimizer):
        if not getattr(optimizer, "_momentum", False) or "momentum" not in optimizer.get_slot_names():
            return []
        slots = getattr(optimizer, "_slots", {})
        return [s["momentum"] for s in slots.values() if "momentum" in s]
    return list(getattr(optimizer, "momentums", None) or [])


# ----------------------------------------------------------------------------------------------
# DistributedOptimizer's hooks (mlsl_tf/optimizer/keras2.py)

class GradientHooks:
    """Mixed in before a tf_keras optimizer's class (legacy or new): every place tf_keras computes
    gradients returns them passed through `self._mlsl_allreduce(grads, variables)`, which the
    subclass defines."""

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, tape=tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        parent = super(GradientHooks, self)
        if hasattr(parent, "_compute_gradients"):  # legacy OptimizerV2
            grads_and_vars = parent._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        else:
            grads_and_vars = parent.compute_gradients(loss, var_list, tape=tape)
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        return list(zip(self._mlsl_allreduce(list(grads), list(variables)), variables))


def swap_class(optimizer, cls):
    """Makes `optimizer` an instance of `cls` (a subclass of its own class), state kept: how
    load_model re-wraps a loaded optimizer in place."""
    optimizer.__class__ = cls



def saved_by_keras2(filepath):
    """Whether the model file was written by Keras 2: a SavedModel directory (Keras 3 writes
    none), or an .h5 / .keras file whose recorded keras_version is 2.x."""
    path = os.fspath(filepath)
    if os.path.isdir(path):
        return True
    version = ""
    try:
        if path.endswith(".keras"):
            with zipfile.ZipFile(path) as archive:
                version = json.loads(archive.read("metadata.json")).get("keras_version", "")
        else:
            import h5py
            with h5py.File(path, "r") as f:
                version = f.attrs.get("keras_version", "")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False
    if isinstance(version, bytes):
        version = version.decode()
    return str(version).startswith("2.")


def follow_interactive_logging():
    """Gives tf_keras' progress-output switch (per thread, as Keras 3's) Keras 3's setting, when
    tf_keras is in use (imported, or `tf.keras` under TF_USE_LEGACY_KERAS=1)."""
    if "tf_keras" not in sys.modules and not (os.environ.get("TF_USE_LEGACY_KERAS", "") not in ("", "0")):
        return
    import keras
    utils = _tf_keras().utils
    if keras.config.is_interactive_logging_enabled():
        utils.enable_interactive_logging()
    else:
        utils.disable_interactive_logging()


def load_model(filepath, custom_objects=None):
    """tf_keras.models.load_model (.h5, SavedModel or .keras)."""
    return _tf_keras().models.load_model(filepath, custom_objects=custom_objects)


class CallbackHooks:
    """Mixed into mlsl_tf's callbacks (Keras 3 Callback subclasses) so that tf_keras' CallbackList
    takes them too: it asks every callback which batch hooks it implements (tf_keras calls these
    private methods on callbacks; answering True only costs it a check per batch)."""

    def _implements_train_batch_hooks(self):
        return True

    def _implements_test_batch_hooks(self):
        return True

    def _implements_predict_batch_hooks(self):
        return True


def batch_normalization_base():
    return _tf_keras().layers.BatchNormalization


_moments_base = []


def batch_normalization_moments_base():
    """tf_keras' BatchNormalization whose training mean and variance come from
    `self.batch_moments(inputs, reduction_axes, keep_dims, mask)` (a subclass defines it; the
    non-fused path only)."""
    if not _moments_base:
        class BatchNormalizationMoments(batch_normalization_base()):
            def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
                return self.batch_moments(inputs, list(reduction_axes), keep_dims, mask)

            def batch_moments(self, inputs, reduction_axes, keep_dims, mask):
                raise NotImplementedError

        _moments_base.append(BatchNormalizationMoments)
    return _moments_base[0]
