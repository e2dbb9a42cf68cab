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

Cross-iteration overlap (mlsl_tf/overlap.py) splits a tf_keras optimizer's update per variable
here (update_variable, step_values, ...: the functions keras3_compat has for Keras 3) and hooks
the reads and writes of resource variables (hook_variable_accesses).

Private tf_keras (and TensorFlow) members relied on, all here and nowhere else in mlsl_tf:
PRIVATE_MEMBERS, each with its user; tests/unit/test_keras_contract.py checks each against the
installed tf_keras. Besides those: an optimizer's or variable's `__class__` (swap_class,
hook_variable_accesses).
"""

import contextlib
import os
import sys

import tensorflow as tf

# (class or module, member, kind, used by): kind is "attribute" (on an instance), "class", or
# the method's leading parameter names after self.
OPTIMIZER_V2 = "tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2"
LEGACY_SGD = "tf_keras.src.optimizers.legacy.gradient_descent.SGD"
NEW_OPTIMIZER = "tf_keras.src.optimizers.optimizer.Optimizer"
BATCH_NORMALIZATION = "tf_keras.layers.BatchNormalization"
CALLBACK = "tf_keras.callbacks.Callback"
RESOURCE_VARIABLE = "tensorflow.python.ops.resource_variable_ops.BaseResourceVariable"
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
    # cross-iteration overlap
    (OPTIMIZER_V2, "_transform_gradients", ("grads_and_vars",), "update_variable, why_not_deferred"),
    (OPTIMIZER_V2, "_prepare", ("var_list",), "update_variable, why_not_deferred"),
    (OPTIMIZER_V2, "_resource_apply_dense", ("grad", "handle", "apply_state"), "update_variable"),
    (OPTIMIZER_V2, "_get_hyper", ("name", "dtype"), "step_learning_rate"),
    (OPTIMIZER_V2, "_distributed_apply", ("distribution", "grads_and_vars", "apply_state"), "why_not_deferred"),
    (LEGACY_SGD, "_hyper", "attribute", "step_values, step_learning_rate, step_state_ids"),
    (LEGACY_SGD, "_dense_apply_args", "attribute", "update_variable"),
    (LEGACY_SGD, "_sparse_apply_args", "attribute", "update_variable"),
    (OPTIMIZER_V2, "_resource_apply_sparse_duplicate_indices", ("grad", "handle", "indices"), "update_variable"),
    (NEW_OPTIMIZER, "_deduplicate_sparse_grad", ("grads",), "update_variable"),
    (NEW_OPTIMIZER, "_iterations", "attribute", "step_values, step_state_ids"),
    (NEW_OPTIMIZER, "_learning_rate", "attribute", "step_values, step_state_ids"),
    (NEW_OPTIMIZER, "_compute_current_learning_rate", (), "step_learning_rate"),
    (NEW_OPTIMIZER, "_clip_gradients", ("grads",), "update_variable"),
    (NEW_OPTIMIZER, "_apply_weight_decay", ("variables",), "update_variable"),
    (NEW_OPTIMIZER, "_update_step", ("gradient", "variable"), "update_variable"),
    (NEW_OPTIMIZER, "_update_step_xla", ("gradient", "variable", "key"), "update_variable"),
    (NEW_OPTIMIZER, "_var_key", ("variable",), "update_variable"),
    (NEW_OPTIMIZER, "_internal_apply_gradients", ("grads_and_vars",), "why_not_deferred"),
    ("tf_keras.src.optimizers.utils", "filter_empty_gradients", "function", "filter_empty_gradients"),
    ("tf_keras.src.optimizers.utils", "all_reduce_sum_gradients", "function", "why_not_deferred"),
    (RESOURCE_VARIABLE, "_read_variable_op", ("no_copy",), "hook_variable_accesses"),
    (RESOURCE_VARIABLE, "sparse_read", ("indices",), "hook_variable_accesses"),
    (RESOURCE_VARIABLE, "gather_nd", ("indices",), "hook_variable_accesses"),
    ("tensorflow.python.saved_model.save_context", "in_save_context", "function", "exporting"),
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


# ----------------------------------------------------------------------------------------------
# cross-iteration overlap (mlsl_tf/overlap.py): the per-variable update of a tf_keras optimizer,
# the same functions as keras3_compat's

# The methods a tf_keras optimizer's per-variable update goes through (legacy, new): a class
# overriding one may need every gradient at once, so its update cannot be split per variable.
LEGACY_UPDATE_PATH = ("apply_gradients", "_distributed_apply", "_transform_unaggregated_gradients",
                      "_aggregate_gradients", "_transform_gradients", "_prepare", "_decayed_lr")
NEW_UPDATE_PATH = ("apply_gradients", "_internal_apply_gradients", "_distributed_apply_gradients_fn",
                   "_apply_weight_decay", "_clip_gradients", "_update_step", "_update_step_xla",
                   "_compute_current_learning_rate")


def why_not_deferred(optimizer, cls):
    """'' when the tf_keras `optimizer`'s update can be split per variable, else the reason;
    `cls`: the class whose update path runs."""
    from tf_keras.src.optimizers import utils
    legacy = is_legacy_optimizer(optimizer)
    base = optimizer_base_classes()[0 if legacy else 1]
    if "LossScaleOptimizer" in cls.__name__:
        return "LossScaleOptimizer checks every gradient before applying any"
    for method in LEGACY_UPDATE_PATH if legacy else NEW_UPDATE_PATH:
        if getattr(cls, method, None) is not getattr(base, method, None):
            return f"{cls.__name__} overrides {method}"
    if getattr(optimizer, "global_clipnorm", None):
        return "global_clipnorm needs every gradient at once"
    if tf.distribute.has_strategy():
        return "a tf.distribute strategy is in scope"
    if legacy and (optimizer.gradient_transformers or optimizer.gradient_aggregator
                   is not utils.all_reduce_sum_gradients):
        return "gradient_transformers / gradient_aggregator see every gradient at once"
    if not legacy and getattr(optimizer, "use_ema", False):
        return "use_ema updates every variable's average together"
    return ""


def hookable(var):
    """Whether hook_variable_accesses can hook `var` (not a mixed-precision AutoCastVariable)."""
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable
    return isinstance(var, BaseResourceVariable)


def resource_handle(var):
    return var.handle


def no_autocast():  # hookable variables are never AutoCastVariables
    return contextlib.nullcontext()


def computing_shapes_only():  # tf_keras has no stateless scope
    return False


def exporting():
    """A SavedModel is being traced (its functions must not take deferred results)."""
    from tensorflow.python.saved_model import save_context
    return not tf.executing_eagerly() and save_context.in_save_context()


def iterations_variable(optimizer):
    return optimizer.iterations


def advance_iterations(optimizer):
    optimizer.iterations.assign_add(1)


def learning_rate_dtype(_optimizer):
    return _tf_keras().backend.floatx()


def optimizer_scope(optimizer):
    return tf.name_scope(optimizer._name if is_legacy_optimizer(optimizer) else optimizer.name)


def step_state_ids(optimizer):
    """ids of the optimizer variables that are not per-variable state: iterations, learning
    rate and the other hyperparameters."""
    if is_legacy_optimizer(optimizer):
        return {id(optimizer.iterations)} | {id(v) for v in optimizer._hyper.values() if isinstance(v, tf.Variable)}
    return {id(v) for v in (optimizer._iterations, optimizer._learning_rate,
                            getattr(optimizer, "_current_learning_rate", None)) if isinstance(v, tf.Variable)}


def step_learning_rate(optimizer):
    """The learning rate of this step's update, before a legacy optimizer's `decay` (applied at
    the recorded iteration): a schedule's value at the current iteration."""
    if is_legacy_optimizer(optimizer):
        lr = optimizer._hyper["learning_rate"]
        if isinstance(lr, _tf_keras().optimizers.schedules.LearningRateSchedule):
            return lr(tf.cast(optimizer.iterations, learning_rate_dtype(optimizer)))
        return optimizer._get_hyper("learning_rate")
    optimizer._compute_current_learning_rate()  # as apply_gradients does first
    return optimizer.learning_rate


