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

Cross-iteration overlap (mlsl_tf/overlap.py), as for Keras 3: apply_gradients starts each
gradient's reduction and returns; each variable's update is applied just before its next read.
In a traced step the reductions compute_gradients made are offered back: a gradient that reaches
apply_gradients unchanged is reduced by the deferred collective instead (the unused allreduce is
pruned from the function); a plain tape's gradient is deferred as it is; one changed after its
reduction (a LossScaleOptimizer's unscaling, user clipping), or reduced eagerly, is applied in the
step. Optimizers whose update needs every gradient at once apply in the step, with one log line
(keras2_compat.why_not_deferred). Every private tf_keras member this relies on is used in
mlsl_tf/keras2_compat.py. The public entry point is mlsl_tf/optimizer/dispatch.py.
"""

import contextlib
import logging

import tensorflow as tf

from mlsl_tf import keras2_compat, overlap
from mlsl_tf.groups import check_reduction_group
from mlsl_tf.optimizer import reduce

_log = logging.getLogger("mlsl_tf")


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
    _mlsl_cross_iteration = None

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
        offers = marks.setdefault("offers", {})
        for g, v, local in zip(out, variables, grads):
            if g is not None:
                marks[id(g)] = g
                marks["vars"][id(v)] = v
                if self._mlsl_passes <= 1 and g is not local and not tf.executing_eagerly():
                    offers[id(g)] = (g, local)  # not run yet: the deferral may reduce `local` instead
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
        deferral = self._mlsl_deferral_for(grads, variables)
        if deferral is not None and deferral.fresh_in_this_graph(variables):
            deferral = None  # this graph read the variables before they had hooks: in the step
        items = self._mlsl_deferred_items(grads, variables, ours, marks) if deferral is not None else None
        if items is not None:
            deferral.apply(items)
            return self.iterations
        in_step = self.__dict__.get("_mlsl_deferral")
        with in_step.in_step() if in_step is not None else contextlib.nullcontext():
            return self._mlsl_apply_in_step(grads_and_vars, grads, variables, ours, args, kwargs)

    def _mlsl_deferral_for(self, grads, variables):
        """The optimizer's Deferral with `variables` registered (gradient p: priority p), made on
        first use; None (and one log line) where the update stays in the step."""
        if self._mlsl_passes > 1 or not overlap.enabled(self._mlsl_cross_iteration):
            return None
        reason = self.__dict__.get("_mlsl_in_step_reason")
        if reason is None:
            options = self._mlsl_options
            reason = ("this rank is not in the process set" if not options.member() else
                      "num_groups/groups fuse gradients across variables" if options.groups else
                      "register_local_var: local variables" if self.__dict__.get("_mlsl_local_vars") else
                      "a variable is not a resource variable (mixed precision?)"
                      if not all(keras2_compat.hookable(v) for v in variables) else
                      overlap.why_not_deferred(self, _base_class(self)))
            object.__setattr__(self, "_mlsl_in_step_reason", reason)
            if reason:
                _log.info("mlsl_tf: %s applies synchronously: %s", type(self).__name__, reason)
        if reason:
            return None
        present = [v for g, v in zip(grads, variables) if g is not None]
        keras2_compat.build_optimizer(self, present if keras2_compat.is_legacy_optimizer(self) else variables)
        deferral = overlap.Deferral.of(self, self._mlsl_options.name)
        for p, v in enumerate(variables):
            if id(v) not in deferral.records:
                deferral.register(v, self._mlsl_options, p)
        return deferral

    def _mlsl_deferred_items(self, grads, variables, ours, marks):
        """Deferral.apply's items: a gradient reduced by compute_gradients and not changed since
        (its reduction not run yet: traced) or a plain tape's is reduced later; one changed after
        its reduction is applied now. None when none can wait (one log line)."""
        options, offers = self._mlsl_options, marks.get("offers", {})
        items = []
        for p, (g, v, mine) in enumerate(zip(grads, variables, ours)):
            offer = offers.get(id(g)) if g is not None else None
            if offer is not None and offer[0] is g and not isinstance(g, tf.IndexedSlices):
                items.append((offer[1], v, options, p))
            else:
                items.append((g, v, None if mine else options, p))
        if any(g is not None and o is not None for g, _, o, _ in items):
            return items
        if not self.__dict__.get("_mlsl_logged_in_step"):
            object.__setattr__(self, "_mlsl_logged_in_step", True)
            _log.info("mlsl_tf: %s applies in the step: its gradients were reduced already (eager) or changed "
                      "after their reduction (a LossScaleOptimizer, clipping)", type(self).__name__)
        return None

    def _mlsl_apply_in_step(self, grads_and_vars, grads, variables, ours, args, kwargs):
        """The update inside the step (Horovod's way): the gradients not reduced yet are reduced
        (or aggregated) here, then applied."""
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


def is_distributed(optimizer):
    return isinstance(optimizer, _Keras2DistributedOptimizer)


def _base_class(optimizer):
    cls = type(optimizer)
    while issubclass(cls, keras2_compat.GradientHooks):
        cls = next(b for b in cls.__mro__[1:] if not issubclass(b, keras2_compat.GradientHooks))
    return cls


def distributed_optimizer(optimizer, options, backward_passes_per_step, average_aggregated_gradients,
                          scale_local_gradients, in_place=False, cross_iteration=None):
    """A copy of the tf_keras `optimizer` (same class name, module and config; with
    in_place=True the optimizer itself) whose gradients are reduced as `options` say, with
    cross-iteration overlap unless `cross_iteration` (default MLSL_TF_CROSS_ITERATION) is off."""
    base = _base_class(optimizer)
    if overlap.enabled(cross_iteration):
        _install_function_cache_hook()
    cls = reduce.wrapper_class(_Keras2DistributedOptimizer, base, options, backward_passes_per_step,
                               average_aggregated_gradients, scale_local_gradients, cross_iteration)
    if in_place:
        keras2_compat.swap_class(optimizer, cls)
        return optimizer
    if keras2_compat.optimizer_built(optimizer):
        raise ValueError(f"DistributedOptimizer: the tf_keras optimizer {base.__name__} already has state (slots or "
                         "steps); wrap it before its first step (load_model re-wraps a loaded one with its state)")
    return cls.from_config(optimizer.get_config())


def _install_function_cache_hook():
    """tf_keras caches a model's test and predict functions (and builds its optimizer only at
    the first training step): one traced before the variables got their access hooks reads them
    without taking their deferred updates (evaluate or predict before fit). make_test_function
    and make_predict_function then retrace it. Global, as tf_keras caches them on models mlsl_tf
    never sees; idempotent; costs one retrace per function after variables got hooks."""
    import tf_keras
    for name, attribute in (("make_test_function", "test_function"), ("make_predict_function", "predict_function")):
        current = getattr(tf_keras.Model, name)
        if getattr(current, "_mlsl_cache_hook", False):
            continue

        def make(self, force=False, _current=current, _attribute=attribute):
            made, now = self.__dict__.setdefault("_mlsl_made_at", {}), keras2_compat.hook_generation()
            if getattr(self, _attribute, None) is not None and made.get(_attribute) != now:
                force = True
            made[_attribute] = now
            return _current(self, force=force)

        make._mlsl_cache_hook = True
        make.__doc__ = current.__doc__
        setattr(tf_keras.Model, name, make)
