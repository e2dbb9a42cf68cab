"""Keras 3 behind one seam: every private Keras 3 member mlsl_tf relies on is used here and only
here, behind named functions (DistributedOptimizer's subclass hook, cross-iteration overlap's
per-variable update and access hooks, SyncBatchNormalization's statistics), plus the optimizer
helpers the callbacks, elastic state and load_model use, with the same names and meaning as
mlsl_tf.keras2_compat's (mlsl_tf.keras_flavour picks one per object).

PRIVATE_MEMBERS lists what this module relies on; tests/unit/test_keras_contract.py checks each
entry against the installed Keras, so an upgrade that moves one fails a test naming it.

The one global patch. DistributedGradientTape's gradients can be applied by any plain Keras
optimizer (`opt.apply(tape.gradient(...))`), which the tape never sees, so there is no instance
or subclass to hook: `install_apply_hook` wraps `BaseOptimizer.apply` once. It is idempotent
(a second install is a no-op), scoped (the wrapper calls `intercept` only with explicit
variables, inside a traced function, and everything else -- and whatever `intercept` declines --
goes to the original `apply` unchanged), and reversible (`remove_apply_hook`).
"""

import contextlib

import keras
import numpy as np

# (class or module, member, kind, used by): kind is "attribute" (on a built instance), "class",
# "function" (a module-level callable), or a method's leading parameter names after self.
BASE_OPTIMIZER = "keras.src.optimizers.base_optimizer.BaseOptimizer"
BATCH_NORMALIZATION = "keras.layers.BatchNormalization"
TF_VARIABLE = "keras.src.backend.tensorflow.core.Variable"
PRIVATE_MEMBERS = (
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "class", "install_apply_hook (patched)"),
    (BASE_OPTIMIZER, "_trainable_variables", "attribute", "trainable_variables"),
    (BASE_OPTIMIZER, "_iterations", "attribute", "iterations_variable, step_values, advance_iterations"),
    (BASE_OPTIMIZER, "_learning_rate", "attribute", "learning_rate_dtype, step_values"),
    (BASE_OPTIMIZER, "_get_variable_index", ("variable",), "variable_index"),
    (BASE_OPTIMIZER, "_check_variables_are_known", ("variables",), "check_variables_are_known"),
    (BASE_OPTIMIZER, "_filter_empty_gradients", ("grads", "vars"), "filter_empty_gradients"),
    (BASE_OPTIMIZER, "_clip_gradients", ("grads",), "update_variable"),
    (BASE_OPTIMIZER, "_apply_weight_decay", ("variables",), "update_variable"),
    (BASE_OPTIMIZER, "_backend_update_step", ("grads", "trainable_variables", "learning_rate"),
     "update_variable"),
    (BASE_OPTIMIZER, "_backend_apply_gradients", ("grads", "trainable_variables"), "overridden_update_path"),
    (BASE_OPTIMIZER, "apply", ("grads", "trainable_variables"), "install_apply_hook (patched)"),
    (BATCH_NORMALIZATION, "_moments", ("inputs", "mask"), "BatchNormalizationMoments (overridden)"),
    (BATCH_NORMALIZATION, "_reduction_axes", "attribute", "BatchNormalizationMoments"),
    ("keras.src.backend.common.stateless_scope", "in_stateless_scope", "function", "computing_shapes_only"),
    (TF_VARIABLE, "_value", "attribute", "resource_handle"),
    ("keras.src.backend.common.variables", "AutocastScope", "class", "no_autocast"),
    ("keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer", "check_finite", ("grads",),
     "install_loss_scale_hook (patched)"),
    ("keras.src.backend.common.symbolic_scope", "in_symbolic_scope", "function", "computing_shapes_only"),
)

# The methods an optimizer's per-variable update goes through: a class overriding one of them
# may need every gradient at once, so its update cannot be split per variable.
UPDATE_PATH = ("apply", "_backend_apply_gradients", "_backend_update_step", "_apply_weight_decay",
               "_clip_gradients", "_filter_empty_gradients")


# ----------------------------------------------------------------------------------------------
# helpers shared with mlsl_tf.keras2_compat (same names, same meaning)

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


