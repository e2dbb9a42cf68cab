"""Reductions of NaN, +-Inf and -0.0 on N ranks: every rank gets the same bits on every path
(MPI's allreduce with the core's operations, the small allreduces riding in the control
message, grouped/fused buffers, the ring, chunks, bf16 wire, float16 tensors), NaN propagates
through Min and Max (as np.minimum / np.maximum), Min orders -0 before +0, and one overflow step
does not poison Compression.bf16_ef's residual."""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd

N, R = hvd.size(), hvd.rank()

# Small thresholds so small tensors take every path: <= 512 B rides in the control message
# (once its name is known), >= 1 KiB runs the ring, > 4 KiB is cut into chunks.
SETTINGS = {"MLSL_TF_EAGER_BYTES": "512", "MLSL_TF_RING_BYTES": "1024", "MLSL_TF_CHUNK_BYTES": "4096"}
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


@pytest.fixture(scope="module", autouse=True)
def small_thresholds():
    saved = {k: os.environ.get(k) for k in SETTINGS}
    hvd.shutdown()
    os.environ.update(SETTINGS)
    hvd.init()
    yield
    hvd.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    hvd.init()


def f32(bits):
    return np.array([bits], np.uint32).view(np.float32)[0]


def qnan(payload, negative=False):
    return f32(0x7FC00000 | payload | (0x80000000 if negative else 0))


def column(k, r):
    """Rank r's 16 special values when rank k holds the odd one out."""
    odd = r == k
    return [
        qnan(1 + r) if odd else 1.0 + r,               # NaN on rank k only
        qnan(r + 1, negative=r % 2 == 1),              # NaN everywhere, payload and sign per rank
        np.inf if odd else 2.0,
        np.inf if odd else (-np.inf if r == (k + 1) % N else 0.5),  # inf + -inf: NaN
        -0.0,
        -0.0 if r % 2 == 0 else 0.0,
        0.0 if r % 2 == 0 else -0.0,
        3e38,                                          # the sum and product overflow
        -np.inf if odd else -1.0,
        r + 0.5,
        qnan(0x1234, negative=True) if odd else -3.0,
        0.0 if odd else np.inf,                        # 0 * inf: NaN
        f32(0x7F800001) if odd else 4.0,               # a signalling NaN
        -0.0 if odd else 0.0,
        1.0 if odd else -0.0,
        5.0 - r,
    ]


def inputs(k, n, dtype=np.float32):
    """Every rank's input (each rank computes all of them, for the reference)."""
    with np.errstate(all="ignore"):  # 3e38 overflows float16
        return [np.resize(np.array(column(k, r), np.float32), n).astype(dtype) for r in range(N)]


def signed_zeros(out, xs, op):
    """IEEE 754-2019 minimum / maximum: -0 is below +0 (numpy keeps whichever operand came first)."""
    zero = out == 0
    neg = [np.signbit(x) & (x == 0) for x in xs]
    pos = [~np.signbit(x) & (x == 0) for x in xs]
    if op == "Min":
        return np.where(zero, np.where(np.any(neg, 0), -0.0, 0.0), out).astype(out.dtype)
    return np.where(zero, np.where(np.any(pos, 0), 0.0, -0.0), out).astype(out.dtype)


def reference(xs, op, scale_dtype=np.float32):
    """The reduction in rank order (all finite values here are exact, so order does not matter)."""
    with np.errstate(all="ignore"):
        if op in ("Sum", "Average"):
            out = functools.reduce(np.add, xs)
            if op == "Average":
                out = (out.astype(np.float64) * (1.0 / N)).astype(scale_dtype).astype(out.dtype)
        elif op == "Product":
            out = functools.reduce(np.multiply, xs)
        elif op == "Min":
            out = signed_zeros(functools.reduce(np.minimum, xs), xs, op)
        else:
            out = signed_zeros(functools.reduce(np.maximum, xs), xs, op)
    return out


def bf16_round(a):
    """float32 -> bfloat16 -> float32, round to nearest even; a NaN stays a NaN (a signalling
    NaN's payload would otherwise round to Inf)."""
    a = np.asarray(a, np.float32)
    b = a.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return np.where(np.isnan(a), np.float32(np.nan), b.astype(np.uint32).view(np.float32))


def bf16_reference(xs, op):
    """bf16 wire: inputs rounded once, reduced in float32 in rank order, scaled, rounded once."""
    return bf16_round(reference([bf16_round(x) for x in xs], op))


def check(y, want, tag):
    """The same bits on every rank, and the reference's bits (NaN where the reference is NaN)."""
    y = np.asarray(y)
    ints = np.int16 if y.dtype == np.float16 else np.int32
    everyone = hvd.allgather(tf.constant(y.view(ints)[None]), name=f"nf.bits.{y.dtype}.{y.size}").numpy()
    for r in range(N):
        assert np.array_equal(everyone[r], everyone[0]), f"{tag}: rank {r}'s bits differ from rank 0's"
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(y), nan), f"{tag}: NaN at {np.flatnonzero(np.isnan(y) != nan)[:8]}"
    bad = np.flatnonzero(y[~nan].view(ints) != want[~nan].view(ints))
    assert bad.size == 0, f"{tag}: {y[~nan][bad[:8]]} vs {want[~nan][bad[:8]]}"


