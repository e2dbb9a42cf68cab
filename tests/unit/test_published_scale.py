"""Step-time variance in the simulator (ops/core/sim/training.h SimConfig::variance) and
benchmarks/published_scale.py: the variance lowers efficiency as the ranks grow, changes nothing
when off, is reproducible by seed, and the script emits the published rows (seconds)."""

import json
import math
import pathlib
import sys

import pytest

from mlsl_tf import simulate

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import published_scale  # noqa: E402

# Compute-bound: 90 ms of compute, a few MB of gradients on a fast link.
LAYERS = [("l0", 0.010, 0.020, [400_000, 256]), ("l1", 0.010, 0.020, [1_000_000]),
          ("l2", 0.010, 0.020, [2_000_000, 4_000])]


def run(binary, nodes, variance=0.0, seed=1, steps=40, policy="overlap", extra=""):
    text = simulate.config_text(LAYERS, nodes, 12.5e9, 1e-6, policy, steps=steps, variance=variance, seed=seed)
    return simulate.run_config(text + extra, binary)


def test_variance_lowers_efficiency_as_ranks_grow(sim_binary):
    eff = [run(sim_binary, n, variance=0.05)["efficiency"] for n in (1, 16, 256, 1024)]
    assert eff == sorted(eff, reverse=True) and eff[-1] < 0.9 < eff[1] < 0.97, eff
    assert all(run(sim_binary, n)["efficiency"] == pytest.approx(1.0, abs=2e-3) for n in (16, 1024))


def test_the_slowest_of_n_ranks_is_the_expected_largest_lognormal(sim_binary):
    # E[max of 256 standard normals] = 2.8856 (tables of normal order statistics).
    r = run(sim_binary, 256, variance=0.05, seed=7, steps=202, policy="fifo")
    z = (math.log(r["slowest_factor"]) + 0.05 ** 2 / 2) / 0.05
    assert 2.6 < z < 3.15, z
    assert r["efficiency"] == pytest.approx(1 / r["slowest_factor"], rel=0.01)  # compute-bound: the pace is the slowest's


def test_variance_off_is_the_model_without_the_new_keys(sim_binary):
    # variance 0, seed and hierarchical 1 are the defaults: the same result as a config without them.
    text = simulate.config_text(LAYERS, 64, 1.25e8, 5e-6, "overlap", steps=8)
    bare = "\n".join(l for l in text.splitlines() if not l.startswith(("variance", "seed", "hierarchical"))) + "\n"
    a, b = simulate.run_config(text, sim_binary), simulate.run_config(bare, sim_binary)
    a.pop("stats"), b.pop("stats")
    assert a == b and a["slowest_factor"] == 1 and a["efficiency"] < 0.99  # the link binds here


def test_a_seed_reproduces_its_draws(sim_binary):
    a, b = run(sim_binary, 64, 0.05, seed=3), run(sim_binary, 64, 0.05, seed=3)
    c = run(sim_binary, 64, 0.05, seed=4)
    assert a["step_s"] == b["step_s"] and a["slowest_factor"] == b["slowest_factor"]
    assert c["step_s"] != a["step_s"]


def test_flat_allreduce_over_ranks_sharing_a_host(sim_binary):
    # 4 ranks a host: MPICH's SMP-aware form and one ring over every rank give different costs.
    text = simulate.config_text(LAYERS, 64, 1.25e9, 2e-6, "horovod", ranks_per_host=4, allreduce="ring")
    flat = simulate.config_text(LAYERS, 64, 1.25e9, 2e-6, "horovod", ranks_per_host=4, allreduce="ring",
                                hierarchical=False)
    assert "hierarchical 0" in flat and "hierarchical 1" in text
    h, f = simulate.run_config(text, sim_binary), simulate.run_config(flat, sim_binary)
    assert f["hierarchical"] is False and h["hierarchical"] is True and f["step_s"] != h["step_s"]


