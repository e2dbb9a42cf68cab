"""Autotune (MLSL_TF_AUTOTUNE, docs/autotune.md).

1. What it tunes changes no result bit: the same random-normal reductions, over every path (the
   control message's eager region, MPI's allreduce, chunks, the ring, a grouped buffer, the bf16
   wire, sums and averages, float32 and float64, big allreduces in flight at once), give the same bits under every candidate value
   of every knob autotune searches (the library's own list, from stats()) as under the defaults.
   What it leaves alone is shown to matter: on 3 ranks, the chunk size and the ring threshold
   change bits (which rank sums which element first), so autotune may not touch them.
2. A training loop under autotune: every rank applied the same values in the same cycles and
   froze them; the log names every sample (values, seconds per step) and what won; the weights
   are bit-identical to the same loop without autotune.
3. A bad MLSL_TF_AUTOTUNE, or a log rank 0 cannot write, fails init() on every rank; the Horovod
   names are read too.

Each setting is applied the only way the core reads it: shutdown, set the variables, init; the
environment is restored (and the runtime initialised with it) afterwards."""

import csv
import json
import os
import statistics
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import mlsl_tf as hvd
import restarted  # tests/mpi/restarted.py

COMM = MPI.COMM_WORLD
R, N = hvd.rank(), hvd.size()
VARIABLES = ("MLSL_TF_AUTOTUNE", "HOROVOD_AUTOTUNE", "MLSL_TF_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG",
             "MLSL_TF_AUTOTUNE_WARMUP_SAMPLES", "MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE", "MLSL_TF_INFLIGHT",
             "MLSL_TF_SPIN_US", "MLSL_TF_CHUNK_BYTES", "MLSL_TF_RING_BYTES", "MLSL_TF_EAGER_BYTES",
             "MLSL_TF_FUSION_THRESHOLD")


def settings(env):
    """The runtime re-initialised with `env` (and none of VARIABLES else); restored after."""
    return restarted.settings(env, VARIABLES)


# ----------------------------------------------------------------- 1. which settings change bits

# (name, elements, dtype, op, compression): eager-sized, MPI-sized, ring-sized (>= 256 KiB on one
# host) and chunked (> 1 MiB) reductions.
REDUCTIONS = [(f"bits.{n}.{np.dtype(d).name}.{op}.{c}", n, d, op, c)
              for n in (1, 5, 700, 2000, 5000, 70000, 300000)
              for d, op, c in ((np.float32, "sum", "none"), (np.float32, "average", "none"), (np.float64, "sum", "none"),
                               (np.float32, "sum", "bf16"))
              if not (c == "bf16" and n < 5000)]
GROUPED = [3, 40, 900, 2500, 11]  # one grouped allreduce: one buffer
# Reduced at once (one tf.function), each above the fusion threshold (never fused) and cut in
# chunks: how many chunks are in flight at a time is what MLSL_TF_INFLIGHT changes.
CONCURRENT = [270000, 300000, 330000, 400000]


@tf.function
def reduce_at_once(xs):
    return [hvd.allreduce(x, op=hvd.Sum, name=f"bits.concurrent.{i}") for i, x in enumerate(xs)]


def bit_workload():
    """{name: result bytes}; every reduction twice (the second call may ride in the control
    message), one at a time, the same data on every call."""
    rng = np.random.default_rng(1234 + R)
    out = {}
    ops = {"sum": hvd.Sum, "average": hvd.Average}
    for name, n, dtype, op, compression in REDUCTIONS:
        x = tf.constant(rng.standard_normal(n).astype(dtype))
        comp = hvd.Compression.bf16 if compression == "bf16" else hvd.Compression.none
        for call in range(2):
            out[f"{name}#{call}"] = hvd.allreduce(x, op=ops[op], name=name, compression=comp).numpy().tobytes()
    xs = [tf.constant(rng.standard_normal(n).astype(np.float32)) for n in GROUPED]
    for call in range(2):
        got = hvd.grouped_allreduce(xs, op=hvd.Sum, name="bits.grouped")
        out[f"bits.grouped#{call}"] = b"".join(g.numpy().tobytes() for g in got)
    xs = [tf.constant(rng.standard_normal(n).astype(np.float32)) for n in CONCURRENT]
    for call in range(2):
        for i, got in enumerate(reduce_at_once(xs)):
            out[f"bits.concurrent.{i}#{call}"] = got.numpy().tobytes()
    return out


def changed(a, b):
    return sorted(k for k in a if a[k] != b[k])


@pytest.fixture(scope="module")
def baseline():
    with settings({}):
        first = bit_workload()
    with settings({"MLSL_TF_AUTOTUNE": "1"}):
        hvd.allreduce(tf.ones([1]), name="bits.started").numpy()  # the background thread has started
        candidates = hvd.stats()["autotune"]["candidates"]
    with settings({}):
        again = bit_workload()
    # Without this, no comparison below would mean anything.
    assert changed(first, again) == [], "the defaults alone do not reproduce their bits"
    return first, candidates


