"""What every DistributedOptimizer and DistributedGradientTape shares: ReduceOptions (Horovod's
reduction arguments, checked once, and the reduction itself) and the collectives' name prefix.

Every gradient is one collective named `{name}.grad.{i}` with priority i, where i is the
variable's index in the optimizer's (forward-order) variable list, or the source's position in
the tape's: the same on every rank, independent of Keras' auto-generated names (a second
reduction with the same name traced into the same tf.function gets `{name}.1.grad.{i}`, and so
on). Inside tf.function each collective runs as soon as backprop has produced its gradient; the
priority lets the first layer's gradient overtake later ones."""

import weakref

import tensorflow as tf

from mlsl_tf import ops
from mlsl_tf.compression import Compression


_names_per_graph = weakref.WeakKeyDictionary()


def unique_prefix(name):
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
        prefix = unique_prefix(self.name)
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


def wrapper_class(mixin, base, options, backward_passes_per_step, average_aggregated_gradients,
                  scale_local_gradients, cross_iteration):
    """A subclass of `base` with `mixin`'s reducing update, named and placed like `base` so that
    Keras (3 or 2) serializes it as `base`; the options as class attributes the mixin reads."""
    return type(base.__name__, (mixin, base), {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_mlsl_options": options,
        "_mlsl_passes": int(backward_passes_per_step),
        "_mlsl_average_aggregated": bool(average_aggregated_gradients),
        "_mlsl_scale_local": bool(scale_local_gradients),
        "_mlsl_cross_iteration": cross_iteration,
    })
