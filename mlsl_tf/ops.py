"""The collective operations (Horovod's signatures) and their gradients."""

import re
import threading

import tensorflow as tf

from mlsl_tf import _library, groups
from mlsl_tf.basics import local_rank, local_size, rank, size
from mlsl_tf.compression import Compression

# Reduction ops; the numbers are Horovod's and are the C++ core's ReduceOp values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_REDUCE_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


def _ops():
    return _library.load_ops()


def normalize_name(name):
    return re.sub("[^a-zA-Z0-9_]", "_", name)


# Names Python gives threads that were not named: numbered in the order this process created
# threads (Thread-N, Thread-N (target), a pool's ThreadPoolExecutor-K_N), or in the order
# threads Python did not start first called into it (Dummy-N: e.g. TensorFlow's pool threads).
_NUMBERED_THREAD = re.compile(r"(?:Thread|Dummy)-\d+(?: \(.*\))?|ThreadPoolExecutor-\d+_\d+", re.S)


def _thread_qualifier(prefix):
    """The calling thread's part of an unnamed eager collective's name ("" on the main thread).
    Threads are paired across ranks by name, so a name that only numbers the thread is refused:
    a rank that created one more thread first (or whose pool ran the call on another worker)
    would pair another thread's tensor with this one -- a wrong result and a hang, undetectable
    later. The refusal happens on every rank that makes such a call, before anything is sent."""
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return ""
    if _NUMBERED_THREAD.fullmatch(thread.name):
        raise ValueError(
            f"mlsl_tf: unnamed eager collective {prefix} called from thread '{thread.name}', a name Python "
            "numbered by the order this process created (or entered) threads: ranks whose threads were created "
            "in another number or order would pair another thread's collective with this one. Give the thread "
            "the same explicit name on every rank (threading.Thread(name=...)) or pass name= to the collective")
    return f"@{thread.name}"


def _tensor_name(name, prefix, ignore_name_scope=False):
    """The collective's cross-rank name. Eager: the given name, or the op's type, qualified by
    the calling thread's name outside the main thread (eager ops of one thread run one at a
    time; threads are told apart by name, so every rank pairs the same threads; a thread with
    a numbered default name is refused, see _thread_qualifier). Graph: the given name inside
    the current name scope, or the node name the op is about to get, qualified by the graph's
    name."""
    if tf.executing_eagerly():
        if name:
            return name
        return prefix + _thread_qualifier(prefix)
    if name is None:
        # The name the op's node will get: unique in this graph, and the same on every rank
        # because every rank traces the same program.
        graph = tf.compat.v1.get_default_graph()
        # A tf.function's graph has a name; a TF1-style tf.Graph() has none.
        return f"{getattr(graph, 'name', 'graph')}/{graph.unique_name(prefix, mark_as_used=False)}"
    if ignore_name_scope:
        return name
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    return f"{scope}/{name}" if scope else name


def _resolve_op(op, average, default=Average):
    if average is not None:
        if op is not None:
            raise ValueError("allreduce: pass either op= or the deprecated average=, not both")
        return Average if average else Sum
    op = default if op is None else op
    if op not in _REDUCE_NAMES:
        raise ValueError(f"unknown reduction op {op!r}; use mlsl_tf.Average, Sum, Adasum, Min, Max or Product")
    return op


def check_adasum(process_set, compression):
    """Adasum's limits, raised on every rank before anything is enqueued (the group's size is
    the same everywhere): a power-of-two number of ranks, as Horovod's CPU Adasum; no bf16 wire
    (the dot products need the tensor's own values)."""
    if compression.wire:
        raise ValueError(f"the Adasum reduction cannot be combined with {type(compression).__name__} "
                         "(bf16 wire compression); use Compression.none or Compression.fp16")
    n = _group_size(process_set)  # also on a rank outside the group: its collective fails later, by name
    if n & (n - 1):
        raise NotImplementedError(f"the Adasum reduction needs a power-of-two number of ranks (1, 2, 4, 8 ...); "
                                  f"this {'group' if group_id_of(process_set) else 'job'} has {n}")


def _group(process_set, group):
    """The one group an op was given as `process_set=` or its alias `group=` (None: the world)."""
    if group is None:
        return process_set
    if process_set is not None and process_set is not group:
        raise ValueError("pass the group as either process_set= or group=, not both")
    return group


def group_id_of(process_set):
    """The core's id of `process_set` (a ProcessSet or its id; None: the world, 0)."""
    if process_set is None:
        return 0
    return groups.id_of(process_set)