PATHS = {  # path: elements per tensor
    "mpi": 16, "eager": 16, "fused": 16, "ring": 512, "chunked": 4096, "bf16": 512, "fp16": 512,
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("op", list(OPS))
def test_nonfinite_values_give_the_same_bits_everywhere(path, op):
    n = PATHS[path]
    for k in range(N):
        tag = f"{path} {op}, odd rank {k}"
        xs = inputs(k, n)
        x = tf.constant(xs[R])
        if path == "mpi":  # a new name: negotiated, then MPI's allreduce with the core's operation
            y = hvd.allreduce(x, op=OPS[op], name=f"nf.mpi.{op}.{k}").numpy()
        elif path == "eager":  # a known name of <= 512 bytes rides in the control message
            hvd.allreduce(x, op=OPS[op], name=f"nf.eager.{op}")
            before = hvd.stats()["eager"]
            y = hvd.allreduce(x, op=OPS[op], name=f"nf.eager.{op}").numpy()
            assert hvd.stats()["eager"] > before, "the small allreduce did not ride in the control message"
        elif path == "fused":
            rev = [a[::-1].copy() for a in xs]
            outs = hvd.grouped_allreduce([x, tf.constant(rev[R])], op=OPS[op], name=f"nf.fused.{op}.{k}")
            check(outs[1].numpy(), reference(rev, op), tag + " (second tensor)")
            y = outs[0].numpy()
        elif path in ("ring", "chunked"):
            y = hvd.allreduce(x, op=OPS[op], name=f"nf.{path}.{op}.{k}").numpy()
        elif path == "bf16":
            y = hvd.allreduce(x, op=OPS[op], name=f"nf.bf16.{op}.{k}", compression=hvd.Compression.bf16).numpy()
            check(y, bf16_reference(xs, op), tag)
            continue
        else:  # fp16: cast to float16 around the collective, reduced as float16 (MPI has no such type)
            h = tf.cast(x, tf.float16)
            y = hvd.allreduce(h, op=OPS[op], name=f"nf.fp16.{op}.{k}").numpy()
            with np.errstate(all="ignore"):
                halves = [a.astype(np.float16) for a in xs]
            check(y, reference(halves, op), tag)
            continue
        check(y, reference(xs, op), tag)


def test_float64_and_float16_min_max_propagate_nan():
    for dtype in (np.float64, np.float16):
        for op in ("Min", "Max"):
            xs = inputs(N - 1, 64, dtype)
            y = hvd.allreduce(tf.constant(xs[R]), op=OPS[op], name=f"nf.{np.dtype(dtype).name}.{op}").numpy()
            ints = {np.float64: np.int64, np.float16: np.int16}[dtype]
            everyone = hvd.allgather(tf.constant(y.view(ints)[None]), name=f"nf.bits64.{np.dtype(dtype).name}").numpy()
            assert all(np.array_equal(everyone[r], everyone[0]) for r in range(N))
            want = reference(xs, op)
            assert np.array_equal(np.isnan(y), np.isnan(want))
            assert np.array_equal(y[~np.isnan(want)].view(ints), want[~np.isnan(want)].view(ints))


def test_error_feedback_recovers_from_an_overflow_step():
    """One step with an Inf (loss-scaling overflow) must not leave Inf or NaN in the residual:
    with bf16-exact inputs the step leaves nothing to feed back, so every later step equals a
    fresh residual's result bit for bit (before the fix: NaN at that element forever)."""
    n = 1000
    ef = hvd.Compression.bf16_ef
    spike = np.ones(n, np.float32)
    if R == 0:
        spike[7] = np.inf
    if R == N - 1:
        spike[9] = -np.inf
        spike[11] = 3.4e38  # finite in float32, rounds to Inf in bfloat16: an infinite rounding error
    y = hvd.allreduce(tf.constant(spike), op=hvd.Sum, name="nf.ef.spiked", compression=ef).numpy()
    assert y[7] == np.inf and y[9] == -np.inf and y[11] == np.inf
    rng = np.random.default_rng(5)
    for step in range(4):
        xs = [rng.normal(size=n).astype(np.float32) for _ in range(N)]
        after = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, name="nf.ef.spiked", compression=ef).numpy()
        fresh = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, name="nf.ef.fresh", compression=ef).numpy()
        assert np.all(np.isfinite(after)), f"step {step}: non-finite at {np.flatnonzero(~np.isfinite(after))[:8]}"
        np.testing.assert_array_equal(after.view(np.uint32), fresh.view(np.uint32))
