"""benchmarks/training.py's pure parts: how each configuration is launched, and how efficiency
and the ratios to Horovod are computed from the jobs' results (no job is run here)."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import training  # noqa: E402


def _ns(**kw):
    base = dict(np=2, steps=None, python="/py", horovod_python="/hvd/bin/python")
    base.update(kw)
    return argparse.Namespace(**base)


def test_mlsl_configurations_run_under_mlslrun_with_their_settings():
    argv, env = training.job_argv(_ns(), "resnet50", "fifo", ["ENTER", "--"])
    assert argv[:6] == ["/py", "-m", "mlsl_tf.runner", "-np", "2", "--no-tag-output"]  # it parses the ranks' lines
    assert argv[6:8] == ["ENTER", "--"] and argv[8] == "/py" and argv[9].endswith("training.py")
    assert argv[10:] == ["--worker", "--model", "resnet50", "--config", "fifo"]
    assert env["MLSL_TF_PRIORITY"] == "fifo" and env["MLSL_TF_CROSS_ITERATION"] == "0"
    _, env = training.job_argv(_ns(), "resnet50", "overlap", [])
    assert not any(k.startswith("MLSL_TF_") for k in env)  # the defaults, as a user runs it
    _, env = training.job_argv(_ns(), "resnet50", "priority", [], timeline="/t.json")
    assert env["MLSL_TF_CROSS_ITERATION"] == "0" and env["MLSL_TF_TIMELINE"] == "/t.json"


def test_horovod_runs_under_its_own_mpiexec():
    argv, env = training.job_argv(_ns(steps=7), "vgg16", "horovod", [])
    assert argv[:3] == ["/hvd/bin/mpiexec", "-n", "2"] and argv[3] == "/hvd/bin/python"
    assert argv[-2:] == ["--impl", "horovod"] and "--steps" in argv and "7" in argv
    argv, _ = training.job_argv(_ns(), "resnet50", "horovod_compute", [])
    assert argv[:3] == ["/hvd/bin/mpiexec", "-n", "2"] and argv[-4:] == ["--config", "horovod_compute", "--impl",
                                                                        "horovod"]


def test_horovod_efficiency_against_its_own_compute_when_measured(capsys):
    rows = {("resnet50", "10gbit", c): [{"step_s": s, "samples_per_s": 32 / s}]
            for c, s in [("compute", 0.6), ("comm", 0.2), ("overlap", 0.75), ("horovod", 0.7),
                         ("horovod_compute", 0.5)]}
    out = {r["config"]: r for r in training.summarize(rows, _ns())}
    assert abs(out["horovod"]["efficiency"] - 0.5 / 0.7) < 1e-9  # its own venv's compute step
    assert abs(out["overlap"]["efficiency"] - 0.6 / 0.75) < 1e-9
    assert "over_horovod" not in out["horovod_compute"] and "efficiency" not in out["horovod_compute"]
    del rows[("resnet50", "10gbit", "horovod_compute")]
    out = {r["config"]: r for r in training.summarize(rows, _ns())}
    assert abs(out["horovod"]["efficiency"] - 0.6 / 0.7) < 1e-9  # ours when Horovod's was not measured


def test_efficiency_and_horovod_ratio(capsys):
    rows = {("resnet50", "2gbit", c): [{"step_s": s, "samples_per_s": 32 / s}]
            for c, s in [("compute", 0.6), ("comm", 0.5), ("comm_bf16", 0.3), ("overlap", 0.75),
                         ("overlap_bf16", 0.65), ("horovod", 0.9)]}
    rows[("resnet50", "2gbit", "fifo")] = [{"error": "exit 1"}]
    out = {r["config"]: r for r in training.summarize(rows, _ns())}
    assert abs(out["overlap"]["efficiency"] - 0.6 / 0.75) < 1e-9
    assert abs(out["overlap_bf16"]["efficiency"] - 0.6 / 0.65) < 1e-9  # max(compute, comm_bf16)
    assert abs(out["overlap"]["over_horovod"] - 0.9 / 0.75) < 1e-9
    assert out["fifo"]["runs"] == 0 and out["fifo"]["errors"] == ["exit 1"]
    printed = [json.loads(line)["median"] for line in capsys.readouterr().out.splitlines()]
    assert len(printed) == 7


def test_markdown_table(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps({"median": r}) for r in [
        {"model": "resnet50", "link": "2gbit", "config": "compute", "samples_per_s": 50.0},
        {"model": "resnet50", "link": "2gbit", "config": "overlap", "samples_per_s": 40.0, "efficiency": 0.8,
         "over_horovod": 1.1},
    ]) + "\n")
    table = training.markdown([str(path)]).splitlines()
    assert table[0] == "| model, link | compute | overlap |"
    assert table[2] == "| resnet50, 2gbit | 50.0 | 40.0 (80%, 1.10x hvd) |"


def test_timeline_window_is_two_whole_steps_even_with_long_gaps_inside_a_backward_pass():
    from mlsl_tf.timeline import Instant, Trace
    step_us, instants = 3e6, []
    for step in range(6):  # VGG-like: gradients of one backward pass 400 ms apart
        t0 = step * step_us
        for k, name in enumerate(["grad.31", "grad.26", "grad.10", "grad.0"]):
            instants.append(Instant(name, "start", 0, "framework", t0 + 100e3 + k * 400e3, {}))
    instants.append(Instant("warmup.extra", "start", 0, "framework", 50e3, {}))  # fewer starts: ignored
    lo, hi = training.two_steps(Trace([], sorted(instants, key=lambda i: i.at_us), {}))
    # from just before step 2's first gradient to just before step 4's: steps 2 and 3, whole
    assert 2 * step_us < lo < 2 * step_us + 100e3 and 4 * step_us < hi < 4 * step_us + 100e3
    assert hi - lo == 2 * step_us
    assert training.two_steps(Trace([], instants[:12], {})) == (None, None)  # 3 steps: draw it all
