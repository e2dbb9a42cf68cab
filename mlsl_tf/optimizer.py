"""DistributedOptimizer: any Keras 3 optimizer whose apply() first reduces the gradients over ranks.

Keras 3 optimizers funnel every update through `apply(grads, trainable_variables)` (`apply_gradients`
and `model.fit`'s train step both call it), so a subclass of the wrapped optimizer's own class that
overrides `apply` (and `build`, for the accumulators) is the whole hook. The subclass keeps the
base class's name, module and get_config, so a model saved with it loads anywhere as the plain
optimizer, and `mlsl_tf.keras.load_model` re-wraps it.

Every gradient is one collective named `{name}.grad.{i}` with priority i, where i is the variable's
index in the optimizer's (forward-order) variable list: the same on every rank, independent of
Keras' auto-generated names (a second reduction with the same name traced into the same
tf.function gets `{name}.1.grad.{i}`, and so on). Inside tf.function each collective runs as soon as backprop has
produced its gradient; the priority lets the first layer's gradient overtake later ones.
"""

import weakref

import tensorflow as tf

from mlsl_tf import keras2_compat, keras3_compat, ops, overlap
from mlsl_tf.compression import Compression
from mlsl_tf.groups import check_reduction_group


_names_per_graph = weakref.WeakKeyDictionary()


def _unique_prefix(name):
    """`name` for the first reduction with that name traced into a tf.function, `name.k` for the
    k-th after it (two optimizers or tapes stepping in one function). Every rank traces the same
    code in the same order, so k agrees. Eager reductions run one at a time and keep `name`."""
    if tf.executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):  # cond/while bodies: their function
        graph = graph.outer_graph
    counts = _names_per_graph.setdefault(graph, {})
    k = counts.get(name, 0)
    counts[name] = k + 1
    return name if k == 0 else f"{name}.{k}"