def _registered(process_set):
    """The registered ProcessSet that `process_set` (a ProcessSet or its id; None: the world) names."""
    return groups.process_set_by_id(group_id_of(process_set))


def _group_size(process_set):
    """The number of ranks of `process_set`, also on a rank outside it."""
    return _registered(process_set).size()


def process_set_included(process_set):
    """Whether this rank is a member of `process_set` (a ProcessSet or its id; None: the world)."""
    return _registered(process_set).included()


def group_rank_and_size(process_set):
    """This rank's index in the group and the group's size (the world's for None / id 0)."""
    group_id = group_id_of(process_set)
    if group_id == 0:
        return rank(), size()
    return groups.group_rank_and_size(group_id)


def _check_feedback_name(compression, name):
    if compression.error_feedback and not name and tf.executing_eagerly():
        raise ValueError("Compression.bf16_ef keeps a residual per collective name: eager calls need name=")


def _allreduce(tensor, op=Sum, prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=None,
               ignore_name_scope=False, priority=0, compression=Compression.none):
    """The raw op: no IndexedSlices handling; `compression` only chooses the wire dtype (and
    error feedback), casting compressors are applied by the caller."""
    _check_feedback_name(compression, name)
    tensor_name = _tensor_name(name, "MlslAllreduce", ignore_name_scope)
    return _ops().mlsl_allreduce(
        tensor, tensor_name, reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        priority=priority, process_set_id=group_id_of(process_set), wire_dtype=compression.wire)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False,
              priority=0, group=None):
    """Reduces `tensor` over all ranks, or over the members of `group` (alias of `process_set`;
    Average divides by the group's size). Default op: Average. IndexedSlices are allgathered
    (values and indices), as Horovod does; `compression` casts around the collective."""
    process_set = _group(process_set, group)
    op = _resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse_op(op, prescale_factor, postscale_factor)
        return _allreduce_sparse(tensor, op, name, process_set, ignore_name_scope, priority)
    if op == Adasum:
        check_adasum(process_set, compression)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, op, prescale_factor, postscale_factor, name, process_set, ignore_name_scope,
                         priority, compression)
    return compression.decompress(reduced, ctx)


def _check_sparse_op(op, prescale_factor, postscale_factor):
    if op not in (Average, Sum):
        raise NotImplementedError(f"IndexedSlices support only Sum and Average, not {_REDUCE_NAMES.get(op, op)} "
                                  "(pass sparse_as_dense=True to reduce them as dense tensors)")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("prescale_factor and postscale_factor are not supported for IndexedSlices "
                                  "(as in Horovod): scale the values before or after the allreduce")


def _allreduce_sparse(tensor, op, name, process_set, ignore_name_scope, priority):
    """IndexedSlices are allgathered (values and indices), as Horovod does; Average divides the
    values by the group's size with `/`, as Horovod does (integer values become floats)."""
    values = allgather(tensor.values, name=None if name is None else name + ".values", process_set=process_set,
                       ignore_name_scope=ignore_name_scope, priority=priority)
    indices = allgather(tensor.indices, name=None if name is None else name + ".indices",
                        process_set=process_set, ignore_name_scope=ignore_name_scope, priority=priority)
    if op == Average:
        values = values / tf.cast(group_rank_and_size(process_set)[1], values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=None,
                      ignore_name_scope=False, priority=0, group=None):
    """Allreduces a list of tensors as one negotiated, fused collective (one per dtype), over
    all ranks or the members of `group` (alias of `process_set`). IndexedSlices in the list are
    allgathered (Sum and Average only), each on its own, as allreduce does."""
    process_set = _group(process_set, group)
    op = _resolve_op(op, average)
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse_op(op, prescale_factor, postscale_factor)
        dense = [i for i in range(len(tensors)) if i not in set(sparse)]
        results = [None] * len(tensors)
        for i in sparse:
            results[i] = _allreduce_sparse(tensors[i], op, _member_name(name, f"sparse{i}"), process_set,
                                           ignore_name_scope, priority)
        reduced = grouped_allreduce([tensors[i] for i in dense], op=op, compression=compression, name=name,
                                    process_set=process_set, ignore_name_scope=ignore_name_scope, priority=priority)
        for i, r in zip(dense, reduced):
            results[i] = r
        return results
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if op == Adasum:  # each tensor is still combined on its own (the core never fuses Adasum)
        check_adasum(process_set, compression)
    compressed = [compression.compress(t) for t in tensors]
    by_dtype = {}
    for i, (t, _) in enumerate(compressed):
        by_dtype.setdefault(t.dtype, []).append(i)
    results = [None] * len(tensors)
    for k, (dtype, idx) in enumerate(sorted(by_dtype.items(), key=lambda kv: kv[0].name)):
        members = [compressed[i][0] for i in idx]
        base = None if name is None else (name if len(by_dtype) == 1 else f"{name}.{dtype.name}")
        _check_feedback_name(compression, base)
        tensor_name = _tensor_name(base, "MlslGroupedAllreduce", ignore_name_scope)
        out = _ops().mlsl_grouped_allreduce(
            members, tensor_name, reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            priority=priority, process_set_id=group_id_of(process_set),
            wire_dtype=compression.wire)
        for i, o in zip(idx, out):
            results[i] = compression.decompress(o, compressed[i][1])
    return results


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None, priority=0, group=None):
    """Concatenates every rank's tensor along the first dimension (which may differ per rank);
    with `group` (alias of `process_set`), the members' tensors in group-rank order."""
    process_set = _group(process_set, group)
    tensor = tf.convert_to_tensor(tensor)
    return _ops().mlsl_allgather(tensor, _tensor_name(name, "MlslAllgather", ignore_name_scope),
                                 priority=priority, process_set_id=group_id_of(process_set))