def test_latency_inside_a_host_paces_the_flat_ring(sim_binary):
    # One ring over 64 ranks, 4 a host (NCCL's over the GPUs of several servers): 2 x 15 of its
    # 126 steps cross hosts, the other 96 pass inside a host at latency_shm.
    def step(latency_shm):
        text = simulate.config_text(LAYERS, 64, 1.25e9, 2e-6, "horovod", ranks_per_host=4, allreduce="ring",
                                    hierarchical=False, latency_shm=latency_shm)
        return text, simulate.run_config(text, sim_binary)["step_s"]
    text, fast = step(2e-6)
    slow_text, slow = step(200e-6)
    assert "alpha_shm 2e-06" in text and "alpha_shm 0.0002" in slow_text
    assert "alpha_shm" not in simulate.config_text(LAYERS, 64, 1.25e9, 2e-6, "horovod")
    assert slow > fast + 96 * 198e-6 * 0.9  # at least one allreduce's 96 inside steps, exposed after the last layer


def test_measured_variance_file():
    record = json.loads(simulate.VARIANCE_FILE.read_text())
    series = record["step_s_per_series"]
    assert 0 < record["sigma"] == simulate.measured_variance() < 0.5 and len(series) >= 3
    assert all(len(s) >= 30 for s in series)
    # sigma is the rule the file states, recomputed from the steps it keeps
    robust = sorted(published_scale.variance_estimates(s)["robust_successive_difference_ln"] for s in series)
    assert record["sigma"] == robust[len(robust) // 2]
    assert record["estimates_per_series"] == [published_scale.variance_estimates(s) for s in series]
    assert "estimator" in record and "measured" in record
    assert "step_variance" not in simulate.known_models() and "cluster_horovod_2018" not in simulate.known_models()


def test_variance_estimates_of_known_spread():
    import random  # noqa: PLC0415
    rng = random.Random(5)
    times = [0.3 * math.exp(rng.gauss(0, 0.04)) for _ in range(400)]
    times[100:200] = [2 * t for t in times[100:200]]  # a level shift (another job) leaves sigma alone
    est = published_scale.variance_estimates(times)
    assert 0.033 < est["robust_successive_difference_ln"] < 0.047 and est["sd_ln_all_steps"] > 0.2


def test_published_scale_emits_each_published_figure(sim_binary, tmp_path, capsys):
    out, png = tmp_path / "p.jsonl", tmp_path / "p.png"
    assert published_scale.main(["--fast", "--out", str(out), "--png", str(png)]) == 0
    rows = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert rows == [json.loads(l) for l in out.read_text().splitlines()]
    published = [r for r in rows if r["published"] is not None]
    assert [(r["source"], r["model"], r["nodes"], r["published"]) for r in published] == [
        ("Intel MLSL", "resnet50", 64, 0.93), ("Intel MLSL", "resnet50", 256, 0.90),
        ("Horovod", "inceptionv3", 512, 0.88), ("Horovod", "resnet101", 512, 0.88), ("Horovod", "vgg16", 512, 0.68)]
    for r in published:
        assert 0.3 < r["predicted"] < r["predicted_no_variance"] <= 1.0 + 1e-9
        assert r["miss_points"] == pytest.approx(100 * (r["predicted"] - r["published"]), abs=0.06)
    ours = [r for r in rows if r["source"] == "mlsl_tf prediction"]
    assert len(ours) == 5 and all(r["policy"] == "overlap" and 0.3 < r["predicted"] <= 1.0 for r in ours)
    assert png.stat().st_size > 5000


def test_committed_results_have_the_required_fields():
    rows = [json.loads(l) for l in (ROOT / "benchmarks/results/published_scale.jsonl").read_text().splitlines()]
    assert len([r for r in rows if r["published"] is not None]) == 5
    for r in rows:
        assert {"source", "model", "nodes", "published", "predicted"} <= r.keys()
        assert r["published"] is None or 0 < r["published"] < 1
    assert {r["policy"] for r in rows if r["source"] == "mlsl_tf prediction"} == set(published_scale.MLSL_TF_POLICIES)
