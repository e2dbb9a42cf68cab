"""Keras 2 (tf_keras) behind one seam: DistributedOptimizer for its optimizers, and the optimizer
helpers the callbacks, elastic state and load_model need.

Which Keras an object belongs to is read off the object (`is_keras2`): a tf_keras optimizer,
model or variable, whatever TF_USE_LEGACY_KERAS says. `tf.keras` being tf_keras
(`legacy_keras_active`) only decides what to do without an object (load_model, the layer base
classes).

The hook. tf_keras' `model.fit` calls `optimizer.minimize(loss, vars, tape=tape)`, which is
`compute_gradients` (new optimizers) or `_compute_gradients` (legacy OptimizerV2) followed by
`apply_gradients`. As in Horovod, the gradients are reduced where they are computed
(`compute_gradients`, `_compute_gradients`, `get_gradients`), so `opt._compute_gradients(...)`
returns reduced gradients; `apply_gradients` reduces only gradients that did not come out of
those methods (a plain tf.GradientTape's), so either path reduces exactly once. With
backward_passes_per_step = k, the gradients are summed locally into accumulators
(`_agg_helper.accumulators`, pass count `_agg_helper.counter`); every k-th pass the sum (the
mean, with average_aggregated_gradients) is reduced and applied, the other passes only advance
`iterations`, as Horovod does. Gradient i (position in the variable list, forward order) is the
collective `{name}.grad.{i}` with priority i (ReduceOptions).

No cross-iteration overlap under Keras 2: the update happens inside the step (logged once).

Private tf_keras members relied on, all here and nowhere else in mlsl_tf (PRIVATE_MEMBERS;
tests/unit/test_keras_contract.py checks each against the installed tf_keras):
- legacy OptimizerV2: `_compute_gradients(loss, var_list, grad_loss=, tape=)` (overridden, and
  called through super), `_create_all_weights(var_list)` and `_name` (builds the slots before a
  conditional apply, in the scope apply_gradients uses), `_slots` (var key -> {slot name: var}),
  `_iterations` (whether it has state), `_momentum` (SGD uses momentum).
- new Keras 2 optimizer (tf_keras.src.optimizers.optimizer): `_built` (whether it has state).
  Otherwise only public members: compute_gradients, apply_gradients, build, iterations,
  variables, learning_rate, momentums (SGD).
- tf_keras' CallbackList calls `_implements_{train,test,predict}_batch_hooks()` on every
  callback (CallbackHooks answers them).
- class paths: tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2,
  tf_keras.src.optimizers.optimizer.Optimizer, tf_keras.src.engine.base_layer.Layer.
- BatchNormalization's `_calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=None)`
  (overridden by batch_normalization_moments_base, for SyncBatchNormalization).
"""

import json
import logging
import os
import sys
import zipfile

import tensorflow as tf

from mlsl_tf.groups import check_reduction_group

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
     "_Keras2DistributedOptimizer._compute_gradients (overridden, called through super)"),
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

_log = logging.getLogger("mlsl_tf")
_logged_synchronous = []


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
# DistributedOptimizer

class _AggregationHelper:
    """backward_passes_per_step > 1: a local sum per variable and the count of passes since the
    last reduction (Horovod's `_agg_helper`, whose `counter` tests read)."""

    def __init__(self, passes, average):
        self.passes = passes
        self.average = average
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="mlsl_backward_passes")
        self.accumulators = {}  # id(variable) -> (variable, accumulator)

    def accumulator(self, var, dtype):
        entry = self.accumulators.get(id(var))
        if entry is None or entry[0] is not var:
            with tf.init_scope():
                acc = tf.Variable(tf.zeros(var.shape, dtype), trainable=False, name="mlsl_grad_accumulator")
            entry = self.accumulators[id(var)] = (var, acc)
        return entry[1]