def _root_index(root_rank, group_id):
    """The op's root: broadcast's root_rank is a world rank (as in Horovod, also with a group);
    the op takes the root's index in the group."""
    root_rank = int(root_rank)
    if group_id == 0:
        return root_rank
    ranks = groups.process_set_by_id(group_id).ranks
    if root_rank not in ranks:
        raise ValueError(f"broadcast: root_rank {root_rank} is not a member of the group {ranks} "
                         "(root_rank is a world rank)")
    return ranks.index(root_rank)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None, priority=0, group=None):
    """Every rank receives root_rank's tensor. With `group` (alias of `process_set`), every
    member receives it from root_rank, which is a world rank and must be a member, as in Horovod."""
    group_id = group_id_of(_group(process_set, group))
    tensor = tf.convert_to_tensor(tensor)
    return _ops().mlsl_broadcast(tensor, _tensor_name(name, "MlslBroadcast", ignore_name_scope),
                                 root_rank=_root_index(root_rank, group_id),
                                 priority=priority, process_set_id=group_id)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None, priority=0, group=None):
    """Sends splits[r] rows of `tensor` to rank r (equal parts when splits is None).
    Returns, as Horovod does, the received tensor, and with `splits` given the pair (received
    tensor, received_splits). With `group` (alias of `process_set`), splits has one entry per
    member, in group-rank order."""
    process_set = _group(process_set, group)
    tensor = tf.convert_to_tensor(tensor)
    given = splits is not None
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int32) if given else tf.zeros([0], tf.int32)
    received, received_splits = _ops().mlsl_alltoall(
        tensor, splits, _tensor_name(name, "MlslAlltoall", ignore_name_scope), priority=priority,
        process_set_id=group_id_of(process_set))
    return (received, received_splits) if given else received


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None, process_set=None,
                  ignore_name_scope=False, prescale_factor=1.0, postscale_factor=1.0, priority=0, group=None):
    """Reduces over all ranks; rank r keeps the r-th block of rows (the first dim0 % size ranks
    get one row more). With `group` (alias of `process_set`): over the members, member i (its
    index in the group) keeping the i-th block; Average divides by the group's size. With
    Compression.bf16, float32 data travels as bfloat16 and is summed in float32 (rounded once,
    on the way in)."""
    process_set = _group(process_set, group)
    op = _resolve_op(op, None)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    out = _ops().mlsl_reducescatter(
        compressed, _tensor_name(name, "MlslReducescatter", ignore_name_scope), reduce_op=op,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        priority=priority, process_set_id=group_id_of(process_set), wire_dtype=compression.wire)
    return compression.decompress(out, ctx)


def _member_name(name, i):
    return None if name is None else f"{name}.{i}"


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None, priority=0, group=None):
    """allgather of each tensor of a list (Horovod's grouped_allgather); the collectives are
    negotiated one by one and run back to back, not fused."""
    return [allgather(t, name=_member_name(name, i), ignore_name_scope=ignore_name_scope, process_set=process_set,
                      priority=priority, group=group) for i, t in enumerate(tensors)]


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0, name=None, ignore_name_scope=False, priority=0,
                          group=None):
    """reducescatter of each tensor of a list (Horovod's grouped_reducescatter); negotiated one by
    one and run back to back, not fused."""
    return [reducescatter(t, device_dense, compression, op, _member_name(name, i), process_set, ignore_name_scope,
                          prescale_factor, postscale_factor, priority, group) for i, t in enumerate(tensors)]


