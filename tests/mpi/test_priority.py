"""The scheduler's settings change when and how tensors travel, never what arrives: results
are bitwise identical under priority and fifo, with fusion on and off, and with chunks small
enough to cut most tensors, for many tensors of mixed sizes, dtypes and priorities submitted
in a different order on every rank. The runtime's counters show the chunking, fusion and
preemption happened.

Each setting is applied the only way the core reads it: shutdown, set MLSL_TF_*, init; the
environment is restored (and the runtime re-initialised with it) afterwards.

Float data are multiples of 1/256 small enough that every partial sum is exact, so the
expected result is known bitwise whatever order MPI sums the ranks in (on 3 ranks MPICH's
order may depend on the message size, which chunking and fusion change); random-normal
floats are compared bitwise across settings too, on 2 ranks where a + b is the only order."""

import random
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import mlsl_tf as hvd
import restarted  # tests/mpi/restarted.py

R, N = hvd.rank(), hvd.size()
KNOBS = ("MLSL_TF_PRIORITY", "MLSL_TF_FUSION_THRESHOLD", "MLSL_TF_CHUNK_BYTES", "MLSL_TF_INFLIGHT")

SETTINGS = {
    "default": {},
    "fifo": {"MLSL_TF_PRIORITY": "fifo"},
    "no_fusion": {"MLSL_TF_FUSION_THRESHOLD": "0"},
    "chunk4k": {"MLSL_TF_CHUNK_BYTES": "4096"},
    "chunk4k_fifo_no_fusion": {"MLSL_TF_CHUNK_BYTES": "4096", "MLSL_TF_PRIORITY": "fifo",
                               "MLSL_TF_FUSION_THRESHOLD": "0"},
    "chunk4k_inflight1": {"MLSL_TF_CHUNK_BYTES": "4096", "MLSL_TF_INFLIGHT": "1"},
    "chunk4k_inflight5_fusion8k": {"MLSL_TF_CHUNK_BYTES": "4096", "MLSL_TF_INFLIGHT": "5",
                                   "MLSL_TF_FUSION_THRESHOLD": "8192"},
}


def settings(env):
    """The runtime re-initialised with `env` and no other of KNOBS; restored after."""
    return restarted.settings(env, KNOBS)


# ------------------------------------------------------------------------------ the workload

SIZES = [1, 3, 17, 100, 1000, 1023, 1024, 1025, 4096, 5000, 30000, 100000]
DTYPES = [np.float32, np.int32, np.float64, np.int64]