# ----------------------------------------------------------------------------------------------
# optimizer internals: DistributedOptimizer (mlsl_tf/optimizer/keras3.py)

def trainable_variables(optimizer):
    """The variables the (built) optimizer updates, in the order of its build."""
    return list(optimizer._trainable_variables)


def variable_index(optimizer, variable):
    """`variable`'s position in the optimizer's variable list (its slots' index)."""
    return optimizer._get_variable_index(variable)


def check_variables_are_known(optimizer, variables):
    """Raises Keras' own error when one of `variables` was not in the optimizer's build."""
    optimizer._check_variables_are_known(variables)


def swap_class(optimizer, cls):
    """Makes `optimizer` an instance of `cls` (a subclass of its own class), state kept: how
    load_model re-wraps a loaded optimizer in place."""
    optimizer.__class__ = cls


# ----------------------------------------------------------------------------------------------
# optimizer internals: cross-iteration overlap (mlsl_tf/overlap.py)

def overridden_update_path(cls):
    """The first method of the per-variable update path that `cls` overrides, or ''."""
    base = keras.optimizers.Optimizer
    for method in UPDATE_PATH:
        if getattr(cls, method, None) is not getattr(base, method, None):
            return method
    return ""


def iterations_variable(optimizer):
    """The optimizer's step counter variable."""
    return optimizer._iterations


def learning_rate_dtype(optimizer):
    return getattr(optimizer._learning_rate, "dtype", None) or keras.config.floatx()


def resource_handle(var):
    """The resource handle of the TensorFlow variable behind the Keras variable `var`. Not
    `var.value.handle`: under a mixed-precision policy's autocast scope `value` is a cast tensor."""
    return var._value.handle


def no_autocast():
    """A scope where Keras variables read as their own dtype: an optimizer update that runs
    inside a layer's call under a mixed-precision policy (a deferred update applied on the
    variable's first read) must not see its float32 variables cast to bfloat16 / float16."""
    from keras.src.backend.common.variables import AutocastScope
    return AutocastScope(None)


def step_state_ids(optimizer):
    """ids of the optimizer variables that are not per-variable state (iterations, learning rate)."""
    return {id(optimizer._iterations), id(optimizer._learning_rate)}


@contextlib.contextmanager
def step_values(optimizer, iteration, learning_rate):
    """Within: the optimizer reads `iteration` and `learning_rate` (variables) as its own step
    counter and learning rate (a schedule is evaluated at `iteration`)."""
    saved = optimizer.__dict__["_iterations"], optimizer.__dict__["_learning_rate"]
    object.__setattr__(optimizer, "_iterations", iteration)
    object.__setattr__(optimizer, "_learning_rate", learning_rate)
    try:
        yield
    finally:
        object.__setattr__(optimizer, "_iterations", saved[0])
        object.__setattr__(optimizer, "_learning_rate", saved[1])


def filter_empty_gradients(optimizer, grads, variables):
    """(grads, variables) without the pairs whose gradient is None, as apply() filters them."""
    return optimizer._filter_empty_gradients(grads, variables)


def update_variable(optimizer, grad, var):
    """The optimizer's update of `var` alone, as its apply() makes it: loss-scale unscaling,
    clipnorm/clipvalue, weight decay, update_step, constraint."""
    scale = optimizer.loss_scale_factor
    if scale is not None:
        grad = grad / scale
    grad = optimizer._clip_gradients([grad])[0]
    optimizer._apply_weight_decay([var])
    optimizer._backend_update_step([grad], [var], optimizer.learning_rate)
    if var.constraint is not None:
        var.assign(var.constraint(var))


def advance_iterations(optimizer):
    optimizer._iterations.assign_add(1)


def step_learning_rate(optimizer):
    """The learning rate this step's update uses (a schedule's value at the current iteration)."""
    return optimizer.learning_rate


def optimizer_scope(optimizer):
    return keras.name_scope(optimizer.name, caller=optimizer)


def hookable(var):
    """Whether hook_variable_accesses can hook `var` (a Keras variable)."""
    return isinstance(var, keras.Variable)


