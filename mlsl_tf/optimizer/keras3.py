"""Keras 3 optimizers made distributed: a subclass of the optimizer's own class whose apply()
first reduces the gradients over the ranks (or defers them to cross-iteration overlap).

Keras 3 optimizers funnel every update through `apply(grads, trainable_variables)` (`apply_gradients`
and `model.fit`'s train step both call it), so a subclass of the wrapped optimizer's own class that
overrides `apply` (and `build`, for the accumulators) is the whole hook. The subclass keeps the
base class's name, module and get_config, so a model saved with it loads anywhere as the plain
optimizer, and `mlsl_tf.keras.load_model` re-wraps it. Collective names and priorities:
mlsl_tf/optimizer/reduce.py. The public entry point is mlsl_tf/optimizer/dispatch.py.
"""

import logging

import tensorflow as tf

from mlsl_tf import keras3_compat, ops, overlap
from mlsl_tf.groups import check_reduction_group
from mlsl_tf.optimizer import reduce
from mlsl_tf.optimizer.reduce import unique_prefix


class _DistributedOptimizer:
    """Mixed in before the wrapped optimizer's class by DistributedOptimizer. Class attributes
    (set on each generated class): _mlsl_options, _mlsl_passes, _mlsl_average_aggregated."""

    _mlsl_options = None
    _mlsl_passes = 1
    _mlsl_average_aggregated = False

    _mlsl_cross_iteration = None
    _mlsl_scale_local = True

    def build(self, variables):
        super().build(variables)
        self._mlsl_after_build()

    def _mlsl_after_build(self):
        self._mlsl_make_accumulators()
        self._mlsl_make_deferral()

    def _mlsl_make_deferral(self):
        """Cross-iteration overlap (mlsl_tf/overlap.py) for every trainable variable, when the
        options and the wrapped optimizer allow it."""
        if self.__dict__.get("_mlsl_deferral") is not None or not overlap.enabled(self._mlsl_cross_iteration):
            return
        options = self._mlsl_options
        variables = keras3_compat.trainable_variables(self)
        keras_variables = all(isinstance(v, keras_variable_class()) for v in variables)
        reason = ("this rank is not in the process set" if not options.member() else
                  "backward_passes_per_step > 1" if self._mlsl_passes > 1 else
                  "num_groups/groups fuse gradients across variables" if options.groups else
                  "a variable is not a Keras variable" if not keras_variables else
                  overlap.why_not_deferred(self, _base_class(self)))
        if reason:
            logging.getLogger("mlsl_tf").info("mlsl_tf: %s applies synchronously: %s", type(self).__name__, reason)
            return
        deferral = overlap.Deferral.of(self, options.name)
        for i, v in enumerate(variables):
            deferral.register(v, options, i)

    def _mlsl_make_accumulators(self):
        """With backward_passes_per_step > 1: one accumulator per variable and a pass counter.
        Deliberately untracked: they are not optimizer state, so saved files stay loadable by
        the plain optimizer."""
        if self._mlsl_passes <= 1 or getattr(self, "_mlsl_accumulators", None) is not None:
            return
        with tf.init_scope():
            accumulators = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="mlsl_grad_accumulator")
                            for v in keras3_compat.trainable_variables(self)]
            counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="mlsl_backward_passes")
        object.__setattr__(self, "_mlsl_accumulators", accumulators)
        object.__setattr__(self, "_mlsl_counter", counter)

    def _mlsl_index_of(self, variable):
        return keras3_compat.variable_index(self, variable)

    def register_local_var(self, var):
        """Marks `var` as this rank's own (Horovod's register_local_var): its gradient is not
        reduced, only divided by the group's size (scale_local_gradients) or applied as is. An
        optimizer with local variables applies its updates within the step."""
        self.__dict__.setdefault("_mlsl_local_vars", set()).add(id(var))

    def _mlsl_reduce(self, grads, variables, indices):
        """The gradients reduced over the ranks, except those of local variables."""
        mine = self.__dict__.get("_mlsl_local_vars", set())
        return self._mlsl_options.reduce_except_local(grads, [id(v) in mine for v in variables], indices,
                                                      self._mlsl_index_of, self._mlsl_scale_local)

    def get_gradients(self, loss, params):
        """Horovod's Keras hook, for optimizers that define get_gradients: their gradients,
        reduced over the ranks (named by position in `params`)."""
        base = getattr(super(), "get_gradients", None)
        if base is None:
            raise AttributeError(f"{type(self).__name__} has no get_gradients (Keras 3 optimizers compute "
                                 "gradients with a tf.GradientTape)")
        params = list(params)
        return self._mlsl_reduce(list(base(loss, params)), params, list(range(len(params))))

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                raise ValueError("When passing `grads` without `variables`, the optimizer must already be built")
            variables = keras3_compat.trainable_variables(self)
        else:
            variables = list(trainable_variables)
            if not self.built:
                keras3_compat.build_optimizer(self, variables)
            keras3_compat.check_variables_are_known(self, variables)
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        indices = [keras3_compat.variable_index(self, v) for v in variables]
        check_reduction_group(variables, self._mlsl_options.process_set)
        if self._mlsl_passes <= 1:
            deferral = self.__dict__.get("_mlsl_deferral")
            if deferral is not None and not self.__dict__.get("_mlsl_local_vars") \
                    and not deferral.fresh_in_this_graph(variables):
                options = self._mlsl_options
                return deferral.apply([(g, v, options, i) for g, v, i in zip(grads, variables, indices)])
            return super().apply(self._mlsl_reduce(grads, variables, indices), variables)
        return self._mlsl_accumulate_and_apply(grads, variables, indices, super().apply)

    def _mlsl_accumulate_and_apply(self, grads, variables, indices, parent_apply):
        """Adds this pass's local gradients to the accumulators; every k-th pass reduces the
        sum (or mean, with average_aggregated_gradients), applies it and clears them. All ranks
        count passes alike, so all take the same branch."""
        self._mlsl_make_accumulators()
        k = self._mlsl_passes
        accumulators = [self._mlsl_accumulators[i] for i in indices]
        for g, acc in zip(grads, accumulators):
            if g is not None:
                acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        passes = self._mlsl_counter.assign_add(1)

        def reduce_and_apply():
            local = [None if g is None else acc.read_value() for g, acc in zip(grads, accumulators)]
            if self._mlsl_average_aggregated:
                local = [None if a is None else a / tf.cast(k, a.dtype) for a in local]
            parent_apply(self._mlsl_reduce(local, variables, indices), variables)
            for g, acc in zip(grads, accumulators):
                if g is not None:
                    acc.assign(tf.zeros_like(acc))
            return tf.constant(True)

        return tf.cond(tf.equal(passes % k, 0), reduce_and_apply, lambda: tf.constant(False))