def workload(seed=7, count=48):
    """[(name, shape, dtype, op, priority)], the same on every rank."""
    rng = random.Random(seed)
    out = []
    priorities = list(range(count))
    rng.shuffle(priorities)
    for i in range(count):
        n = SIZES[i % len(SIZES)]
        shape = [n] if i % 3 else [max(1, n // 4), 4] if n >= 4 else [n]
        dtype = DTYPES[(i // len(SIZES)) % len(DTYPES)]
        op = hvd.Max if i % 11 == 5 else hvd.Sum
        out.append((f"prio_t{i}", shape, dtype, op, priorities[i] % 10 if i % 2 else priorities[i]))
    return out


def exact_data(rank, i, shape, dtype):
    """Deterministic per (rank, tensor); floats k/256 with |k| < 2^12: sums of 3 are exact."""
    rng = np.random.default_rng(1000 * rank + i)
    k = rng.integers(-(1 << 12), 1 << 12, size=shape)
    return (k / 256.0).astype(dtype) if np.issubdtype(dtype, np.floating) else k.astype(dtype)


def expected(i, shape, dtype, op):
    parts = [exact_data(r, i, shape, dtype) for r in range(N)]
    return np.maximum.reduce(parts) if op == hvd.Max else np.sum(parts, axis=0, dtype=dtype)


def submit_all(items, tensors, order_seed, jitter_s=0.002):
    """Reduces every item from its own thread, the threads started in an order that differs
    per rank (and per order_seed), with small random gaps. Returns {name: numpy result}."""
    order = list(range(len(items)))
    rng = random.Random(order_seed * 101 + R)
    rng.shuffle(order)
    results, errors = {}, []

    def work(i):
        name, _, _, op, prio = items[i]
        try:
            results[name] = hvd.allreduce(tensors[i], op=op, name=name, priority=prio).numpy()
        except Exception as e:  # reported by the caller
            errors.append(f"{name}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in order]
    for t in threads:
        t.start()
        if rng.random() < 0.3:
            time.sleep(rng.random() * jitter_s)
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "allreduce threads did not finish in 120 s"
    assert not errors, errors[:3]
    return results


def run_setting(env, items, tensors, passes=2):
    with settings(env):
        runs = [submit_all(items, tensors, order_seed=p) for p in range(passes)]
        counters = hvd.stats()
    for other in runs[1:]:  # the second pass reuses the negotiated ids
        for name in runs[0]:
            assert runs[0][name].tobytes() == other[name].tobytes(), name
    return runs[0], counters


@pytest.fixture(scope="module")
def exact_results():
    items = workload()
    tensors = [tf.constant(exact_data(R, i, s, d)) for i, (_, s, d, _, _) in enumerate(items)]
    return items, {label: run_setting(env, items, tensors) for label, env in SETTINGS.items()}


@pytest.mark.parametrize("label", list(SETTINGS))
def test_exact_results_under_every_setting(exact_results, label):
    items, by_setting = exact_results
    results, _ = by_setting[label]
    for i, (name, shape, dtype, op, _) in enumerate(items):
        want = expected(i, shape, dtype, op)
        got = results[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), f"{name} ({label}): {got.ravel()[:5]} vs {want.ravel()[:5]}"


def test_counters_move(exact_results):
    items, by_setting = exact_results
    n_items = len(items)
    for label, (_, c) in by_setting.items():
        assert c["requests"] >= 2 * n_items, (label, c)
    # 4 KiB chunks cut every tensor above 4 KiB: more chunks than 1 MiB chunks give
    big_bytes = sum(int(np.prod(s)) * np.dtype(d).itemsize for _, s, d, _, _ in items)
    assert by_setting["chunk4k_fifo_no_fusion"][1]["chunks"] >= 2 * big_bytes // 4096
    assert by_setting["chunk4k"][1]["chunks"] > by_setting["default"][1]["chunks"]
    assert by_setting["no_fusion"][1]["fused_buffers"] == 0
    assert by_setting["chunk4k_fifo_no_fusion"][1]["fused_buffers"] == 0


def test_random_floats_identical_across_settings():
    rng = np.random.default_rng(R + 17)
    items = [(f"prio_rf{i}", [n], np.float32, hvd.Sum, (i * 7) % 13) for i, n in enumerate(SIZES * 2)]
    tensors = [tf.constant(rng.standard_normal(s).astype(np.float32)) for _, s, _, _, _ in items]
    runs = {label: run_setting(SETTINGS[label], items, tensors, passes=1)[0]
            for label in ("default", "fifo", "no_fusion", "chunk4k")}
    for label, res in runs.items():
        for name, *_ in items:
            a, b = runs["default"][name], res[name]
            if N == 2:  # a + b: one order, whatever the chunking
                assert a.tobytes() == b.tobytes(), (label, name)
            else:
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"{label} {name}")


def test_graph_mode_fused_and_chunked():
    """One tf.function holding every reduction: TF's executor issues them in whatever order
    it likes on each rank; results are exact and small ones get fused."""
    items = workload(seed=11, count=40)
    tensors = [tf.constant(exact_data(R, i, s, d)) for i, (_, s, d, _, _) in enumerate(items)]

    @tf.function
    def all_reduced(xs):
        return [hvd.allreduce(x, op=op, name=name + "_g", priority=p)
                for x, (name, _, _, op, p) in zip(xs, items)]

    for label in ("default", "chunk4k"):
        with settings(SETTINGS[label]):
            got = [g.numpy() for g in all_reduced(tensors)]
            got2 = [g.numpy() for g in all_reduced(tensors)]
            c = hvd.stats()
        for i, (name, shape, dtype, op, _) in enumerate(items):
            want = expected(i, shape, dtype, op)
            assert got[i].tobytes() == want.tobytes() and got2[i].tobytes() == want.tobytes(), (label, name)
        assert c["fused_buffers"] > 0 and c["fused_tensors"] >= 2 * c["fused_buffers"], (label, c)


def test_urgent_tensor_preempts_a_big_one():
    """A big low-priority allreduce in 1 KiB chunks, one chunk in flight; urgent ones
    submitted while it is being reduced finish before it and count as preemptions."""
    big = tf.constant(np.full(1 << 21, R + 1, np.int32))  # 8 MiB: 8192 chunks
    small = [tf.constant(np.full(8, R + 1 + k, np.int32)) for k in range(4)]
    env = {"MLSL_TF_CHUNK_BYTES": "1024", "MLSL_TF_INFLIGHT": "1"}
    with settings(env):
        done = {}

        def reduce(name, x, prio):
            y = hvd.allreduce(x, op=hvd.Sum, name=name, priority=prio).numpy()
            done[name] = (time.perf_counter(), y)

        t_big = threading.Thread(target=reduce, args=("prio_big", big, 1000))
        t_big.start()
        deadline = time.monotonic() + 60
        while hvd.stats()["chunks"] < 200 and time.monotonic() < deadline:  # under way here
            time.sleep(0.001)
        started_at = hvd.stats()["chunks"]
        urgent = [threading.Thread(target=reduce, args=(f"prio_urgent{k}", x, k)) for k, x in enumerate(small)]
        for t in urgent:
            t.start()
        for t in urgent + [t_big]:
            t.join(120)
        c = hvd.stats()
    assert started_at < 8192 // 2, f"the big tensor was nearly done ({started_at} chunks) before the urgent ones came"
    assert "prio_big" in done and all(f"prio_urgent{k}" in done for k in range(4)), sorted(done)
    total = N * (N + 1) // 2
    assert (done["prio_big"][1] == total).all()
    for k in range(4):
        assert (done[f"prio_urgent{k}"][1] == total + N * k).all()
        assert done[f"prio_urgent{k}"][0] < done["prio_big"][0], (
            f"prio_urgent{k} finished {done[f'prio_urgent{k}'][0] - done['prio_big'][0]:.4f} s after the big tensor")
    assert c["preemptions"] > 0, c
    assert c["chunks"] >= (8 << 20) // 1024, c


def test_priorities_must_agree():
    with pytest.raises(tf.errors.OpError) as info:
        hvd.allreduce(tf.ones([4]), name="prio_mismatch", priority=R)
    msg = str(info.value)
    assert "'prio_mismatch'" in msg and "priority 0 on rank 0 vs 1 on rank 1" in msg, msg
