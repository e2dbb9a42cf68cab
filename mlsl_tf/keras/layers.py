"""Model-parallel Keras 3 layers (Megatron-LM's tensor parallelism) over a group of ranks.

    mp, dp = mlsl_tf.groups.grid(model_parallel=2)
    x = ColumnParallelDense(4 * d, group=mp, gather_output=False, activation="relu")(x)
    x = RowParallelDense(d, group=mp, input_is_parallel=True)(x)
    ...
    model.compile(optimizer=mlsl_tf.keras.DistributedOptimizer(opt, group=dp), ...)

ColumnParallelDense splits the kernel [in, units] by output columns: member i holds columns
[i*units/K, (i+1)*units/K) and that slice of the bias. RowParallelDense splits it by input rows:
member i holds rows [i*in/K, (i+1)*in/K); the members' partial products are summed in the group
and the (replicated) bias is added once, after the sum. Column(gather_output=False) followed by
Row(input_is_parallel=True) is the MLP block with one all-reduce forward and one backward.

Every member of the model-parallel group must be fed the same batch (its data-parallel replica's
batch): the region ops assume the loss is replicated in the group (see mlsl_tf.parallel).

Initialisation: each member builds the FULL kernel (and bias) with the initializer, seeded
identically on every rank, and keeps its slice, so a model-parallel model starts from exactly the
weights of the same unsharded model built with the same seeded initializers (Glorot's fan-in and
fan-out are the full layer's). `seed=` seeds initializers that have no seed of their own; when it
is None the seed comes from the order in which parallel layers are constructed in the process,
which is the same on every rank that builds the same model. Do not broadcast these variables
from world rank 0 (e.g. BroadcastGlobalVariablesCallback): that would overwrite every member's
shard with rank 0's; they already agree across data-parallel replicas.

Variables are marked: `sharded_group(v)` is the model-parallel group of a sharded variable,
`replicated_group(v)` that of a variable replicated in it (RowParallelDense's bias). A
DistributedOptimizer / DistributedGradientTape must reduce them over the data-parallel group
only; reducing a sharded variable's gradient over ranks that hold other shards of it is an error.
"""

import itertools

import keras
import tensorflow as tf

from mlsl_tf import groups, ops, parallel
from mlsl_tf.groups import replicated_group, sharded_group  # noqa: F401 - part of this module's API

__all__ = ["ColumnParallelDense", "RowParallelDense", "replicated_group", "sharded_group"]

_BASE_SEED = 1_000_003
_constructed = itertools.count()


def _seeded(initializer, seed):
    initializer = keras.initializers.get(initializer)
    config = initializer.get_config()
    if "seed" in config and config["seed"] is None:
        initializer = initializer.__class__.from_config({**config, "seed": seed})
    return initializer


def _find_group(ranks):
    for group in groups.process_sets():
        if group.ranks == list(ranks):
            return group
    raise ValueError(f"no registered group has ranks {list(ranks)}; create it (mlsl_tf.Group) before loading")


class _ParallelDense(keras.layers.Layer):
    def __init__(self, units, group=None, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None, seed=None, **kwargs):
        if keras.backend.backend() != "tensorflow":
            raise ValueError(f"{type(self).__name__} needs Keras' TensorFlow backend, "
                             f"not {keras.backend.backend()!r}")
        super().__init__(**kwargs)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"{type(self).__name__}: units must be a positive int, got {units!r}")
        if isinstance(group, (list, tuple)):
            group = _find_group(sorted(group))
        elif isinstance(group, int) and not isinstance(group, bool):
            group = groups.process_set_by_id(group)
        self.units = units
        self.group = group
        self.group_rank, self.group_size = ops.group_rank_and_size(group)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.seed = _BASE_SEED + 2 * next(_constructed) if seed is None else int(seed)
        self.kernel_initializer = _seeded(kernel_initializer, self.seed)
        self.bias_initializer = _seeded(bias_initializer, self.seed + 1)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _shard_weight(self, name, full_shape, axis, initializer, regularizer):
        """A variable holding this member's block along `axis` of the full weight; axis None:
        the full weight, replicated in the group."""
        k, r = self.group_size, self.group_rank

        def init(shape, dtype=None):
            full = initializer(full_shape, dtype=dtype)
            return full if axis is None else tf.split(full, k, axis=axis)[r]

        shape = list(full_shape)
        if axis is not None:
            shape[axis] //= k
        v = self.add_weight(name=name, shape=tuple(shape), initializer=init, regularizer=regularizer,
                            trainable=True)
        if k > 1:
            group = groups.global_process_set if self.group is None else self.group
            setattr(v, "_mlsl_replicated_in" if axis is None else "_mlsl_sharded_over", group)
        return v

    def _activate(self, y):
        return self.activation(y) if self.activation is not None else y

    def get_config(self):
        config = super().get_config()
        config.update({
            "units": self.units,
            "group": None if self.group is None else list(self.group.ranks),
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "seed": self.seed,
        })
        return config