def keras_variable_class():
    import keras
    return keras.Variable


def is_distributed(optimizer):
    """Whether the Keras 3 `optimizer` was made by distributed_optimizer (or re-wrapped by load_model)."""
    return isinstance(optimizer, _DistributedOptimizer)


def _base_class(optimizer):
    cls = type(optimizer)
    while issubclass(cls, _DistributedOptimizer):
        cls = next(b for b in cls.__mro__[1:] if not issubclass(b, _DistributedOptimizer))
    return cls


def _distributed_class(base, options, backward_passes_per_step, average_aggregated_gradients, cross_iteration,
                       scale_local_gradients=True):
    """A subclass of `base` with the reducing apply() (reduce.wrapper_class)."""
    return reduce.wrapper_class(_DistributedOptimizer, base, options, backward_passes_per_step,
                                average_aggregated_gradients, scale_local_gradients, cross_iteration)


def _agreed_finite(loss_scale_optimizer, finite):
    """Whether every rank's gradients are finite (a Min over the reducing ranks), when the loss
    scale optimizer's inner optimizer is a DistributedOptimizer; else `finite` as it is."""
    inner = getattr(loss_scale_optimizer, "inner_optimizer", None)
    if not isinstance(inner, _DistributedOptimizer) or not inner._mlsl_options.member():
        return finite
    options = inner._mlsl_options
    flag = ops.allreduce(tf.cast(finite, tf.int32), op=ops.Min, name=unique_prefix(options.name + ".finite"),
                         ignore_name_scope=True, process_set=options.process_set)
    return tf.cast(flag, tf.bool)


def _copy_state(source, target):
    """Builds `target` on `source`'s variables and copies the optimizer state across."""
    target.build(keras3_compat.trainable_variables(source))
    if len(source.variables) != len(target.variables):
        raise ValueError("DistributedOptimizer: could not copy the state of the already-built optimizer")
    for src, dst in zip(source.variables, target.variables):
        dst.assign(src)


def distributed_optimizer(optimizer, options, backward_passes_per_step, average_aggregated_gradients,
                          cross_iteration, scale_local_gradients, in_place=False):
    """A copy of the Keras 3 `optimizer` (same class, config and, if built, state; with
    in_place=True the optimizer itself) whose apply() reduces the gradients as `options` say
    (mlsl_tf.optimizer.dispatch checked the arguments)."""
    keras3_compat.install_loss_scale_hook(_agreed_finite)
    cls = _distributed_class(_base_class(optimizer), options, backward_passes_per_step, average_aggregated_gradients,
                             cross_iteration, scale_local_gradients)
    if in_place:
        keras3_compat.swap_class(optimizer, cls)
        if optimizer.built:
            optimizer._mlsl_after_build()
        return optimizer
    wrapped = cls.from_config(optimizer.get_config())
    if optimizer.built:
        _copy_state(optimizer, wrapped)
    return wrapped
