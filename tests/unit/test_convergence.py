"""benchmarks/convergence.py: bf16 gradients, and Keras' mixed_bfloat16 policy, train the MNIST
CNN to within 1 point of float32's test accuracy on 2 ranks (a short run of the benchmark,
launched as users launch it), and the benchmark's pure parts (options, how each job is launched,
the plot)."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import convergence  # noqa: E402

EPOCHS = 5


def test_bf16_and_mixed_bfloat16_within_one_point_of_float32_on_2_ranks(tmp_path):
    out = tmp_path / "conv.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MLSL_TF_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "convergence.py"), "--np", "2",
                           "--compressions", "none,bf16", "--policies", "float32,mixed_bfloat16",
                           "--overlap", "on", "--epochs", str(EPOCHS),
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    runs = {(r["policy"], r["compression"]): r for r in rows if "final_test_accuracy" in r}
    final = {c: r for (p, c), r in runs.items() if p == "float32"}
    curve = {c: [r for r in rows if r.get("compression") == c and r.get("policy") == "float32" and "test_accuracy" in r]
             for c in final}
    print({k: r["final_test_accuracy"] for k, r in runs.items()})  # shown by pytest -s or on failure
    assert sorted(final) == ["bf16", "none"] and all(len(curve[c]) == EPOCHS for c in final)
    assert final["none"]["dataset"] == "mnist" and final["none"]["test_examples"] == 1000
    # The same initial weights (rank 0's, broadcast) for both runs, and bf16 really was on the
    # wire: its training differs from float32's somewhere.
    assert final["none"]["init_checksum"] == final["bf16"]["init_checksum"]
    assert [r["train_loss"] for r in curve["none"]] != [r["train_loss"] for r in curve["bf16"]]
    # Both learned the digits (an untrained or garbage-fed CNN scores ~10%), and bf16 is within
    # 1 point (10 of the 1,000 test images) of float32.
    assert final["none"]["final_test_accuracy"] >= 0.93, final
    assert abs(final["bf16"]["final_test_accuracy"] - final["none"]["final_test_accuracy"]) <= 0.01, final
    assert final["bf16"]["points_vs_none"] == pytest.approx(
        100 * (final["bf16"]["final_test_accuracy"] - final["none"]["final_test_accuracy"]), abs=0.011)
    # Under mixed_bfloat16 (bf16 compute, float32 variables), with float32 and with bf16 gradients:
    # the same initial weights, a different training, and within 1 point of float32's.
    for c in ("none", "bf16"):
        mixed = runs[("mixed_bfloat16", c)]
        assert mixed["init_checksum"] == final["none"]["init_checksum"]
        assert abs(mixed["final_test_accuracy"] - final[c]["final_test_accuracy"]) <= 0.01, runs
        assert mixed["points_vs_float32"] == pytest.approx(
            100 * (mixed["final_test_accuracy"] - final[c]["final_test_accuracy"]), abs=0.011)
    mixed_curve = [r["train_loss"] for r in rows if r.get("policy") == "mixed_bfloat16" and r["compression"] == "none"
                   and "test_accuracy" in r]
    assert mixed_curve != [r["train_loss"] for r in curve["none"]]


def test_options_are_checked_with_clear_errors(capsys):
    ns = convergence.parse([])
    assert ns.np == [2, 4] and ns.compressions == ["none", "fp16", "bf16", "bf16_ef"] and ns.overlap == ["on", "off"]
    for argv, message in [(["--np", "1"], "rank counts >= 2"), (["--np", "two"], "rank counts >= 2"),
                          (["--compressions", "none,bf17"], "unknown compression bf17"),
                          (["--overlap", "maybe"], "unknown overlap setting maybe"),
                          (["--epochs", "0"], "--epochs"), (["--compressions", "bf16,bf16"], "twice"),
                          (["--dataset", "cifar"], "invalid choice")]:
        with pytest.raises(SystemExit) as e:
            convergence.parse(argv)
        assert e.value.code == 2
        assert message in capsys.readouterr().err, argv


def test_each_job_is_mlslrun_with_its_overlap_setting():
    ns = convergence.parse(["--compressions", "bf16_ef,none", "--epochs", "3", "--python", "/py"])
    argv, env = convergence.job_argv(ns, 4, "off")
    assert argv[:6] == ["/py", "-m", "mlsl_tf.runner", "-np", "4", "--no-tag-output"]
    assert argv[6] == "/py" and argv[7].endswith("convergence.py") and "--worker" in argv
    assert argv[argv.index("--compressions") + 1] == "bf16_ef,none" and argv[argv.index("--epochs") + 1] == "3"
    assert env["MLSL_TF_CROSS_ITERATION"] == "0"
    os.environ["MLSL_TF_CROSS_ITERATION"] = "0"  # a setting of the caller's must not leak into an "on" job
    try:
        _, env = convergence.job_argv(ns, 2, "on")
    finally:
        del os.environ["MLSL_TF_CROSS_ITERATION"]
    assert not any(k.startswith("MLSL_TF_") for k in env)  # on: mlsl_tf's defaults, as a user runs it
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)


def test_plot_draws_every_run(tmp_path):
    rows = [{"np": n, "compression": c, "overlap": o, "epoch": e, "test_accuracy": 0.9 + e / 100, "dataset": "mnist"}
            for n in (2, 4) for c in ("none", "bf16") for o in ("on", "off") for e in (1, 2, 3)]
    path = tmp_path / "c.png"
    convergence.plot(rows, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_job_passes_result_lines_and_stops_a_job_past_its_timeout():
    got = []
    script = 'import json; print("noise"); print(json.dumps({"conv": {"epoch": 1}}), flush=True)'
    assert convergence.run_job([sys.executable, "-c", script], dict(os.environ), 60, got.append) is None
    assert got == [{"epoch": 1}]
    script = 'import sys, time; print("bad input", file=sys.stderr); sys.exit(3)'
    assert convergence.run_job([sys.executable, "-c", script], dict(os.environ), 60, got.append) == "exit 3: bad input"
    start = time.monotonic()
    error = convergence.run_job([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), 1, got.append)
    assert error == "timed out after 1 s (--timeout)" and time.monotonic() - start < 30