def exporting():
    """Whether a SavedModel export is tracing (tf_keras only; Keras 3 reads nothing then)."""
    return False


def computing_shapes_only():
    """Keras is only computing shapes (a stateless or symbolic scope): no real reads happen."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope
    return in_stateless_scope() or in_symbolic_scope()


_hooked_classes = {}  # (variable class, hook) -> its hooked subclass


def hook_variable_accesses(var, before_access):
    """Makes every `value` read and assign/assign_add/assign_sub of the Keras variable `var` call
    `before_access(var)` first. Per variable: its class becomes a subclass of its own class
    (one per class and hook, made once), other variables are untouched."""
    cls = type(var)
    if getattr(cls, "_mlsl_before_access", None) is not None:
        if cls._mlsl_before_access is not before_access:
            raise ValueError(f"variable {getattr(var, 'path', var.name)!r} already has another access hook")
        return
    key = (cls, before_access)
    hooked = _hooked_classes.get(key)
    if hooked is None:
        base_value = cls.value

        def value(self):
            before_access(self)
            return base_value.fget(self)

        namespace = {"value": property(value), "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                     "_mlsl_before_access": staticmethod(before_access)}
        for method in ("assign", "assign_add", "assign_sub"):
            def write(self, value, _base=getattr(cls, method)):
                before_access(self)
                return _base(self, value)
            namespace[method] = write
        hooked = _hooked_classes[key] = type(cls.__name__, (cls,), namespace)
    var.__class__ = hooked


def _base_optimizer_class():
    from keras.src.optimizers import base_optimizer
    return base_optimizer.BaseOptimizer


def install_apply_hook(intercept):
    """Every Keras 3 optimizer's apply(grads, trainable_variables) first offers explicit
    variables to `intercept(optimizer, grads, variables)`; True means it applied them, False
    that apply goes on as usual. Idempotent; see the module docstring for why it is global."""
    base = _base_optimizer_class()
    current = base.apply
    if getattr(current, "_mlsl_apply_hook", False):
        return
    original = current

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if intercept(self, grads, trainable_variables):
                return None
        return original(self, grads, trainable_variables)

    apply._mlsl_apply_hook = True
    apply._mlsl_original = original
    apply.__doc__ = original.__doc__
    base.apply = apply


def install_loss_scale_hook(agree):
    """Keras' LossScaleOptimizer decides from `check_finite(grads)` whether to apply a step or to
    skip it and halve the loss scale -- on the local gradients, before its inner optimizer (a
    DistributedOptimizer, where compile wrapped one) reduces them: one rank's overflow would make
    the ranks take different branches. Every LossScaleOptimizer's check_finite then returns
    `agree(optimizer, finite)`, which for a distributed inner optimizer is the ranks' common
    answer (the others' unchanged). Idempotent; global for the reason install_apply_hook is:
    compile makes the LossScaleOptimizer, mlsl_tf never sees it."""
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
    current = LossScaleOptimizer.check_finite
    if getattr(current, "_mlsl_loss_scale_hook", False):
        return

    def check_finite(self, grads):
        return agree(self, current(self, grads))

    check_finite._mlsl_loss_scale_hook = True
    check_finite.__doc__ = current.__doc__
    LossScaleOptimizer.check_finite = check_finite


def remove_apply_hook():
    """Undoes install_apply_hook (no-op when it is not installed)."""
    base = _base_optimizer_class()
    if getattr(base.apply, "_mlsl_apply_hook", False):
        base.apply = base.apply._mlsl_original


def apply_hook_installed():
    return bool(getattr(_base_optimizer_class().apply, "_mlsl_apply_hook", False))


# ----------------------------------------------------------------------------------------------
# layers: SyncBatchNormalization (mlsl_tf/keras/sync_batch_norm.py)

class BatchNormalizationMoments(keras.layers.BatchNormalization):
    """BatchNormalization whose training mean and variance come from
    `self.batch_moments(inputs, reduction_axes, mask)` (a subclass defines it)."""

    def _moments(self, inputs, mask):
        return self.batch_moments(inputs, list(self._reduction_axes), mask)

    def batch_moments(self, inputs, reduction_axes, mask):
        raise NotImplementedError