# The knobs and values autotune searches (the library's Tuner::Candidates; the next test holds
# this list to it, so a knob added there fails here until its bits are shown unchanged).
CANDIDATES = {"MLSL_TF_INFLIGHT": [1, 2, 4, 8, 16], "MLSL_TF_SPIN_US": [0, 50, 200, 1000]}
TUNED = [(name, str(v)) for name, values in CANDIDATES.items() for v in values]


def test_autotune_searches_the_pacing_knobs_listed_here(baseline):
    """The knobs are the in-flight window and the spin time (the rest of this file shows why)."""
    _, candidates = baseline
    assert candidates == CANDIDATES


@pytest.mark.parametrize("name,value", TUNED, ids=[f"{n}={v}" for n, v in TUNED])
def test_a_tuned_setting_changes_no_bit(baseline, name, value):
    want, _ = baseline
    with settings({name: value}):
        got = bit_workload()
    assert changed(want, got) == [], f"{name}={value} changed these results' bits"


# Settings autotune never touches, with a value other than the default.
EXCLUDED = [("MLSL_TF_CHUNK_BYTES", "4096"), ("MLSL_TF_RING_BYTES", "0"), ("MLSL_TF_EAGER_BYTES", "0"),
            ("MLSL_TF_FUSION_THRESHOLD", "0")]


@pytest.fixture(scope="module")
def excluded_changes(baseline):
    want, _ = baseline
    out = {}
    for name, value in EXCLUDED:
        with settings({name: value}):
            out[name] = changed(want, bit_workload())
    if R == 0:
        print("\nresults whose bits an excluded setting changed, on", N, "ranks:",
              {k: len(v) for k, v in out.items()})
    return out


@pytest.mark.skipif(N < 3, reason="on 2 ranks a + b is the only order: no setting changes a sum's bits")
@pytest.mark.parametrize("name", ["MLSL_TF_CHUNK_BYTES", "MLSL_TF_RING_BYTES"])
def test_an_excluded_setting_changes_bits_on_three_ranks(excluded_changes, name):
    """Chunk size and ring threshold decide which rank reduces which element and in what order:
    tuning them would change the results, so autotune does not."""
    assert excluded_changes[name], f"{name} changed no bit here: the reason docs/autotune.md gives would not hold"


@pytest.mark.skipif(N != 2, reason="on 2 ranks only")
def test_on_two_ranks_every_setting_keeps_sums_bits(excluded_changes):
    """On 2 ranks a + b is the only order: the excluded settings change no bit either (what
    makes them unsafe is the third rank)."""
    assert excluded_changes == {name: [] for name, _ in EXCLUDED}


# ----------------------------------------------------------------- 2. a training loop

STEPS = 60  # the search takes 1 + 4 + 3 samples (and 4 to confirm) of 2 steps, each after a discarded step


def train(steps=STEPS):
    """A small MLP on per-rank synthetic data with DistributedGradientTape; returns the weights'
    bytes and the autotune state after every rank's last step."""
    tf.keras.utils.set_random_seed(5)  # the same initial weights on every rank and in every run
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(100 + R)
    x = tf.constant(rng.standard_normal((32, 64)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, 32))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(steps):
        step()
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    hvd.allreduce(tf.ones([1]), name="train.done").numpy()  # every rank's steps are done
    return weights, hvd.stats()["autotune"]


@pytest.fixture(scope="module")
def trained():
    log = None
    if R == 0:
        log = os.path.join(tempfile.mkdtemp(prefix="mlsl_tf_autotune_"), "autotune.csv")
    log = COMM.bcast(log)
    # On 3 or more ranks which gradients share a fused buffer depends on when each is ready, and
    # MPI's order of the ranks' sums on the buffer's size: the loop alone, without autotune, gives
    # other bits from run to run with fusion on (measured: three runs, three different weights;
    # with fusion off, the same). So there both runs leave fusion off (set, so not tuned either).
    common = {"MLSL_TF_FUSION_THRESHOLD": "0"} if N >= 3 else {}
    tune = {"MLSL_TF_AUTOTUNE": "1", "MLSL_TF_AUTOTUNE_LOG": log, "MLSL_TF_AUTOTUNE_WARMUP_SAMPLES": "1",
            "MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE": "2", **common}
    with settings(tune):
        tuned_weights, state = train()
    with settings(common):
        plain_weights, plain_state = train()
    rows = None
    if R == 0:
        with open(log) as f:
            rows = list(csv.reader(f))
    return {"tuned": tuned_weights, "plain": plain_weights, "state": state, "plain_state": plain_state,
            "rows": COMM.bcast(rows)}


def test_training_under_autotune_gives_the_same_bits(trained):
    assert trained["tuned"] == trained["plain"]
    assert COMM.allgather(trained["tuned"]) == [trained["tuned"]] * N  # and the same on every rank