class _Keras2DistributedOptimizer:
    """Mixed in before the wrapped tf_keras optimizer's class. Class attributes (set on each
    generated class): _mlsl_options, _mlsl_passes, _mlsl_average_aggregated, _mlsl_scale_local."""

    _mlsl_options = None
    _mlsl_passes = 1
    _mlsl_average_aggregated = False
    _mlsl_scale_local = True

    # -- Horovod-visible state, made on first use (a load_model re-wrap swaps the class in place)
    @property
    def _agg_helper(self):
        if self._mlsl_passes <= 1:
            return None
        helper = self.__dict__.get("_mlsl_agg_helper")
        if helper is None:
            helper = _AggregationHelper(self._mlsl_passes, self._mlsl_average_aggregated)
            object.__setattr__(self, "_mlsl_agg_helper", helper)
        return helper

    def _mlsl_reduced_ids(self):
        """id -> object of what compute_gradients / get_gradients reduced since the last apply:
        the gradients, and (under "vars") the variables they belong to."""
        ids = self.__dict__.get("_mlsl_reduced")
        if ids is None:
            ids = {"vars": {}}
            object.__setattr__(self, "_mlsl_reduced", ids)
        return ids

    def register_local_var(self, var):
        """Marks `var` as this rank's own (Horovod's register_local_var): its gradient is not
        reduced, only divided by the group's size (scale_local_gradients) or kept as is."""
        self.__dict__.setdefault("_mlsl_local_vars", {})[id(var)] = var

    # -- where gradients are computed
    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, tape=tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        parent = super(_Keras2DistributedOptimizer, self)
        if hasattr(parent, "_compute_gradients"):  # legacy OptimizerV2
            grads_and_vars = parent._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        else:
            grads_and_vars = parent.compute_gradients(loss, var_list, tape=tape)
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        return list(zip(self._mlsl_allreduce(list(grads), list(variables)), variables))

    def get_gradients(self, loss, params):
        grads = super().get_gradients(loss, params)
        return self._mlsl_allreduce(list(grads), list(params))

    # -- reduction
    def _mlsl_reduce(self, grads, variables):
        """The gradients reduced over the ranks (gradient p has priority and name index p),
        except those of local variables, which are scaled by 1/size or kept."""
        options = self._mlsl_options
        if not options.member():
            return list(grads)  # as Horovod: a rank outside the process set keeps its gradients
        check_reduction_group(variables, options.process_set)
        mine = self.__dict__.get("_mlsl_local_vars", {})
        is_local = [id(v) in mine and mine[id(v)] is v for v in variables]
        positions = {id(v): p for p, v in enumerate(variables)}
        return options.reduce_except_local(grads, is_local, list(range(len(grads))), lambda v: positions.get(id(v)),
                                           self._mlsl_scale_local)

    def _mlsl_allreduce(self, grads, variables):
        """Reduced gradients (passes == 1), or with k passes: this pass's gradients added to the
        local sums; on every k-th pass the reduced sums (cleared afterwards), else the sums."""
        if self._mlsl_passes <= 1:
            out = self._mlsl_reduce(grads, variables)
        else:
            out = self._mlsl_aggregate(grads, variables)
        marks = self._mlsl_reduced_ids()
        for g, v in zip(out, variables):
            if g is not None:
                marks[id(g)] = g
                marks["vars"][id(v)] = v
        return out

    def _mlsl_aggregate(self, grads, variables):
        helper = self._agg_helper
        k = helper.passes
        present = [p for p, g in enumerate(grads) if g is not None]
        accumulators = {}
        for p in present:
            g = tf.convert_to_tensor(grads[p])
            acc = accumulators[p] = helper.accumulator(variables[p], g.dtype)
            acc.assign_add(g)
        passes = helper.counter.assign_add(1)

        def reduce_and_clear():
            local = [accumulators[p].read_value() if p in accumulators else None for p in range(len(grads))]
            if helper.average:
                local = [None if a is None else a / tf.cast(k, a.dtype) for a in local]
            reduced = self._mlsl_reduce(local, variables)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                clears = [accumulators[p].assign(tf.zeros_like(accumulators[p])) for p in present]
                clears.append(helper.counter.assign(0))
            with tf.control_dependencies(clears):
                return [tf.identity(reduced[p]) for p in present]

        def local_sums():
            return [accumulators[p].read_value() for p in present]

        if not present:
            helper.counter.assign(tf.where(tf.equal(passes, k), 0, passes))
            return list(grads)
        values = tf.cond(tf.equal(passes, k), reduce_and_clear, local_sums)
        out = [None] * len(grads)
        for p, v in zip(present, values):
            out[p] = v
        return out

    # -- where gradients are applied
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        marks = self._mlsl_reduced_ids()
        object.__setattr__(self, "_mlsl_reduced", {"vars": {}})
        if not grads_and_vars:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        # A gradient this optimizer reduced, or one derived from it since (as Horovod's flag has
        # it): LossScaleOptimizer unscales the reduced gradients into new tensors, a user may clip
        # them between compute_gradients and apply_gradients. Reducing those again would make a
        # Sum size^2 times the gradient.
        ours = [g is None or marks.get(id(g)) is g or marks["vars"].get(id(v)) is v for g, v in zip(grads, variables)]
        if not all(ours):  # gradients of a plain tape: reduce (aggregate) those here, only those
            reduced = self._mlsl_allreduce([None if o else g for g, o in zip(grads, ours)], variables)
            grads = [g if o else r for g, o, r in zip(grads, ours, reduced)]
            object.__setattr__(self, "_mlsl_reduced", {"vars": {}})
            grads_and_vars = list(zip(grads, variables))
        if self._mlsl_passes <= 1:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        build_optimizer(self, [v for g, v in grads_and_vars if g is not None])
        parent = super()

        def apply():
            parent.apply_gradients(grads_and_vars, *args, **kwargs)
            return tf.constant(True)

        def skip():
            self.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(tf.equal(self._agg_helper.counter, 0), apply, skip)