class ReduceOptions:
    """The options DistributedOptimizer and DistributedGradientTape share (Horovod's semantics)."""

    def __init__(self, name, compression=Compression.none, sparse_as_dense=False, op=ops.Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None, process_set=None,
                 device_dense="", device_sparse=""):
        if op not in (ops.Average, ops.Sum, ops.Adasum):
            raise ValueError("gradients can be reduced only with mlsl_tf.Average, mlsl_tf.Sum or mlsl_tf.Adasum")
        if op == ops.Adasum:  # the deferred (cross-iteration) reductions bypass ops.allreduce's checks
            ops.check_adasum(process_set, compression)
        if gradient_predivide_factor != 1.0 and op != ops.Average:
            raise ValueError("gradient_predivide_factor requires op=mlsl_tf.Average")
        if groups is None and num_groups:
            groups = num_groups
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError(f"groups/num_groups must be >= 0, got {groups}")
        elif groups is not None and not all(isinstance(g, (list, tuple)) for g in groups):
            raise ValueError("groups must be an int or a list of lists of variables")
        self.name = name
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.groups = groups
        self.process_set = process_set
        self.device_dense = device_dense
        self.device_sparse = device_sparse

    def _scale_factors(self):
        # Average divides by the group size inside the core; the predivide factor splits it.
        if self.op == ops.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _group_positions(self, grads, indices, index_of):
        """Lists of positions in `grads` to reduce together. `groups` as an int splits the
        non-None gradients, in order, into that many contiguous groups; as lists of variables,
        `index_of(variable)` maps each to its index."""
        present = [p for p, g in enumerate(grads) if g is not None]
        if not self.groups:
            return []
        if isinstance(self.groups, int):
            n = min(self.groups, len(present))
            if n == 0:
                return []
            return [present[len(present) * j // n:len(present) * (j + 1) // n] for j in range(n)]
        where = {i: p for p, i in enumerate(indices)}
        out = []
        for group in self.groups:
            members = [where.get(index_of(v)) for v in group]
            out.append([p for p in members if p is not None and grads[p] is not None])
        return out

    def scaled_local(self, grad):
        """A local variable's gradient divided by the group's size (Horovod's scale_local_gradients)."""
        count = ops.group_rank_and_size(self.process_set)[1]
        if count == 1:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / tf.cast(count, grad.values.dtype), grad.indices, grad.dense_shape)
        return tf.convert_to_tensor(grad) / tf.cast(count, grad.dtype)

    def reduce_except_local(self, grads, is_local, indices, index_of=None, scale_local=True):
        """`reduce` of the gradients whose is_local[p] is False; the local ones are this rank's
        own, divided by the group's size (scale_local) or kept as they are."""
        if not self.member():
            return list(grads)
        out = self.reduce([None if local else g for g, local in zip(grads, is_local)], indices, index_of)
        for p, local in enumerate(is_local):
            if local and grads[p] is not None:
                out[p] = self.scaled_local(grads[p]) if scale_local else grads[p]
        return out

    def member(self):
        """Whether this rank takes part in the reduction: on a rank outside `process_set`, as in
        Horovod, the gradients stay local."""
        return self.process_set is None or ops.group_id_of(self.process_set) == 0 or \
            ops.process_set_included(self.process_set)

    def reduce(self, grads, indices, index_of=None):
        """Returns the reduced `grads` (None stays None). indices[p] is gradient p's variable
        index: its priority and its name. Dense gradients are allreduced, IndexedSlices
        allgathered (or densified with sparse_as_dense), grouped ones fused per group. On a rank
        outside `process_set` they come back as they are (Horovod's semantics)."""
        if not self.member():
            return list(grads)
        prescale, postscale = self._scale_factors()
        prefix = _unique_prefix(self.name)
        out = list(grads)
        grouped = set()
        for j, members in enumerate(self._group_positions(grads, indices, index_of)):
            if not members:
                continue
            reduced = ops.grouped_allreduce(
                [tf.convert_to_tensor(grads[p]) for p in members], op=self.op, compression=self.compression,
                prescale_factor=prescale, postscale_factor=postscale, name=f"{prefix}.group.{j}",
                ignore_name_scope=True, process_set=self.process_set, priority=min(indices[p] for p in members))
            for p, r in zip(members, reduced):
                out[p] = r
                grouped.add(p)
        for p, g in enumerate(grads):
            if g is None or p in grouped:
                continue
            if isinstance(g, tf.IndexedSlices) and self.sparse_as_dense:
                g = tf.convert_to_tensor(g)
            out[p] = ops.allreduce(g, op=self.op, compression=self.compression, prescale_factor=prescale,
                                   postscale_factor=postscale, name=f"{prefix}.grad.{indices[p]}",
                                   ignore_name_scope=True, process_set=self.process_set, priority=indices[p],
                                   device_dense=self.device_dense, device_sparse=self.device_sparse)
        return out


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
            import logging
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
    """Whether `optimizer` was made by DistributedOptimizer (or re-wrapped by load_model)."""
    return isinstance(optimizer, _DistributedOptimizer) or keras2_compat.is_distributed(optimizer)


def _base_class(optimizer):
    cls = type(optimizer)
    while issubclass(cls, _DistributedOptimizer):
        cls = next(b for b in cls.__mro__[1:] if not issubclass(b, _DistributedOptimizer))
    return cls


def _distributed_class(base, options, backward_passes_per_step, average_aggregated_gradients, cross_iteration,
                       scale_local_gradients=True):
    """A subclass of `base` with the reducing apply(), named and placed like `base` so that
    Keras serializes it as `base`."""
    return type(base.__name__, (_DistributedOptimizer, base), {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_mlsl_options": options,
        "_mlsl_passes": int(backward_passes_per_step),
        "_mlsl_average_aggregated": bool(average_aggregated_gradients),
        "_mlsl_cross_iteration": cross_iteration,
        "_mlsl_scale_local": bool(scale_local_gradients),
    })


def _agreed_finite(loss_scale_optimizer, finite):
    """Whether every rank's gradients are finite (a Min over the reducing ranks), when the loss
    scale optimizer's inner optimizer is a DistributedOptimizer; else `finite` as it is."""
    inner = getattr(loss_scale_optimizer, "inner_optimizer", None)
    if not isinstance(inner, _DistributedOptimizer) or not inner._mlsl_options.member():
        return finite
    options = inner._mlsl_options
    flag = ops.allreduce(tf.cast(finite, tf.int32), op=ops.Min, name=_unique_prefix(options.name + ".finite"),
                         ignore_name_scope=True, process_set=options.process_set)
    return tf.cast(flag, tf.bool)


def _copy_state(source, target):
    """Builds `target` on `source`'s variables and copies the optimizer state across."""
    target.build(keras3_compat.trainable_variables(source))
    if len(source.variables) != len(target.variables):
        raise ValueError("DistributedOptimizer: could not copy the state of the already-built optimizer")
    for src, dst in zip(source.variables, target.variables):
        dst.assign(src)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, backward_passes_per_step=1, op=ops.Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=None, scale_local_gradients=True, group=None, cross_iteration=None,
                         _in_place=False):
    """Returns a copy of the Keras 3 `optimizer` (same class, config and, if built, state) whose
    `apply`/`apply_gradients` first reduce the gradients over all ranks. A Keras 2 (tf_keras)
    optimizer, legacy or new, gets Horovod's Keras 2 wrapper instead (mlsl_tf/keras2_compat.py):
    gradients reduced where they are computed, updates inside the step.

    name: prefix of the collectives' names (default "DistributedOptimizer").
    compression: Compression.none or .fp16, applied around each allreduce.
    sparse_as_dense: allreduce IndexedSlices gradients as dense tensors instead of allgathering.
    backward_passes_per_step: k > 1 accumulates k local gradients, then reduces and applies their
        sum (their mean with average_aggregated_gradients=True) once.
    op: mlsl_tf.Average (default), mlsl_tf.Sum or mlsl_tf.Adasum (Horovod's Keras semantics: the
        gradients themselves are Adasum-combined).
    gradient_predivide_factor: f divides gradients by f before the sum and by size/f after (Average).
    num_groups / groups: an int n fuses the gradients into n grouped allreduces; a list of lists
        of variables fuses each list's gradients into one.
    process_set (or its alias group): reduce within this group of ranks only.
    scale_local_gradients: the gradients of variables registered with register_local_var are
        divided by the group's size (as Horovod does), or with False applied as they are.
    device_dense / device_sparse: accepted for Horovod compatibility (mlsl_tf reduces on the host).
    cross_iteration: apply each variable's update just before its next access (the next step's
        forward pass), so the reductions overlap the next step; same weights after every step
        (mlsl_tf/overlap.py). Default: MLSL_TF_CROSS_ITERATION (on).
    """
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if op == ops.Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients=True (as in Horovod)")
    options = ReduceOptions(name or "DistributedOptimizer", compression, sparse_as_dense, op,
                            gradient_predivide_factor, num_groups, groups, process_set if group is None else group,
                            device_dense, device_sparse)
    if keras2_compat.is_keras2(optimizer):
        return keras2_compat.distributed_optimizer(optimizer, options, backward_passes_per_step,
                                                   average_aggregated_gradients, scale_local_gradients, _in_place,
                                                   overlap_wanted=overlap.enabled(cross_iteration))
    keras3_compat.install_loss_scale_hook(_agreed_finite)
    cls = _distributed_class(_base_class(optimizer), options, backward_passes_per_step, average_aggregated_gradients,
                             cross_iteration, scale_local_gradients)
    if _in_place:
        keras3_compat.swap_class(optimizer, cls)
        if optimizer.built:
            optimizer._mlsl_after_build()
        return optimizer
    wrapped = cls.from_config(optimizer.get_config())
    if optimizer.built:
        _copy_state(optimizer, wrapped)
    return wrapped