@contextlib.contextmanager
def step_values(optimizer, iteration, learning_rate):
    """Within: the optimizer reads `iteration` and `learning_rate` (variables) as its step counter
    and learning rate."""
    legacy = is_legacy_optimizer(optimizer)
    saved = optimizer._iterations, optimizer._hyper["learning_rate"] if legacy else optimizer._learning_rate
    object.__setattr__(optimizer, "_iterations", iteration)
    if legacy:
        optimizer._hyper["learning_rate"] = learning_rate
    else:
        object.__setattr__(optimizer, "_learning_rate", learning_rate)
    try:
        yield
    finally:
        object.__setattr__(optimizer, "_iterations", saved[0])
        if legacy:
            optimizer._hyper["learning_rate"] = saved[1]
        else:
            object.__setattr__(optimizer, "_learning_rate", saved[1])


def filter_empty_gradients(_optimizer, grads, variables):
    from tf_keras.src.optimizers import utils
    pairs = list(utils.filter_empty_gradients(list(zip(grads, variables))))
    return [g for g, _ in pairs], [v for _, v in pairs]


def update_variable(optimizer, grad, var):
    """The optimizer's update of `var` alone, as its apply_gradients makes it: clipnorm /
    clipvalue, (new optimizers) weight decay, the update step, the constraint."""
    if is_legacy_optimizer(optimizer):
        (grad, _), = optimizer._transform_gradients([(grad, var)])
        sparse = isinstance(grad, tf.IndexedSlices)
        args = optimizer._sparse_apply_args if sparse else optimizer._dense_apply_args
        kwargs = {"apply_state": optimizer._prepare([var])} if "apply_state" in args else {}
        if sparse:
            optimizer._resource_apply_sparse_duplicate_indices(grad.values, var, grad.indices, **kwargs)
            return
        update = optimizer._resource_apply_dense(grad, var, **kwargs)
        if var.constraint is not None:
            with tf.control_dependencies([update]):
                var.assign(var.constraint(var))
        return
    grad = optimizer._deduplicate_sparse_grad(optimizer._clip_gradients([grad]))[0]
    optimizer._apply_weight_decay([var])
    if optimizer.jit_compile:  # its own trace (key): the step values are captured when traced
        optimizer._update_step_xla(grad, var, -1 - id(optimizer._var_key(var)))
    else:
        optimizer._update_step(grad, var)
    if var.constraint is not None:
        var.assign(var.constraint(var))


