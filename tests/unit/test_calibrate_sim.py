"""benchmarks/calibrate_sim.py's pure parts: the jobs it launches, reading their output, the fits,
and a round trip -- runs made by the simulator with known figures are fitted back and predicted."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import calibrate_sim  # noqa: E402

# Three layers; gradients in the late ones; 60 ms of compute per step, split by FLOPs.
TABLE = {"model": "tiny", "layers": [{"name": "a", "flops": 3, "grads": [20_000]},
                                     {"name": "b", "flops": 2, "grads": [1_000_000]},
                                     {"name": "c", "flops": 1, "grads": [3_000_000, 4_000]}]}


@pytest.fixture(scope="module")
def binary(sim_binary):
    return sim_binary


def test_training_command():
    cmd = calibrate_sim.training_command("/py", 3, "1gbit", 2, ["compute", "overlap"])
    assert cmd[0] == "/py" and cmd[1].endswith("benchmarks/training.py")
    assert cmd[2:] == ["--models", "resnet50", "--links", "1gbit", "--np", "3", "--configs", "compute,overlap",
                       "--runs", "2"]


def test_parse_medians_keeps_only_median_lines():
    lines = ['{"job": {"step_s": 9}}', "not json",
             json.dumps({"median": {"model": "resnet50", "link": "1gbit", "config": "fifo", "step_s": 1.5}}),
             json.dumps({"median": {"model": "resnet50", "link": "1gbit", "config": "horovod", "runs": 0}})]
    assert calibrate_sim.parse_medians(lines, 4) == [
        {"hosts": 4, "rate": "1gbit", "config": "fifo", "model": "resnet50", "step_s": 1.5}]


def test_read_measured_takes_hosts_from_the_job_lines(tmp_path):
    f = tmp_path / "cal_3_1gbit.jsonl"
    f.write_text("\n".join([json.dumps({"job": {"ranks": 3, "config": "fifo", "step_s": 2.0}}),
                            json.dumps({"median": {"model": "resnet50", "link": "1gbit", "config": "fifo", "step_s": 2.0}}),
                            json.dumps({"measured": {"hosts": 4, "rate": "10gbit", "config": "comm",
                                                     "model": "resnet50", "step_s": 0.4}})]) + "\n")
    assert calibrate_sim.read_measured(str(f)) == [
        {"hosts": 3, "rate": "1gbit", "config": "fifo", "model": "resnet50", "step_s": 2.0},
        {"hosts": 4, "rate": "10gbit", "config": "comm", "model": "resnet50", "step_s": 0.4}]
    # a file that also timed compute alone pairs it with its other rows of the same hosts and rate
    paired = tmp_path / "cal_2_1gbit.jsonl"
    paired.write_text("\n".join(json.dumps({"median": {"model": "resnet50", "link": "1gbit", "config": c, "step_s": t}})
                                for c, t in (("compute", 0.8), ("overlap", 1.1))) + "\n")
    assert calibrate_sim.read_measured(str(paired)) == [
        {"hosts": 2, "rate": "1gbit", "config": "compute", "model": "resnet50", "step_s": 0.8},
        {"hosts": 2, "rate": "1gbit", "config": "overlap", "model": "resnet50", "step_s": 1.1, "compute_s": 0.8}]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"job": {"ranks": 2}}) + "\n" + json.dumps({"job": {"ranks": 4}}) + "\n")
    with pytest.raises(ValueError, match="several rank counts"):
        calibrate_sim.read_measured(str(mixed))


def test_aggregate_takes_the_median_of_each_configuration():
    row = lambda config, t: {"hosts": 2, "rate": "1gbit", "config": config, "model": "resnet50", "step_s": t}  # noqa: E731
    got = calibrate_sim.aggregate([row("fifo", 1.0), row("fifo", 3.0), row("fifo", 1.2), row("comm", 0.5)])
    assert got == [dict(row("comm", 0.5), samples=1), dict(row("fifo", 1.2), samples=3)]
    # the compute times paired with a configuration's samples (read_measured) give their median too
    got = calibrate_sim.aggregate([dict(row("fifo", 1.0), compute_s=0.5), dict(row("fifo", 3.0), compute_s=0.9),
                                   row("fifo", 1.2), dict(row("fifo", 1.1), compute_s=0.6)])
    assert got == [dict(row("fifo", 1.15), samples=4, compute_s=0.6, computes_s=[0.5, 0.9, None, 0.6])]


def test_fit_log_monotone():
    assert calibrate_sim.fit_log_monotone(6e-9, lambda b: 3 * b) == pytest.approx(2e-9, rel=1e-6)


def test_emulated_hosts_share_the_cores_of_one_machine():
    # MPICH's reduce-scatter/allgather runs among the largest power of two of ranks
    assert [calibrate_sim.pof2(n) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 2, 4, 4, 8]
    assert [calibrate_sim.cpu_share(h, 2) for h in (2, 3, 4, 8)] == [1.0, 1.0, 2.0, 4.0]
    assert calibrate_sim.effective_beta(8e-9, 1.5e-9, 4, 2) == 8e-9  # the slow link binds
    assert calibrate_sim.effective_beta(1e-10, 1.5e-9, 4, 2) == 3e-9  # two ranks per core bind
    assert [calibrate_sim.ranks_per_core(h, 2) for h in (1, 2, 3, 4)] == [1.0, 1.0, 1.5, 2.0]


def test_fit_link_and_cpu_recovers_a_link_bound_and_a_cpu_bound_rate():
    cpu, slow = 1.5e-9, 8e-9
    points = {"1gbit": [(h, calibrate_sim.effective_beta(slow, cpu, h, 2)) for h in (2, 3, 4)],
              "10gbit": [(h, calibrate_sim.effective_beta(1e-10, cpu, h, 2)) for h in (2, 3, 4)]}
    assert [b for _, b in points["10gbit"]] == [cpu, cpu, 2 * cpu]  # 1 : 1 : 2, as measured
    links, c = calibrate_sim.fit_link_and_cpu(points, 2, grid=400)
    assert c == pytest.approx(cpu, rel=0.05)
    assert links["1gbit"] == pytest.approx(slow, rel=0.05)
    assert links["10gbit"] < cpu  # never the bottleneck


def test_fit_least_squares():
    assert calibrate_sim.fit_least_squares(lambda x: (x - 1.3) ** 2) == pytest.approx(1.3, abs=1e-6)
    assert calibrate_sim.fit_least_squares(lambda x: (x + 1) ** 2) == 0.0


def test_fit_monotone():
    assert calibrate_sim.fit_monotone(3.0, lambda x: 1 + x) == pytest.approx(2.0, abs=1e-6)
    assert calibrate_sim.fit_monotone(0.5, lambda x: 1 + x) == 0.0


ALPHA, BETA, KAPPA, CODEC = 20e-6, 8e-9, 0.3, 2e-8  # a codec slower than the link: it sets comm_bf16


def _made_step(h, config, alpha=ALPHA, beta=BETA, kappa=KAPPA, codec=CODEC):
    compute = 0.0 if config.startswith("comm") else 0.06
    # 3 ranks on 2 cores: each rank's compute meets 1.5 ranks' traffic, and its codec thread gets
    # 1/1.5 of a core
    k = 0.0 if compute == 0 else kappa * calibrate_sim.ranks_per_core(h, 2)
    return calibrate_sim.predict(TABLE, compute, h, alpha, beta, calibrate_sim.POLICY_OF[config], k,
                                 codec=codec * calibrate_sim.ranks_per_core(h, 2), cpu="both")


def _made_rows(alpha=ALPHA, beta=BETA, kappa=KAPPA, codec=CODEC):
    """Every configuration on 2 and 3 hosts, made by the simulator with these figures."""
    rows = []
    for h in (2, 3):
        rows.append({"hosts": h, "rate": "1gbit", "config": "compute", "step_s": 0.06})
        for config in ("comm", "comm_bf16", "fifo", "priority", "overlap", "overlap_bf16"):
            rows.append({"hosts": h, "rate": "1gbit", "config": config,
                         "step_s": _made_step(h, config, alpha, beta, kappa, codec)})
    return rows


def _within(results, step_along, tolerance=0.02):
    """Each row predicted within `tolerance`, or within the simulator's own step over the figures
    between the true ones and the fitted ones (step_along(row, x): the row's simulated step with
    the figures a fraction x of the way). The simulator runs the engine, whose cycles and tests
    come at the pacer's poll ticks: this three-layer model's few transfers order differently as
    beta moves by tenths of a percent, and its step jumps (3-host overlap_bf16: 0.2108 s at
    beta 8e-9, 0.2025 s at 8.02e-9, 0.2111 s at 8.1e-9), so a fit that recovers beta within 2%
    can land on the other side of such a jump."""
    for r in results:
        if abs(r["error"]) < tolerance:
            continue
        steps = [step_along(r, i / 8) for i in range(9)]
        spread = (max(steps) - min(steps)) / r["measured_s"]
        assert abs(r["error"]) < tolerance + spread, (r, steps)


def _towards(fit):
    """The made step with beta and the codec's cost a fraction x of the way to the fitted ones:
    the bf16 steps jump with both (3-host comm_bf16: 0.1445 s at beta 8e-9, 0.1550 s at 8.008e-9),
    so the codec fitted on two host counts lands between such steps."""
    beta, codec = fit["beta_s_per_byte"], fit["codec_s_per_byte"]
    return lambda r, x: _made_step(r["hosts"], r["config"], beta=BETA + (beta - BETA) * x,
                                   codec=CODEC + (codec - CODEC) * x)


def test_round_trip_through_the_simulator(binary):
    rows = _made_rows()
    fits, results = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2)
    fit = fits["1gbit"]
    assert fit["beta_s_per_byte"] == pytest.approx(BETA, rel=0.1)
    assert fit["cpu_factor"] == pytest.approx(KAPPA, rel=0.1)
    assert fit["codec_s_per_byte"] == pytest.approx(CODEC, rel=0.1)
    assert len(results) == 12
    _within(results, _towards(fit))
    # k is fitted on fifo, priority and overlap: only overlap_bf16 is held out
    assert fit["cpu_fitted_on"] == ["fifo", "priority", "overlap"]
    assert {r["config"] for r in results if not r["fitted_on"]} == {"overlap_bf16"}
    s = calibrate_sim.summary(results)["summary"]
    assert s["held_out"] == 2 and s["held_out_within_10pct"] == 2 and s["all_within_10pct"] == 12
    # fitted on overlap alone, fifo and priority are held out too and come out the same
    fits, results = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2, cpu_fit=("overlap",))
    assert fits["1gbit"]["cpu_factor"] == pytest.approx(KAPPA, rel=0.1)
    assert calibrate_sim.summary(results)["summary"]["held_out"] == 6
    _within(results, _towards(fits["1gbit"]))


def _policy_rows(kappas, compute=0.06, alpha=20e-6, beta=8e-9):
    """Runs on 2 and 3 hosts in which each policy was made with its own k (kappas[config])."""
    rows = []
    for h in (2, 3):
        rows.append({"hosts": h, "rate": "1gbit", "config": "compute", "step_s": compute})
        rows.append({"hosts": h, "rate": "1gbit", "config": "comm",
                     "step_s": calibrate_sim.predict(TABLE, 0, h, alpha, beta, "overlap")})
        for config, kappa in kappas.items():
            k = kappa * calibrate_sim.ranks_per_core(h, 2)
            rows.append({"hosts": h, "rate": "1gbit", "config": config,
                         "step_s": calibrate_sim.predict(TABLE, compute, h, alpha, beta, config, k, cpu="both")})
    return rows


def test_k_is_one_figure_over_every_configuration_it_is_fitted_on(binary):
    # overlap made with k = 0.6, fifo with k = 0.1: fitted on overlap alone k is overlap's; fitted
    # on both it lies strictly between (least squares over the two)
    rows = _policy_rows({"overlap": 0.6, "fifo": 0.1})
    alone = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2, cpu_fit=("overlap",))[0]["1gbit"]["cpu_factor"]
    both = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2, cpu_fit=("fifo", "overlap"))[0]["1gbit"]["cpu_factor"]
    assert alone == pytest.approx(0.6, rel=0.1)
    assert 0.15 < both < 0.55


def test_fixed_figures_predict_new_runs_without_fitting(binary, tmp_path):
    rows = _made_rows()
    fit = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2)[0]["1gbit"]
    out = tmp_path / "fit.jsonl"
    out.write_text(json.dumps({"fit": fit}) + "\n" + json.dumps({"hosts": 2, "config": "fifo"}) + "\n")
    fixed = calibrate_sim.read_fits(out)
    assert fixed == {"1gbit": fit}
    # the same machine, measured again: predicted within 2%, every row held out, the figures kept
    fits, results = calibrate_sim.validate(rows, TABLE, [2, 3], fixed=fixed)
    assert fits["1gbit"]["cpu_factor"] == fit["cpu_factor"] and fits["1gbit"]["fixed"]
    assert len(results) == 12 and not any(r["fitted_on"] for r in results)
    _within(results, _towards(fit))
    # runs of a machine whose cores are shared differently (k 0.6, the fit's 0.3): not refitted,
    # so the training rows come out off
    other = _policy_rows({"overlap": 0.6, "fifo": 0.6, "priority": 0.6})
    fits, results = calibrate_sim.validate(other, TABLE, [2, 3], fixed=fixed)
    assert fits["1gbit"]["cpu_factor"] == fit["cpu_factor"]
    assert max(abs(r["error"]) for r in results if r["config"] != "comm") > 0.03


def test_fits_file_is_checked(tmp_path, capsys):
    empty = tmp_path / "nofit.jsonl"
    empty.write_text(json.dumps({"hosts": 2}) + "\n")
    with pytest.raises(SystemExit):
        calibrate_sim.main(["--measured", str(empty), "--fits", str(empty)])
    assert "no {\"fit\": ...} lines" in capsys.readouterr().err
    good = tmp_path / "fit.jsonl"
    good.write_text(json.dumps({"fit": {"rate": "1gbit"}}) + "\n")
    with pytest.raises(SystemExit):
        calibrate_sim.main(["--fits", str(good)])
    assert "--fits needs --measured" in capsys.readouterr().err
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"measured": {"hosts": 2, "rate": "10gbit", "config": "comm", "step_s": 0.1}}) + "\n")
    with pytest.raises(SystemExit):
        calibrate_sim.main(["--measured", str(runs), "--fits", str(good)])
    assert "has no fit for 10gbit (it has 1gbit)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        calibrate_sim.main(["--measured", str(empty), "--cpu-fit", "comm"])
    assert "--cpu-fit comm: expected training configurations" in capsys.readouterr().err


def test_one_codec_figure_for_the_machine_from_two_link_rates(binary):
    # comm_bf16 alone at two link rates, made with one codec figure: the fit finds that figure for
    # both rates (the codec is CPU work; the link rate does not change it).
    alpha, codec = 20e-6, 1e-8
    betas = {"1gbit": 8e-9, "10gbit": 8e-10}

    def step(h, rate, config, beta, c):
        c = c * calibrate_sim.ranks_per_core(h, 2) if config == "comm_bf16" else 0.0
        return calibrate_sim.predict(TABLE, 0, h, alpha, beta, calibrate_sim.POLICY_OF[config], codec=c,
                                     thread_progress=False)

    rows = []
    for rate, beta in betas.items():
        for h in (2, 3):
            rows.append({"hosts": h, "rate": rate, "config": "compute", "step_s": 0.06})
            for config in ("comm", "comm_bf16"):
                rows.append({"hosts": h, "rate": rate, "config": config, "step_s": step(h, rate, config, beta, codec)})
    fits, results = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2, thread_progress=False)
    fitted = fits["1gbit"]["codec_s_per_byte"]
    assert fitted == fits["10gbit"]["codec_s_per_byte"] == pytest.approx(codec, rel=0.1)

    def along(r, x):  # transfers that wait for the codec reorder too (_within)
        beta, fitted_beta = betas[r["rate"]], fits[r["rate"]]["beta_s_per_byte"]
        return step(r["hosts"], r["rate"], r["config"], beta + (fitted_beta - beta) * x, codec + (fitted - codec) * x)

    _within(results, along, tolerance=0.05)


def test_rows_are_predicted_from_the_compute_of_their_own_runs(binary):
    # Runs made with 60 ms of compute, while the median of all compute-alone samples says 90 ms (the
    # machine was slower when those were taken): the rows carry their own compute and fit exactly.
    alpha, beta, kappa = 20e-6, 8e-9, 0.3
    rows = []
    for h in (2, 3):
        rows.append({"hosts": h, "rate": "1gbit", "config": "compute", "step_s": 0.09})
        for config in ("comm", "fifo", "overlap"):
            compute = 0.0 if config == "comm" else 0.06
            k = 0.0 if compute == 0 else kappa * calibrate_sim.ranks_per_core(h, 2)
            t = calibrate_sim.predict(TABLE, compute, h, alpha, beta, calibrate_sim.POLICY_OF[config], k, cpu="both")
            rows.append({"hosts": h, "rate": "1gbit", "config": config, "step_s": t,
                         **({} if config == "comm" else {"compute_s": 0.06})})
    fits, results = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2)
    assert fits["1gbit"]["cpu_factor"] == pytest.approx(kappa, rel=0.1)
    assert all(abs(r["error"]) < 0.02 for r in results)
    assert {r["compute_s"] for r in results if r["config"] != "comm"} == {0.06}


def test_each_sample_is_predicted_from_the_compute_of_its_own_run(binary):
    # One configuration measured in two passes, the machine 4x faster in the second: the row's
    # prediction is the median of each sample's own (not the step at the median compute, which
    # here would be well off: the step is link-bound in one pass and compute-bound in the other).
    alpha, beta, kappa = 20e-6, 8e-9, 0.3
    rows = []
    for h in (2, 3):
        for compute in (0.02, 0.08):  # two passes
            rows.append({"hosts": h, "rate": "1gbit", "config": "compute", "step_s": compute})
            for config in ("comm", "fifo", "overlap"):
                c = 0.0 if config == "comm" else compute
                k = 0.0 if c == 0 else kappa * calibrate_sim.ranks_per_core(h, 2)
                t = calibrate_sim.predict(TABLE, c, h, alpha, beta, calibrate_sim.POLICY_OF[config], k, cpu="both")
                rows.append({"hosts": h, "rate": "1gbit", "config": config, "step_s": t,
                             **({} if config == "comm" else {"compute_s": compute})})
    rows = calibrate_sim.aggregate(rows)
    fits, results = calibrate_sim.validate(rows, TABLE, [2, 3], cores=2)
    assert fits["1gbit"]["cpu_factor"] == pytest.approx(kappa, rel=0.1)
    assert all(abs(r["error"]) < 0.02 for r in results)
    fifo = [r for r in results if r["config"] == "fifo" and r["hosts"] == 2][0]
    assert fifo["computes_s"] == [0.02, 0.08]
    at_median = calibrate_sim.predict(TABLE, 0.05, 2, alpha, beta, "fifo", kappa, cpu="both")
    assert abs(at_median / fifo["measured_s"] - 1) > 0.05  # the old pairing could not have fitted it
