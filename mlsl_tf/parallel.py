"""Model-parallel collectives along an axis within a group, with gradients.

Two families, because "the gradient" depends on what the members' losses are:

* The exact ops -- all_gather, reduce_scatter, all_reduce, all_to_all -- differentiate the sum
  of the members' losses (every member computes its own loss from its own data, the objective
  is their sum): all_gather's backward is a reduce-scatter, reduce_scatter's an all-gather,
  all_reduce's an all-reduce, all_to_all's the reverse all-to-all.

* Megatron-LM's region ops assume the loss is replicated: every member of the model-parallel
  group computes the same loss from the same batch, and each member's tape must give the
  gradient of that one loss (not of K copies of it). These are what the model-parallel layers
  (mlsl_tf.keras.layers) use:
    copy_to_group     forward identity,                backward all-reduce  ("f")
    reduce_from_group forward all-reduce,              backward identity    ("g")
    scatter_to_group  forward keep this member's block, backward all-gather
    gather_from_group forward all-gather,              backward keep this member's block

Blocks along an axis are in group-rank order: member i holds block i. All members must pass
tensors of the same shape (all_gather, all_to_all and gather_from_group check the gathered size
and fail with an error naming the op otherwise; scatter/all_to_all need the split axis
divisible by the group's size). The core ops work on axis 0; other axes are transposed there
and back. `name` names the forward collective, `name + ".grad"` the backward one; give names in
eager code that runs collectives of one group in different orders on different members.
A rank that is not a member of `group` gets a ValueError naming the group and the rank.
"""

import tensorflow as tf

from mlsl_tf import ops
from mlsl_tf.ops import Average, Sum

__all__ = ["all_gather", "all_reduce", "all_to_all", "copy_to_group", "gather_from_group", "reduce_from_group",
           "reduce_scatter", "scatter_to_group"]


def _grad_name(name):
    return None if name is None else f"{name}.grad"


def _rank_and_size(group, what):
    try:
        return ops.group_rank_and_size(group)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def _axis(x, axis, what):
    ndim = x.shape.rank
    if ndim is None:
        raise ValueError(f"{what}: the tensor's rank must be known")
    if ndim == 0:
        raise ValueError(f"{what}: needs a tensor with at least one dimension, got a scalar")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def _to_front(x, axis):
    if axis == 0:
        return x
    perm = [axis] + [i for i in range(x.shape.rank) if i != axis]
    return tf.transpose(x, perm)


def _from_front(x, axis):
    if axis == 0:
        return x
    ndim = x.shape.rank
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, ndim))
    return tf.transpose(x, perm)


def _scaled_shape(shape, axis, factor=None, divisor=None):
    dims = shape.as_list()
    if dims[axis] is not None:
        dims[axis] = dims[axis] * factor if factor else dims[axis] // divisor
    return dims


def _check_divisible(x, axis, k, what):
    """Static check when the size is known, else a runtime assertion (returns x, guarded)."""
    dim = x.shape[axis]
    if dim is not None:
        if dim % k:
            raise ValueError(f"{what}: size {dim} of axis {axis} is not divisible by the group's size {k}")
        return x
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(x)[axis] % k, 0, message=f"{what}: size of axis {axis} is not divisible by the group's size {k}")]):
        return tf.identity(x)


def _gather(x, axis, group, k, name, what):
    """Concatenates the members' x along `axis` (same shape on every member, checked)."""
    y = _from_front(ops.allgather(_to_front(x, axis), name=name, process_set=group), axis)
    check = tf.debugging.assert_equal(
        tf.shape(y)[axis], k * tf.shape(x)[axis],
        message=f"{what}: the members' tensors differ in size along axis {axis}")
    with tf.control_dependencies([check]):
        y = tf.identity(y)
    y.set_shape(_scaled_shape(x.shape, axis, factor=k))
    return y


def _scatter_sum(x, axis, group, k, name, op=Sum):
    """Reduces over the members; member i keeps block i along `axis`."""
    y = _from_front(ops.reducescatter(_to_front(x, axis), op=op, name=name, process_set=group), axis)
    if x.shape[axis] is not None and x.shape[axis] % k == 0:
        y.set_shape(_scaled_shape(x.shape, axis, divisor=k))
    return y


def _my_block(x, axis, rank, k):
    return tf.split(x, k, axis=axis)[rank]


# ---- the exact ops -----------------------------------------------------------------------

def all_gather(x, axis=0, group=None, name=None):
    """Concatenates the members' `x` along `axis` (member i's block i). Backward: the upstream
    gradients summed over the members, each keeping its own block (a reduce-scatter)."""
    x = tf.convert_to_tensor(x)
    what = "all_gather"
    axis = _axis(x, axis, what)
    _, k = _rank_and_size(group, what)

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return _scatter_sum(dy, axis, group, k, _grad_name(name))
        return _gather(x, axis, group, k, name, what), grad

    return fn(x)


