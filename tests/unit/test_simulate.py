"""mlsl_tf.simulate and build/mlsl_sim on tiny models (seconds): obvious properties of the
predictions, the config it writes, the ResNet-50 table, the command line end to end."""

import json
import math
import pathlib
import subprocess

import pytest

from mlsl_tf import simulate

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def binary(sim_binary):
    return sim_binary


# Four layers, gradients concentrated in the late ones as in a CNN; 30 ms of compute.
TINY = [("l0", 0.004, 0.008, [40_000, 256]), ("l1", 0.003, 0.006, [400_000]),
        ("l2", 0.002, 0.004, [4_000_000]), ("l3", 0.001, 0.002, [8_000_000, 4_000])]


def run(binary, policy, nodes=8, rate="1gbit", latency="5us", **kw):
    text = simulate.config_text(TINY, nodes, simulate.parse_rate(rate), simulate.parse_seconds(latency), policy, **kw)
    return simulate.run_config(text, binary)


def test_parsers():
    assert simulate.parse_rate("100gbit") == pytest.approx(12.5e9)
    assert simulate.parse_rate("800mbit") == pytest.approx(1e8)
    assert simulate.parse_rate("12.5GB") == pytest.approx(12.5e9)
    assert simulate.parse_seconds("1us") == pytest.approx(1e-6)
    assert simulate.parse_seconds("2.5ms") == pytest.approx(2.5e-3)
    with pytest.raises(ValueError):
        simulate.parse_rate("fast")


def test_config_text_carries_the_policy_and_layers():
    text = simulate.config_text(TINY, 16, 1e9, 1e-6, "horovod", ranks_per_host=4)
    lines = text.splitlines()
    assert "ranks 16" in lines and "ranks_per_host 4" in lines and "fifo 1" in lines
    assert "cross_iteration 0" in lines and f"fusion_threshold {64 << 20}" in lines and "inflight 1" in lines
    assert "layer l3 0.001 0.002 8000000 4000" in lines


def test_infinite_bandwidth_hides_everything(binary):
    r = run(binary, "fifo", rate="1e15B", latency="0us")
    assert r["compute_s"] == pytest.approx(0.03)
    assert r["efficiency"] == pytest.approx(1.0, abs=1e-6)


def test_less_bandwidth_costs_time(binary):
    fast, slow = run(binary, "overlap", rate="1gbit"), run(binary, "overlap", rate="500mbit")
    assert slow["step_s"] > fast["step_s"]
    assert slow["link_busy_s"] == pytest.approx(2 * fast["link_busy_s"], rel=0.05)


def test_each_idea_helps_or_is_neutral(binary):
    r = {p: run(binary, p) for p in ("fifo", "priority", "overlap", "bf16")}
    assert r["priority"]["first_layer_exposed_s"] <= r["fifo"]["first_layer_exposed_s"] + 1e-9
    assert r["overlap"]["first_layer_exposed_s"] < r["priority"]["first_layer_exposed_s"]
    assert r["overlap"]["step_s"] < r["fifo"]["step_s"]
    assert r["bf16"]["step_s"] < r["overlap"]["step_s"]
    assert r["bf16"]["link_busy_s"] < r["overlap"]["link_busy_s"]


def test_interference_slows_compute_while_the_link_is_busy(binary):
    # At 10 Gbit/s the link is busy for about half of the 30 ms of compute, so compute slowed while
    # it is busy shows in the step (at 1 Gbit/s the link alone sets the pace and hides it).
    alone = run(binary, "overlap", rate="10gbit")
    slowed = run(binary, "overlap", rate="10gbit", overrides={"interference": 0.5})
    assert slowed["step_s"] > 1.1 * alone["step_s"] and slowed["interference"] == 0.5
    idle = run(binary, "overlap", rate="1e15B", latency="0us", overrides={"interference": 0.5})
    assert idle["efficiency"] == pytest.approx(1.0, abs=1e-3)  # a link never busy slows nothing


def test_more_nodes_are_not_faster(binary):
    steps = [run(binary, "overlap", nodes=n)["step_s"] for n in (2, 8, 64, 1024)]
    assert steps == sorted(steps)


def test_timed_layers_split_compute_by_flops():
    table = {"layers": [{"name": "a", "flops": 1, "grads": [4]}, {"name": "b", "flops": 3, "grads": []}]}
    layers = simulate.timed_layers(table, 0.3, bwd_ratio=2)
    assert [round(l[1], 9) for l in layers] == [0.025, 0.075] and [round(l[2], 9) for l in layers] == [0.05, 0.15]
    given = {"layers": [{"name": "a", "fwd_s": 1.0, "bwd_s": 2.0, "grads": [4]}]}
    assert simulate.timed_layers(given) == [("a", 1.0, 2.0, [4])]


