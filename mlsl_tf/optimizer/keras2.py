"""Keras 2 (tf_keras) optimizers made distributed, legacy OptimizerV2 and new alike, as Horovod's
Keras 2 wrapper: a subclass of the optimizer's own class that reduces the gradients where they are
computed.

As in Horovod, the gradients are reduced where they are computed (`compute_gradients`,
`_compute_gradients`: keras2_compat.GradientHooks; `get_gradients`), so `opt._compute_gradients(...)`
returns reduced gradients; `apply_gradients` reduces only gradients that did not come out of
those methods (a plain tf.GradientTape's), so either path reduces exactly once. With
backward_passes_per_step = k, the gradients are summed locally into accumulators
(`_agg_helper.accumulators`, pass count `_agg_helper.counter`); every k-th pass the sum (the
mean, with average_aggregated_gradients) is reduced and applied, the other passes only advance
`iterations`, as Horovod does. Gradient i (position in the variable list, forward order) is the
collective `{name}.grad.{i}` with priority i (mlsl_tf/optimizer/reduce.py).

No cross-iteration overlap under Keras 2: the update happens inside the step (logged once).
Every private tf_keras member this relies on is used in mlsl_tf/keras2_compat.py. The public
entry point is mlsl_tf/optimizer/dispatch.py.
"""

import logging

import tensorflow as tf

from mlsl_tf import keras2_compat
from mlsl_tf.groups import check_reduction_group

_log = logging.getLogger("mlsl_tf")
_logged_synchronous = []


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


class _Keras2DistributedOptimizer(keras2_compat.GradientHooks):
    """Mixed in before the wrapped tf_keras optimizer's class (GradientHooks sends what it
    computes through _mlsl_allreduce). Class attributes (set on each generated class):
    _mlsl_options, _mlsl_passes, _mlsl_average_aggregated, _mlsl_scale_local."""

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

    # -- where gradients are computed (and compute_gradients, through GradientHooks)
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
        keras2_compat.build_optimizer(self, [v for g, v in grads_and_vars if g is not None])
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
    while issubclass(cls, keras2_compat.GradientHooks):
        cls = next(b for b in cls.__mro__[1:] if not issubclass(b, keras2_compat.GradientHooks))
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
        keras2_compat.swap_class(optimizer, cls)
        return optimizer
    if keras2_compat.optimizer_built(optimizer):
        raise ValueError(f"DistributedOptimizer: the tf_keras optimizer {base.__name__} already has state (slots or "
                         "steps); wrap it before its first step (load_model re-wraps a loaded one with its state)")
    return cls.from_config(optimizer.get_config())