def barrier(process_set=None, name=None, group=None):
    """Returns when every rank (every member of `group`, alias of `process_set`) has reached it."""
    process_set = _group(process_set, group)
    return _ops().mlsl_barrier(tensor_name=name or "", process_set_id=group_id_of(process_set))


def join():
    """Marks this rank as finished: until every rank has joined, this rank contributes the
    identity (zeros for Sum) to the others' collectives. Returns the last rank to join: an int
    in eager mode, an int32 tensor inside a tf.function."""
    last = _ops().mlsl_join()
    return int(last) if tf.executing_eagerly() else last


def rank_op(name=None):
    """This process's rank as an int32 scalar tensor (Horovod's rank_op; the world is fixed, so
    the value is known when the graph is built)."""
    return tf.constant(rank(), tf.int32, name=name)


def local_rank_op(name=None):
    """This process's rank on its machine as an int32 scalar tensor."""
    return tf.constant(local_rank(), tf.int32, name=name)


def size_op(process_set_id=0, name=None):
    """The number of ranks (of group `process_set_id`, also on a rank outside it) as an int32
    scalar tensor."""
    return tf.constant(_group_size(process_set_id), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank is a member of group `process_set_id`, else 0, as an int32 scalar tensor
    (an id that is not registered: ValueError)."""
    return tf.constant(int(process_set_included(process_set_id)), tf.int32, name=name)


def local_size_op(name=None):
    """The number of ranks on this machine as an int32 scalar tensor."""
    return tf.constant(local_size(), tf.int32, name=name)


# ---- gradients ------------------------------------------------------------------------------

@tf.RegisterGradient("MlslAllreduce")
def _allreduce_grad(op, grad):
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Sum, Average, Adasum):  # Adasum: Horovod's gradient, Adasum of the gradients
        raise NotImplementedError(f"the gradient of allreduce with {_REDUCE_NAMES[reduce_op]} is not defined")
    return _allreduce(grad, reduce_op, op.get_attr("prescale_factor"), op.get_attr("postscale_factor"),
                      process_set=op.get_attr("process_set_id") or None), None


@tf.RegisterGradient("MlslGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Sum, Average, Adasum):  # Adasum: Horovod's gradient, Adasum of the gradients
        raise NotImplementedError(f"the gradient of allreduce with {_REDUCE_NAMES[reduce_op]} is not defined")
    grads = [tf.zeros_like(x) if g is None else g for g, x in zip(grads, op.inputs)]
    return grouped_allreduce(grads, op=reduce_op, prescale_factor=op.get_attr("prescale_factor"),
                             postscale_factor=op.get_attr("postscale_factor"),
                             process_set=op.get_attr("process_set_id") or None) + [None]


@tf.RegisterGradient("MlslAllgather")
def _allgather_grad(op, grad):
    """Average the upstream gradient over the group's ranks, then keep this rank's rows (Horovod's
    gradient: of the mean of the ranks' losses)."""
    group = op.get_attr("process_set_id")
    grad = _allreduce(grad, Average, process_set=group)
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    all_rows = allgather(rows, process_set=group)
    offset = tf.reduce_sum(all_rows[:group_rank_and_size(group)[0]])
    return grad[offset:offset + rows[0]], None


@tf.RegisterGradient("MlslBroadcast")
def _broadcast_grad(op, grad):
    """The upstream gradient averaged over the group's ranks, at the root; zero elsewhere (Horovod's)."""
    group = op.get_attr("process_set_id")
    reduced = _allreduce(grad, Average, process_set=group)
    if group_rank_and_size(group)[0] != op.get_attr("root_rank"):  # the op's attr: the root's index in the group
        return reduced * 0, None
    return reduced, None


@tf.RegisterGradient("MlslAlltoall")
def _alltoall_grad(op, grad, _received_splits_grad):
    back, _ = alltoall(grad, splits=op.outputs[1], process_set=op.get_attr("process_set_id") or None)
    return back, None, None


@tf.RegisterGradient("MlslReducescatter")
def _reducescatter_grad(op, grad):
    reduce_op = op.get_attr("reduce_op")
    group = op.get_attr("process_set_id")
    out = allgather(grad, process_set=group)
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if reduce_op == Average:
        scale /= group_rank_and_size(group)[1]
    return (out * tf.cast(scale, out.dtype) if scale != 1.0 else out), None
