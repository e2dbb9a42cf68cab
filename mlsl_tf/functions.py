"""Helpers built on the collectives: broadcasting variables and Python objects."""

import pickle

import numpy as np
import tensorflow as tf

from mlsl_tf import ops
from mlsl_tf.basics import rank
from mlsl_tf.groups import data_parallel_group_of, sharded_group


def _placement(v, root_rank, process_set):
    """(group, root) to broadcast v over. A variable sharded by a model-parallel layer is
    broadcast, in a world broadcast, only among the ranks holding the same shard (its
    data-parallel group from groups.grid), from the root's replica -- never over other shards."""
    if process_set is not None:
        return process_set, root_rank
    mp = sharded_group(v)
    if mp is None:
        return None, root_rank
    dp = data_parallel_group_of(mp)
    if dp is None:
        raise ValueError(f"broadcast_variables: '{v.name}' is sharded over group {mp.ranks}; a world broadcast "
                         "would overwrite the other shards. Pass process_set=<the data-parallel group>")
    return dp, dp.ranks[root_rank // mp.size()]  # the root's model replica holds this shard there


def broadcast_variables(variables, root_rank, process_set=None):
    """Assigns root_rank's value to each variable on every rank (all broadcasts in flight at once).
    Variables sharded by model-parallel layers are broadcast within their data-parallel group.
    Eager: returns None once every variable has its new value. Building a graph (inside a
    tf.function or a TF1 graph): returns the op that does it, as Horovod does."""
    variables = list(variables)
    placements = [_placement(v, root_rank, process_set) for v in variables]

    def assign_all():
        assigns = []
        for i, (v, (group, root)) in enumerate(zip(variables, placements)):
            vname = getattr(v, "path", None) or v.name
            assigns.append(v.assign(ops.broadcast(
                v, root, name=f"mlsl.broadcast_variables.{i}.{ops.normalize_name(vname)}", ignore_name_scope=True,
                process_set=group)))
        return tf.group(*assigns)

    if not tf.executing_eagerly():
        return assign_all()
    if variables:
        @tf.function
        def run():
            assign_all()  # a tf.function returns tensors, not the grouping op

        run()


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In place, as Horovod's broadcast_: every variable takes root_rank's value (eager or inside
    a tf.function); returns the variables' new values."""
    name = name or "mlsl.broadcast_"
    values = []
    for i, v in enumerate(variables):
        assigned = v.assign(ops.broadcast(v, root_rank, name=f"{name}.{i}", process_set=process_set))
        # in a graph, the value read after the assignment (a plain read could run before it)
        values.append(v.read_value() if tf.executing_eagerly() else tf.convert_to_tensor(assigned))
    return values


def broadcast_global_variables(root_rank):
    """TF1-style graphs: an op that assigns root_rank's value to every global variable, as in
    Horovod. Eager execution has no global variables: use broadcast_variables(model.variables)."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() needs a TF1-style graph (eager execution has no global "
                           "variables); use mlsl_tf.broadcast_variables(model.variables, root_rank) instead")
    return tf.group(*[
        tf.compat.v1.assign(v, ops.broadcast(v, root_rank, ignore_name_scope=True,
                                             name=f"mlsl.broadcast_global.{ops.normalize_name(v.name)}"))
        for v in tf.compat.v1.global_variables()])


def _to_bytes_tensor(obj):
    return tf.constant(np.frombuffer(pickle.dumps(obj), dtype=np.uint8))


def _value(tensor, session):
    """The tensor's numpy value: eagerly, or in a TF1 graph through `session`, the default session
    or a new one."""
    if tf.executing_eagerly():
        return tensor.numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is not None:
        return session.run(tensor)
    with tf.compat.v1.Session() as temporary:
        return temporary.run(tensor)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Returns root_rank's `obj` (any picklable object) on every rank. In a TF1 graph the
    broadcasts run in `session` (default: the default session)."""
    name = name or "mlsl.broadcast_object"
    payload = _to_bytes_tensor(obj) if rank() == root_rank else tf.zeros([0], tf.uint8)
    length = ops.broadcast(tf.constant([int(payload.shape[0])], tf.int64), root_rank, name=name + ".size",
                           process_set=process_set)
    length = int(_value(length, session)[0])
    if rank() != root_rank:
        payload = tf.zeros([length], tf.uint8)
    data = ops.broadcast(payload, root_rank, name=name + ".data", process_set=process_set)
    data = _value(data, session)
    return obj if rank() == root_rank else pickle.loads(data.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=None):
    """A function that broadcasts an object from root_rank (Horovod's broadcast_object_fn)."""
    def broadcast(obj):
        return broadcast_object(obj, root_rank, session, name, process_set)
    return broadcast


def allgather_object(obj, session=None, name=None, process_set=None):
    """Returns the list of every rank's `obj`, in rank order."""
    name = name or "mlsl.allgather_object"
    payload = _to_bytes_tensor(obj)
    sizes = _value(ops.allgather(tf.constant([int(payload.shape[0])], tf.int64), name=name + ".sizes",
                                 process_set=process_set), session)
    data = _value(ops.allgather(payload, name=name + ".data", process_set=process_set), session).tobytes()
    out, offset = [], 0
    for n in sizes:
        out.append(pickle.loads(data[offset:offset + int(n)]))
        offset += int(n)
    return out
