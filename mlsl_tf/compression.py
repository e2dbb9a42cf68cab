"""Gradient compression, with Horovod's names.

- `Compression.none`: the tensor travels as it is.
- `Compression.fp16`: floating tensors are cast to float16 in Python around the collective
  (Horovod's behaviour: the sum is then done in float16).
- `Compression.bf16`: float32 (and float64, cast to float32 around the collective) tensors
  travel as bfloat16 but are summed in float32 by the core (each element is rounded once on the
  way in and once on the way out, whatever the number of ranks); other dtypes travel as they are. `MLSL_TF_WIRE_DTYPE=bfloat16` makes this the
  default for every float32 allreduce without an explicit compression.
- `Compression.bf16_ef`: bf16 with error feedback: what the two roundings lost is kept by the
  core per tensor (by its collective name) and added to that tensor's next value, so the
  compression error does not accumulate over steps (allreduce and grouped_allreduce; a
  reducescatter with it is plain bf16).
"""

import tensorflow as tf


class Compressor:
    """compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor. `wire` names the
    dtype the core puts on the wire for float32 reductions ("" = the tensor's own, or the
    MLSL_TF_WIRE_DTYPE default)."""

    wire = ""
    error_feedback = False

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    # The default argument of every collective, so its wire is "": float32 reductions follow
    # MLSL_TF_WIRE_DTYPE (float32 unless set).
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class BF16Compressor(Compressor):
    """float32 tensors travel as bfloat16, summed in float32 by the core; float64 tensors are
    cast to float32 around the collective (so they travel as bfloat16 too) and come back as
    float64. Other dtypes travel as they are."""

    wire = "bfloat16"

    @staticmethod
    def compress(tensor):
        if tensor.dtype == tf.float64:
            return tf.cast(tensor, tf.float32), tf.float64
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class BF16ErrorFeedbackCompressor(BF16Compressor):
    """bf16 on the wire with error feedback, kept by the core per collective name: what rounding
    this rank's input lost, and what rounding its slice of the float32 sum lost, are added back
    the next time the same name is reduced. Needs a stable name (graph mode gives one; eager
    calls must pass name=)."""

    wire = "bfloat16_ef"
    error_feedback = True


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    bf16_ef = BF16ErrorFeedbackCompressor