def _note_synchronous(name):
    if not _logged_synchronous:
        _logged_synchronous.append(name)
        _log.info("mlsl_tf: %s (Keras 2) applies its updates inside the training step: cross-iteration "
                  "overlap is for Keras 3 optimizers only", name)


def is_distributed(optimizer):
    return isinstance(optimizer, _Keras2DistributedOptimizer)


def _base_class(optimizer):
    cls = type(optimizer)
    while issubclass(cls, _Keras2DistributedOptimizer):
        cls = next(b for b in cls.__mro__[1:] if not issubclass(b, _Keras2DistributedOptimizer))
    return cls


def distributed_optimizer(optimizer, options, backward_passes_per_step, average_aggregated_gradients,
                          scale_local_gradients, in_place=False, overlap_wanted=False):
    """A copy of the tf_keras `optimizer` (same class name, module and config; with
    in_place=True the optimizer itself) whose gradients are reduced as `options` say.
    overlap_wanted: cross-iteration overlap is on, so say (once) that Keras 2 runs without it."""
    base = _base_class(optimizer)
    if overlap_wanted:
        _note_synchronous(base.__name__)
    cls = type(base.__name__, (_Keras2DistributedOptimizer, base), {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_mlsl_options": options,
        "_mlsl_passes": int(backward_passes_per_step),
        "_mlsl_average_aggregated": bool(average_aggregated_gradients),
        "_mlsl_scale_local": bool(scale_local_gradients),
    })
    if in_place:
        optimizer.__class__ = cls
        return optimizer
    if optimizer_built(optimizer):
        raise ValueError(f"DistributedOptimizer: the tf_keras optimizer {base.__name__} already has state (slots or "
                         "steps); wrap it before its first step (load_model re-wraps a loaded one with its state)")
    return cls.from_config(optimizer.get_config())


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