def test_every_rank_applied_the_same_values_in_the_same_cycles(trained):
    state = trained["state"]
    every = COMM.allgather(json.dumps(state, sort_keys=True))
    assert every == [every[0]] * N, every
    assert state["enabled"] and state["frozen"], state
    applied = state["applied"]
    assert len(applied) >= 2 and applied[-1][1] == 1 and all(a[1] == 0 for a in applied[:-1]), applied
    cycles = [a[0] for a in applied]
    assert cycles == sorted(set(cycles)), cycles  # one change per cycle, in order
    assert applied[-1][2:] == [state["values"][k] for k in ("MLSL_TF_INFLIGHT", "MLSL_TF_SPIN_US")]
    assert not trained["plain_state"]["enabled"] and trained["plain_state"]["applied"] == []


def test_the_log_says_what_was_tried_and_what_won(trained):
    header, *rows = trained["rows"]
    assert header == ["kind", "sample", "cycle", "step", "MLSL_TF_INFLIGHT", "MLSL_TF_SPIN_US", "seconds_per_step", "best"]
    samples = [r for r in rows if r[0] == "sample"]
    confirms = [r for r in rows if r[0] == "confirm"]
    assert rows[-1][0] == "final" and len(rows) == len(samples) + len(confirms) + 1, rows
    candidates = trained["state"]["candidates"]
    assert len(samples) == 1 + (len(candidates["MLSL_TF_INFLIGHT"]) - 1) + (len(candidates["MLSL_TF_SPIN_US"]) - 1)
    for r in samples:
        assert float(r[6]) > 0
    final = rows[-1]
    values = trained["state"]["values"]
    assert [int(final[4]), int(final[5])] == [values["MLSL_TF_INFLIGHT"], values["MLSL_TF_SPIN_US"]]
    assert int(final[2]) == trained["state"]["applied"][-1][0]  # the cycle it froze in
    fastest = min(samples, key=lambda r: float(r[6]))
    start = samples[0]
    if [fastest[4], fastest[5]] == [start[4], start[5]]:
        # the start won the descent: frozen at once
        assert confirms == [] and [final[4], final[5]] == [start[4], start[5]]
        assert float(final[6]) == float(fastest[6])
        return
    # another won the descent: the start and it took turns, two more samples each, and the one
    # whose samples' median is lower (the start on a tie) won
    assert [[r[4], r[5]] for r in confirms] == [[start[4], start[5]], [fastest[4], fastest[5]]] * 2, confirms

    def median_of(values):
        return statistics.median(float(r[6]) for r in samples + confirms if [r[4], r[5]] == values)
    start_median, winner_median = median_of([start[4], start[5]]), median_of([fastest[4], fastest[5]])
    won = [fastest[4], fastest[5]] if winner_median < start_median else [start[4], start[5]]
    assert [final[4], final[5]] == won, (rows, start_median, winner_median)


# ----------------------------------------------------------------- 3. bad input, Horovod's names

def test_a_bad_value_fails_init_on_every_rank():
    saved = os.environ.get("MLSL_TF_AUTOTUNE")
    try:
        COMM.Barrier()
        hvd.shutdown()
        os.environ["MLSL_TF_AUTOTUNE"] = "maybe"
        with pytest.raises(RuntimeError, match="MLSL_TF_AUTOTUNE=maybe is not valid"):
            hvd.init()
        assert not hvd.is_initialized()
    finally:
        os.environ.pop("MLSL_TF_AUTOTUNE", None)
        if saved is not None:
            os.environ["MLSL_TF_AUTOTUNE"] = saved
        hvd.init()


def test_a_log_rank_zero_cannot_write_fails_init_on_every_rank():
    missing = "/nonexistent-mlsl-tf-dir/autotune.csv"
    try:
        COMM.Barrier()
        hvd.shutdown()
        os.environ.update(MLSL_TF_AUTOTUNE="1", MLSL_TF_AUTOTUNE_LOG=missing)
        with pytest.raises(RuntimeError, match="cannot write the autotune log " + missing):
            hvd.init()
        assert not hvd.is_initialized()
    finally:
        os.environ.pop("MLSL_TF_AUTOTUNE", None)
        os.environ.pop("MLSL_TF_AUTOTUNE_LOG", None)
        hvd.init()


def test_horovods_names_are_read():
    with settings({"HOROVOD_AUTOTUNE": "1", "MLSL_TF_SPIN_US": "300"}):
        hvd.allreduce(tf.ones([1]), name="horovod.names").numpy()  # the background thread has started
        state = hvd.stats()["autotune"]
    assert state["enabled"] and state["tuned"] == ["MLSL_TF_INFLIGHT"]  # the spin was set: not tuned
    assert state["values"]["MLSL_TF_SPIN_US"] == 300