def test_resnet50_table():
    t = simulate.load_table("resnet50")
    grads = [g for l in t["layers"] for g in l["grads"]]
    assert len(grads) == 214 and sum(grads) == 4 * 25_583_592  # keras ResNet50: 25.6 M trainable parameters
    assert 7e9 < t["flops_per_image"] < 9e9


def test_command_line_writes_json_lines_and_png(binary, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLSL_SIM_BINARY", binary)
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps({"model": "tiny", "layers": [
        {"name": n, "fwd_s": f, "bwd_s": b, "grads": g} for n, f, b, g in TINY]}))
    png, out = tmp_path / "eff.png", tmp_path / "out.jsonl"
    assert simulate.main(["--model", str(model), "--nodes", "2,16", "--policies", "fifo,overlap",
                          "--link", "1gbit", "--png", str(png), "--out", str(out)]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert [(l["nodes"], l["label"]) for l in lines] == [(2, "fifo"), (2, "overlap"), (16, "fifo"), (16, "overlap")]
    assert all(0 < l["efficiency"] <= 1 and not math.isnan(l["step_s"]) for l in lines)
    assert png.stat().st_size > 1000 and len(out.read_text().splitlines()) == 4


def test_latency_shm_reaches_the_flat_ring(binary, capsys, monkeypatch):
    monkeypatch.setenv("MLSL_SIM_BINARY", binary)
    steps = []
    for shm in ("1us", "300us"):
        assert simulate.main(["--model", "resnet50", "--nodes", "64", "--policies", "horovod", "--flat",
                              "--ranks-per-host", "4", "--allreduce", "ring", "--variance", "0",
                              "--latency-shm", shm]) == 0
        steps.append(json.loads(capsys.readouterr().out.splitlines()[-1])["step_s"])
    assert steps[1] > steps[0] * 1.01, steps


def test_help_gives_every_options_default(capsys):
    with pytest.raises(SystemExit) as e:
        simulate.main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # the wrapping follows the terminal's width
    for action in simulate.build_parser()._actions:
        if action.dest != "help":
            assert "default" in action.help, action.option_strings  # each option names its default
    assert "(default: resnet50)" in text and "(default: 8,64,256,1024)" in text and "(default: 40)" in text


@pytest.mark.parametrize("argv, message", [
    (["--model", "resnet5"], "unknown model 'resnet5': known models are inceptionv3, resnet101, resnet50, vgg16,"),
    (["--model", "missing/table.json"], "cannot read the model table missing/table.json: No such file"),
    (["--nodes", "8,x"], "argument --nodes: not a comma-separated list of integers: '8,x'"),
    (["--nodes", "0,8"], "argument --nodes: node counts must be >= 1"),
    (["--link", "fast"], "argument --link: not a rate: 'fast'"),
    (["--latency", "soon"], "argument --latency: not a time: 'soon'"),
    (["--latency-shm", "later"], "argument --latency-shm: not a time: 'later'"),
    (["--policies", "fifo,magic"], "argument --policies: unknown policy magic; the policies are horovod, fifo"),
    (["--steps", "3"], "argument --steps: 3 must be >= 4"),
    (["--batch", "1.5"], "argument --batch: not an integer: '1.5'"),
    (["--images-per-s", "0"], "argument --images-per-s: 0 must be > 0"),
    (["--chunk-bytes", "0"], "argument --chunk-bytes: 0 must be >= 1"),
    (["--gamma", "nan"], "argument --gamma: nan must be >= 0"),
    (["--png", "no/such/dir/eff.png"], "argument --png: directory"),
    (["--allreduce", "tree"], "argument --allreduce: invalid choice: 'tree'"),
    (["--variance", "-0.1"], "argument --variance: a variance is 'measured' or a number >= 0, not '-0.1'"),
    (["--variance", "lots"], "argument --variance: a variance is 'measured' or a number >= 0, not 'lots'"),
])
def test_bad_input_is_a_usage_error_not_a_traceback(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        simulate.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m mlsl_tf.simulate") and message in err, err


def test_a_table_without_layers_is_a_usage_error(tmp_path, capsys):
    for text, message in (('{"model": "x"}', 'a model table is a JSON object with a non-empty "layers" list'),
                          ("{not json", "is not JSON")):
        (tmp_path / "t.json").write_text(text)
        with pytest.raises(SystemExit) as e:
            simulate.main(["--model", str(tmp_path / "t.json")])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_find_binary_prefers_the_installed_one(tmp_path, monkeypatch):
    """MLSL_SIM_BINARY, else mlsl_sim beside simulate.py (an installed package), else the tree's
    build/mlsl_sim; nothing: an error naming where it looked."""
    package, installed = tmp_path / "site" / "mlsl_tf", tmp_path / "site" / "mlsl_tf" / "mlsl_sim"
    package.mkdir(parents=True)
    monkeypatch.delenv("MLSL_SIM_BINARY", raising=False)
    monkeypatch.setattr(simulate, "HERE", package)
    with pytest.raises(FileNotFoundError) as e:
        simulate.find_binary()
    assert str(installed) in str(e.value) and str(tmp_path / "site" / "build" / "mlsl_sim") in str(e.value)
    installed.write_text("#!/bin/sh\n")
    with pytest.raises(FileNotFoundError):  # not executable
        simulate.find_binary()
    installed.chmod(0o755)
    assert simulate.find_binary() == str(installed)
    monkeypatch.setenv("MLSL_SIM_BINARY", str(tmp_path / "other"))
    with pytest.raises(FileNotFoundError, match="other"):
        simulate.find_binary()


SIM_SOURCES = sorted((ROOT / "ops" / "core" / "sim").glob("*.[hc]*"))


def test_the_simulator_has_no_model_of_the_cycle_of_its_own():
    # It runs the Runtime's own loop: the control message, the negotiation and the scheduler are
    # reached only through the engine, and the engine is stepped only by the CycleStepper that
    # Runtime::RunCycle runs (loop_policy.h), between cycles where the IdlePacer says from the
    # engine's own answer (Engine::WhenNext) -- neither the simulator's driver nor the Runtime has
    # a loop, an idle count or a reading of the engine's state of its own to drift apart.
    text = {p.name: p.read_text() for p in SIM_SOURCES}
    assert "background_thread.cc" in text and "training.cc" in text
    for name, src in text.items():
        for banned in ("AllreduceWords", "ControlMessage", "scheduler.h", "Scheduler ", "Coordinator", "Control()",
                       "->Step(", "LoopPolicy::", "kFinishStarted", "AllIdle()", "HasWork()", "PollInterval()",
                       "progress ? 0"):
            assert banned not in src, f"ops/core/sim/{name} names {banned}"
    runtime = (SIM_SOURCES[0].parents[1] / "runtime.cc").read_text()
    for owner in (text["background_thread.cc"], runtime):
        assert "CycleStepper" in owner and "IdlePacer" in owner and ".CycleEnded(" in owner
    for banned in ("->Step(", "LoopPolicy::", "kFinishStarted", "AllIdle()", "HasWork()", "PollInterval()",
                   "progress ? 0"):
        assert banned not in runtime, f"ops/core/runtime.cc names {banned}: its cycle is CycleStepper's"


def requests(binary, lines, *extra):
    text = "ranks 4\nranks_per_host 1\nalpha 20e-6\nbeta 4e-9\nrounds 2\n" + "".join(l + "\n" for l in lines)
    out = subprocess.run([binary, "--requests", *extra], input=text, capture_output=True, text=True, timeout=60)
    return out.returncode, [json.loads(l) for l in out.stdout.splitlines()], out.stderr


def test_requests_mode_an_urgent_request_overtakes_a_big_one(binary):
    # 64 MiB of low priority at t=0, 4 KiB urgent 5 ms later: the urgent one goes between two chunks
    rc, done, err = requests(binary, ["request big 67108864 9", "request urgent 4096 0 0.005"])
    assert rc == 0, err
    last = {d["name"]: d["done_s"] for d in done if d["round"] == 1}
    assert last["urgent"] - 0.005 < 0.1 * last["big"] and last["urgent"] < last["big"]
    assert [d["round"] for d in done] == [0, 0, 1, 1]


def test_requests_mode_refuses_bad_input(binary):
    rc, _, err = requests(binary, [])
    assert rc == 1 and "no requests" in err
    rc, _, err = requests(binary, ["request x -5 0"])
    assert rc == 1 and "cannot read 'request x -5 0'" in err
    rc, _, err = requests(binary, ["request x 64 0"], "/no/such/file")
    assert rc == 2 and "cannot open /no/such/file" in err
