"""DistributedOptimizer for TensorFlow 1 optimizers (tf.compat.v1.train.Optimizer): a wrapper whose
compute_gradients returns the gradients reduced over the ranks, as Horovod's TF1 wrapper does.

The wrapped optimizer is `_optimizer` (Horovod's attribute); slots, variables and apply_gradients
are its own. With backward_passes_per_step k > 1 the local gradients are summed in accumulators
and every k-th call reduces the sum (the mean with average_aggregated_gradients) and apply_gradients
applies it; the other calls apply nothing. Every rank counts calls alike, so every rank takes the
same branch. The accumulators are made by the first compute_gradients, so build the training op
before running global_variables_initializer, as in any TF1 program."""

import tensorflow as tf

from mlsl_tf import ops
from mlsl_tf.compression import Compression
from mlsl_tf.optimizer.reduce import ReduceOptions


class DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer that reduces gradients in compute_gradients."""

    def __init__(self, optimizer, options, backward_passes_per_step=1, average_aggregated_gradients=False,
                 use_locking=False, scale_local_gradients=True):
        super().__init__(name=options.name, use_locking=use_locking)
        self._optimizer = optimizer
        self._mlsl_options = options
        self._mlsl_passes = int(backward_passes_per_step)
        self._mlsl_average_aggregated = bool(average_aggregated_gradients)
        self._mlsl_local_vars = set()
        self._mlsl_scale_local = bool(scale_local_gradients)
        self._mlsl_accumulators = None
        self._mlsl_counter = None

    def register_local_var(self, var):
        """`var` is this rank's own: its gradient is not reduced, only divided by the group's size
        (scale_local_gradients, as Horovod does) or applied as it is."""
        self._mlsl_local_vars.add(id(var))

    def _reduce(self, grads, variables):
        is_local = [id(v) in self._mlsl_local_vars for v in variables]
        return self._mlsl_options.reduce_except_local(grads, is_local, list(range(len(grads))),
                                                      lambda v: _position(variables, v), self._mlsl_scale_local)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        if self._mlsl_passes <= 1:
            return list(zip(self._reduce(grads, variables), variables))
        return list(zip(self._accumulate(grads, variables), variables))

    def _accumulate(self, grads, variables):
        """Adds this call's gradients to the accumulators; every k-th call returns the reduced
        sum (or mean), the others the accumulated values unreduced (apply_gradients ignores them)."""
        if self._mlsl_accumulators is None:
            with tf.init_scope():
                self._mlsl_accumulators = [
                    None if g is None else tf.Variable(tf.zeros(v.shape, v.dtype.base_dtype), trainable=False,
                                                       name="mlsl_grad_accumulator")
                    for g, v in zip(grads, variables)]
                self._mlsl_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="mlsl_backward_passes")
        k = self._mlsl_passes
        added = [acc.assign_add(tf.convert_to_tensor(g)) for g, acc in zip(grads, self._mlsl_accumulators)
                 if g is not None]
        with tf.control_dependencies(added):
            passes = self._mlsl_counter.assign_add(1)
        self._mlsl_due = tf.equal(passes % k, 0)

        def reduced():
            local = [None if a is None else a.read_value() for a in self._mlsl_accumulators]
            if self._mlsl_average_aggregated:
                local = [None if a is None else a / tf.cast(k, a.dtype) for a in local]
            return [tf.zeros_like(v) if r is None else tf.convert_to_tensor(r)
                    for r, v in zip(self._reduce(local, variables), variables)]

        def unreduced():
            return [tf.zeros_like(v) if a is None else a.read_value() for a, v in zip(self._mlsl_accumulators, variables)]

        out = tf.cond(self._mlsl_due, reduced, unreduced)
        return [None if g is None else o for g, o in zip(grads, out)]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self._mlsl_passes <= 1 or self._mlsl_accumulators is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)

        def apply_and_clear():
            applied = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
            with tf.control_dependencies([applied]):
                clear = [a.assign(tf.zeros_like(a)) for a in self._mlsl_accumulators if a is not None]
            with tf.control_dependencies(clear):
                return tf.constant(True)

        def count_only():
            # as Horovod: global_step counts every call, applied or not
            if global_step is None:
                return tf.constant(False)
            with tf.control_dependencies([global_step.assign_add(1)]):
                return tf.constant(False)

        return tf.cond(self._mlsl_due, apply_and_clear, count_only)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def _position(variables, v):
    for p, x in enumerate(variables):
        if x is v:
            return p
    return -1


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=None, sparse_as_dense=False, backward_passes_per_step=1, op=None,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=None, group=None, scale_local_gradients=True):
    """Horovod's DistributedOptimizer over a TensorFlow 1 optimizer."""
    if op == ops.Adasum:
        raise NotImplementedError("DistributedOptimizer(op=Adasum) over a TensorFlow 1 optimizer (Horovod combines "
                                  "the optimizer's deltas there) is not supported; use a Keras optimizer or "
                                  "DistributedGradientTape(op=Adasum), which Adasum-combine the gradients")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    options = ReduceOptions(name or f"Distributed{type(optimizer).__name__}", compression or Compression.none,
                            sparse_as_dense, ops.Average if op is None else op, gradient_predivide_factor,
                            num_groups, groups, process_set if group is None else group, device_dense, device_sparse)
    return DistributedOptimizerV1(optimizer, options, backward_passes_per_step, average_aggregated_gradients,
                                  use_locking, scale_local_gradients)