def reduce_scatter(x, axis=0, group=None, op=Sum, name=None):
    """Reduces `x` over the members (op Sum or Average) and keeps this member's block along
    `axis` (block i of equal blocks; when the size is not divisible the first members get one
    more). Backward: the members' upstream gradients gathered along `axis` (divided by the
    group's size for Average)."""
    if op not in (Sum, Average):
        raise ValueError("reduce_scatter: op must be mlsl_tf.Sum or mlsl_tf.Average")
    x = tf.convert_to_tensor(x)
    what = "reduce_scatter"
    axis = _axis(x, axis, what)
    _, k = _rank_and_size(group, what)

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            g = _from_front(ops.allgather(_to_front(dy, axis), name=_grad_name(name), process_set=group), axis)
            g.set_shape(x.shape)
            return g / tf.cast(k, g.dtype) if op == Average else g
        return _scatter_sum(x, axis, group, k, name, op), grad

    return fn(x)


def all_reduce(x, group=None, op=Sum, name=None):
    """Reduces `x` over the members (Sum or Average). Backward: the upstream gradients reduced
    the same way (each member's loss depends on the reduced value)."""
    if op not in (Sum, Average):
        raise ValueError("all_reduce: op must be mlsl_tf.Sum or mlsl_tf.Average")
    x = tf.convert_to_tensor(x)
    _rank_and_size(group, "all_reduce")

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return ops.allreduce(dy, op=op, name=_grad_name(name), process_set=group)
        return ops.allreduce(x, op=op, name=name, process_set=group), grad

    return fn(x)


def _all_to_all(x, split_axis, concat_axis, group, k, name, what):
    received = ops.alltoall(_to_front(x, split_axis), name=name, process_set=group)
    if split_axis == concat_axis:
        y = _from_front(received, split_axis)
        y.set_shape(x.shape)
    else:
        check = tf.debugging.assert_equal(tf.shape(received)[0], tf.shape(x)[split_axis],
                                          message=f"{what}: the members' tensors differ in size along axis "
                                                  f"{split_axis}")
        with tf.control_dependencies([check]):
            received = tf.identity(received)
        pieces = tf.split(received, k, axis=0)  # piece j came from member j
        y = tf.concat([_from_front(p, split_axis) for p in pieces], axis=concat_axis)
        y.set_shape(_scaled_shape(tf.TensorShape(_scaled_shape(x.shape, split_axis, divisor=k)),
                                  concat_axis, factor=k))
    return y


def all_to_all(x, split_axis, concat_axis, group=None, name=None):
    """Splits `x` into group-size blocks along `split_axis`, sends block j to member j, and
    concatenates the blocks received (member i's at position i) along `concat_axis`.
    Backward: the reverse all-to-all (split along concat_axis, concatenate along split_axis)."""
    x = tf.convert_to_tensor(x)
    what = "all_to_all"
    split_axis = _axis(x, split_axis, what)
    concat_axis = _axis(x, concat_axis, what)
    _, k = _rank_and_size(group, what)
    x = _check_divisible(x, split_axis, k, what)

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return _all_to_all(dy, concat_axis, split_axis, group, k, _grad_name(name), what + " (gradient)")
        return _all_to_all(x, split_axis, concat_axis, group, k, name, what), grad

    return fn(x)


# ---- Megatron-LM's region ops (replicated loss) -----------------------------------------

def copy_to_group(x, group=None, name=None):
    """Forward: identity. Backward: the upstream gradients summed over the members (Megatron's
    "f", the entry of a model-parallel region whose input is replicated)."""
    x = tf.convert_to_tensor(x)
    _rank_and_size(group, "copy_to_group")

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return ops.allreduce(dy, op=Sum, name=_grad_name(name), process_set=group)
        return tf.identity(x), grad

    return fn(x)


def reduce_from_group(x, group=None, name=None):
    """Forward: sum over the members. Backward: identity (Megatron's "g", the exit of a
    model-parallel region whose output is replicated)."""
    x = tf.convert_to_tensor(x)
    _rank_and_size(group, "reduce_from_group")

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return tf.identity(dy)
        return ops.allreduce(x, op=Sum, name=name, process_set=group), grad

    return fn(x)


def scatter_to_group(x, axis=-1, group=None, name=None):
    """Forward: this member's block of the (replicated) `x` along `axis`. Backward: the
    members' gradients gathered along `axis`."""
    x = tf.convert_to_tensor(x)
    what = "scatter_to_group"
    axis = _axis(x, axis, what)
    rank, k = _rank_and_size(group, what)
    x = _check_divisible(x, axis, k, what)

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return _gather(dy, axis, group, k, _grad_name(name), what + " (gradient)")
        return _my_block(x, axis, rank, k), grad

    return fn(x)


def gather_from_group(x, axis=-1, group=None, name=None):
    """Forward: the members' `x` concatenated along `axis`. Backward: this member's block of
    the (replicated) upstream gradient."""
    x = tf.convert_to_tensor(x)
    what = "gather_from_group"
    axis = _axis(x, axis, what)
    rank, k = _rank_and_size(group, what)

    @tf.custom_gradient
    def fn(x):
        def grad(dy):
            return _my_block(dy, axis, rank, k)
        return _gather(x, axis, group, k, name, what), grad

    return fn(x)