_hooked_classes = {}  # (variable class, hook) -> its hooked subclass
_hook_generation = [0]  # variables hooked so far: model functions traced before are retraced
_READS_AND_WRITES = ("_read_variable_op", "sparse_read", "gather_nd", "assign", "assign_add", "assign_sub")


def hook_variable_accesses(var, before_access):
    """Makes every read (`value`, `read_value`, `numpy`, conversion, gathers: all go through
    `_read_variable_op` or a gather) and every assign* of the resource variable `var` call
    `before_access(var)` first. Per variable: its class becomes a subclass of its own class."""
    cls = type(var)
    if getattr(cls, "_mlsl_before_access", None) is not None:
        if cls._mlsl_before_access is not before_access:
            raise ValueError(f"variable {var.name!r} already has another access hook")
        return
    hooked = _hooked_classes.get((cls, before_access))
    if hooked is None:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                     "_mlsl_before_access": staticmethod(before_access)}
        for method in _READS_AND_WRITES:
            def call(self, *args, _base=getattr(cls, method), **kwargs):
                before_access(self)
                return _base(self, *args, **kwargs)
            namespace[method] = call
        hooked = _hooked_classes[(cls, before_access)] = type(cls.__name__, (cls,), namespace)
    var.__class__ = hooked
    _hook_generation[0] += 1


def hook_generation():
    """How many variables got their access hook so far (functions traced before may lack takes)."""
    return _hook_generation[0]