@keras.saving.register_keras_serializable(package="mlsl_tf")
class ColumnParallelDense(_ParallelDense):
    """A Dense layer whose kernel is split by output units over `group` (K members): each holds
    units/K columns and their bias. The input must be the same on every member (its gradient is
    summed over the group). gather_output=True concatenates the members' outputs into the full
    `units` (in group-rank order); False leaves this member's units/K, e.g. for a
    RowParallelDense(input_is_parallel=True) next."""

    def __init__(self, units, group=None, gather_output=True, **kwargs):
        super().__init__(units, group=group, **kwargs)
        if units % self.group_size:
            raise ValueError(f"ColumnParallelDense: units={units} is not divisible by the group's size "
                             f"{self.group_size}")
        self.gather_output = gather_output

    def build(self, input_shape):
        in_features = input_shape[-1]
        if in_features is None:
            raise ValueError("ColumnParallelDense: the last dimension of the input must be known")
        self.kernel = self._shard_weight("kernel", (in_features, self.units), 1, self.kernel_initializer,
                                         self.kernel_regularizer)
        self.bias = (self._shard_weight("bias", (self.units,), 0, self.bias_initializer, self.bias_regularizer)
                     if self.use_bias else None)

    def call(self, inputs):
        x = parallel.copy_to_group(inputs, group=self.group)
        y = keras.ops.matmul(x, self.kernel)
        if self.bias is not None:
            y = y + self.bias
        y = self._activate(y)
        if self.gather_output:
            y = parallel.gather_from_group(y, axis=-1, group=self.group)
        return y

    def compute_output_shape(self, input_shape):
        units = self.units if self.gather_output else self.units // self.group_size
        return tuple(input_shape[:-1]) + (units,)

    def get_config(self):
        config = super().get_config()
        config["gather_output"] = self.gather_output
        return config


@keras.saving.register_keras_serializable(package="mlsl_tf")
class RowParallelDense(_ParallelDense):
    """A Dense layer whose kernel is split by input units over `group` (K members): each holds
    in/K rows. The members' partial products are summed in the group, then the bias (the full
    one, replicated) is added and the activation applied. input_is_parallel=True takes this
    member's in/K input features (a ColumnParallelDense(gather_output=False) output); False takes
    the full input, the same on every member, and uses this member's block of it."""

    def __init__(self, units, group=None, input_is_parallel=False, **kwargs):
        super().__init__(units, group=group, **kwargs)
        self.input_is_parallel = input_is_parallel

    def build(self, input_shape):
        in_features = input_shape[-1]
        if in_features is None:
            raise ValueError("RowParallelDense: the last dimension of the input must be known")
        k = self.group_size
        if self.input_is_parallel:
            in_features *= k
        elif in_features % k:
            raise ValueError(f"RowParallelDense: the input's {in_features} features are not divisible by the "
                             f"group's size {k}")
        self.kernel = self._shard_weight("kernel", (in_features, self.units), 0, self.kernel_initializer,
                                         self.kernel_regularizer)
        self.bias = (self._shard_weight("bias", (self.units,), None, self.bias_initializer, self.bias_regularizer)
                     if self.use_bias else None)

    def call(self, inputs):
        x = inputs if self.input_is_parallel else parallel.scatter_to_group(inputs, axis=-1, group=self.group)
        y = parallel.reduce_from_group(keras.ops.matmul(x, self.kernel), group=self.group)
        if self.bias is not None:
            y = y + self.bias
        return self._activate(y)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config["input_is_parallel"] = self.input_is_parallel
        return config
