"""DistributedGradientTape: a tf.GradientTape whose gradient() returns gradients reduced over ranks."""

import functools

import tensorflow as tf

from mlsl_tf import ops, overlap
from mlsl_tf.compression import Compression
from mlsl_tf.groups import check_reduction_group
from mlsl_tf.optimizer.reduce import ReduceOptions


class _DistributedGradientTape:
    """Mixed in before the wrapped tape's class; `_mlsl_options` is set per instance."""

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        if not self._mlsl_options.member():
            return grads  # as Horovod: a rank outside the process set keeps its own gradients
        flat_sources = tf.nest.flatten(sources)
        check_reduction_group(flat_sources, self._mlsl_options.process_set)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        position = {}
        for p, s in enumerate(flat_sources):
            position.setdefault(_key(s), p)
        options = self._mlsl_options
        mine = self.__dict__.get("_mlsl_local_sources", set())
        is_local = [_key(s) in mine for s in flat_sources]
        shared = [None if local else g for g, local in zip(flat_grads, is_local)]
        reduced = options.reduce(shared, list(range(len(flat_grads))), lambda v: position.get(_key(v), -1))
        if not tf.executing_eagerly() and not options.groups and overlap.enabled(self._mlsl_cross_iteration):
            # A Keras optimizer applying these unchanged may defer the reduction and the update
            # to the next step (mlsl_tf/overlap.py).
            for p, (local, out) in enumerate(zip(flat_grads, reduced)):
                if out is not None and not isinstance(local, tf.IndexedSlices) and _is_variable(flat_sources[p]):
                    overlap.offer(out, local, options, p)
        for p, local in enumerate(is_local):
            if local and flat_grads[p] is not None:
                reduced[p] = options.scaled_local(flat_grads[p]) if self._mlsl_scale_local else flat_grads[p]
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)

    def register_local_source(self, source):
        """Marks `source` (a variable) as this rank's own: its gradient is not reduced, only
        divided by the group's size (scale_local_gradients, as Horovod does) or returned as is."""
        self.__dict__.setdefault("_mlsl_local_sources", set()).add(_key(source))


@functools.lru_cache(maxsize=None)
def _distributed_class(base):
    return type(base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__})


def _is_variable(x):
    import keras
    return isinstance(x, keras.Variable)


def _key(x):
    """Identity of a source: a variable by its ref, a tensor by itself."""
    try:
        return x.ref()
    except (AttributeError, TypeError):
        return id(x)


def DistributedGradientTape(tape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=ops.Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=None, scale_local_gradients=True, group=None, name=None,
                            cross_iteration=None):
    """Returns `tape` (a tf.GradientTape, recorded or not yet entered) as a tape of the same class
    whose `gradient(target, sources)` reduces each gradient over all ranks; source i's gradient
    gets priority i, so list the sources in forward order (model.trainable_variables does).

    Options as for DistributedOptimizer (`group` is an alias of `process_set`); `name` prefixes
    the collectives' names (default "DistributedGradientTape"). In a tf.function, a Keras
    optimizer that applies the returned gradients unchanged defers the reduction and update of
    each variable to just before its next access (cross_iteration; default
    MLSL_TF_CROSS_ITERATION, on; see mlsl_tf/overlap.py).
    Use it like Horovod's:

        with tf.GradientTape() as tape:
            loss = ...
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
    """
    options = ReduceOptions(name or "DistributedGradientTape", compression, sparse_as_dense, op,
                            gradient_predivide_factor, num_groups, groups, process_set if group is None else group,
                            device_dense, device_sparse)
    if overlap.enabled(cross_iteration):
        overlap.install_optimizer_hook()
    base = type(tape)
    if issubclass(base, _DistributedGradientTape):
        base = next(b for b in base.__mro__[1:] if not issubclass(b, _DistributedGradientTape))
    cls = _distributed_class(base)
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(tape.__dict__)
    wrapped._mlsl_options = options
    wrapped._mlsl_cross_iteration = cross_iteration
    wrapped._mlsl_scale_local = scale_local_gradients
    return wrapped


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=ops.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients=True, **kwargs):
    """DistributedGradientTape whose `local_layers`' trainable weights are this rank's own
    (register_local_source): their gradients are not reduced (Horovod's
    PartialDistributedGradientTape, e.g. for a layer that is different on every rank)."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients, **kwargs)
    for layer in local_layers or []:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape
