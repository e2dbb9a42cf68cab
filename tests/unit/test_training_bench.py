"""benchmarks/training.py's pure parts: how each configuration is launched (mlslrun, Horovod's
mpiexec, MWMS's workers with their TF_CONFIG), how efficiency against both limits and the ratios
to Horovod and MWMS are computed from the jobs' results, the README table; then one real MWMS job
of a tiny model on 2 workers over shared memory."""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import cpu_cost  # noqa: E402
import mwms  # noqa: E402
import training  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _ns(**kw):
    base = dict(np=2, steps=None, python="/py", horovod_python="/hvd/bin/python")
    base.update(kw)
    return argparse.Namespace(**base)


def test_mlsl_configurations_run_under_mlslrun_with_their_settings():
    argv, env = training.job_argv(_ns(), "resnet50", "fifo", ["ENTER", "--"])
    assert argv[:6] == ["/py", "-m", "mlsl_tf.runner", "-np", "2", "--no-tag-output"]  # it parses the ranks' lines
    assert argv[6:8] == ["ENTER", "--"] and argv[8] == "/py" and argv[9].endswith("training.py")
    assert argv[10:] == ["--worker", "--model", "resnet50", "--config", "fifo", "--np", "2"]
    assert env["MLSL_TF_PRIORITY"] == "fifo" and env["MLSL_TF_CROSS_ITERATION"] == "0"
    _, env = training.job_argv(_ns(), "resnet50", "overlap", [])
    assert not any(k.startswith("MLSL_TF_") for k in env)  # the defaults, as a user runs it
    _, env = training.job_argv(_ns(), "resnet50", "priority", [], timeline="/t.json")
    assert env["MLSL_TF_CROSS_ITERATION"] == "0" and env["MLSL_TF_TIMELINE"] == "/t.json"


def test_autotune_and_its_grid_run_only_when_named():
    """overlap_autotune turns autotune on; grid_inflight<I>_spin<S> fixes one combination of the
    candidates autotune searches; neither is in the default --configs (docs/autotune.md)."""
    _, env = training.job_argv(_ns(), "resnet50", "overlap_autotune", [])
    assert env["MLSL_TF_AUTOTUNE"] == "1" and "MLSL_TF_INFLIGHT" not in env
    _, env = training.job_argv(_ns(), "vgg16", "grid_inflight16_spin50", [])
    assert env["MLSL_TF_INFLIGHT"] == "16" and env["MLSL_TF_SPIN_US"] == "50" and "MLSL_TF_AUTOTUNE" not in env
    assert len([c for c in training.AUTOTUNE_CONFIGS if c.startswith("grid_")]) == 5 * 4
    assert not set(training.AUTOTUNE_CONFIGS) & set(training.parse([]).configs)
    assert training.parse(["--configs", "overlap,overlap_autotune,grid_inflight1_spin0"]).configs[1] == "overlap_autotune"
    assert training.parse(["--configs", "overlap,grid"]).configs == ["overlap"] + list(training.GRID)
    # the control: autotune on with nothing to tune
    _, env = training.job_argv(_ns(), "resnet50", "overlap_autotune_fixed", [])
    assert (env["MLSL_TF_AUTOTUNE"], env["MLSL_TF_INFLIGHT"], env["MLSL_TF_SPIN_US"]) == ("1", "4", "200")


def test_unbound_configurations_leave_threads_where_the_kernel_puts_them():
    """overlap_unbound / compute_unbound set MLSL_TF_BIND=none; the _pool1 pair also gives
    TensorFlow a one-thread intra-op pool; compute_* reduce nothing; none runs by default."""
    for config in training.UNBOUND_CONFIGS:
        _, env = training.job_argv(_ns(), "resnet50", config, [])
        assert env["MLSL_TF_BIND"] == "none"
        assert env.get("TF_NUM_INTRAOP_THREADS") == ("1" if config.endswith("_pool1") else None)
        assert (config in training.PLAIN_CONFIGS) == config.startswith("compute")
    assert not set(training.UNBOUND_CONFIGS) & set(training.parse([]).configs)
    assert training.parse(["--configs", "overlap_unbound"]).configs == ["overlap_unbound"]


def test_horovod_runs_under_its_own_mpiexec():
    argv, env = training.job_argv(_ns(steps=7), "vgg16", "horovod", [])
    assert argv[:3] == ["/hvd/bin/mpiexec", "-n", "2"] and argv[3] == "/hvd/bin/python"
    assert argv[-4:] == ["--np", "2", "--impl", "horovod"] and "--steps" in argv and "7" in argv
    argv, _ = training.job_argv(_ns(), "resnet50", "horovod_compute", [])
    assert argv[:3] == ["/hvd/bin/mpiexec", "-n", "2"] and argv[-6:] == ["--config", "horovod_compute", "--np", "2",
                                                                        "--impl", "horovod"]


def test_horovod_built_against_open_mpi_runs_under_its_mpirun_over_tcp(tmp_path):
    mpirun = tmp_path / "mpirun"  # a stand-in that answers --version as Open MPI's does
    mpirun.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
    mpirun.chmod(0o755)
    enter = ["/py", "hosts.py", "enter", "--prefix", "mlslhabc123", "--ranks-per-host", "1", "--"]
    argv, env = training.job_argv(_ns(horovod_mpiexec=str(mpirun)), "resnet50", "horovod", enter)
    # mpirun in host 0's namespace (PMIx's server on its eth0, which the other hosts reach)
    assert argv[:7] == ["ip", "netns", "exec", "mlslhabc1230", str(mpirun), "-n", "2"]
    assert argv[argv.index("hosts.py") - 4:argv.index("hosts.py") - 1] == ["--oversubscribe", "--bind-to", "none"]
    assert env["OMPI_MCA_btl"] == "self,tcp" and env["OMPI_MCA_btl_tcp_if_include"] == "eth0"
    assert env["PMIX_MCA_ptl_tcp_if_include"] == "eth0" and env["PMIX_MCA_ptl_tcp_remote_connections"] == "1"
    argv, env = training.job_argv(_ns(horovod_mpiexec=str(mpirun)), "resnet50", "horovod", [])  # shared memory
    assert argv[0] == str(mpirun) and not any(k.startswith(("OMPI_", "PMIX_")) for k in env)
    assert not training.is_open_mpi(str(tmp_path / "missing"))


def test_summary_rows_name_the_machine(capsys):
    intel = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C\nflags\t\t: fpu avx2 avx512f avx512_vnni\n"
    amd = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\nprocessor\t: 1\nmodel name\t: other\n"
    assert cpu_cost.machine(intel, {}) == {"cpu": "Intel(R) Xeon(R) Platinum 8375C", "cores": os.cpu_count(),
                                           "avx512": True, "tf_enable_onednn_opts": None}
    m = cpu_cost.machine(amd, {"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert (m["cpu"], m["avx512"], m["tf_enable_onednn_opts"]) == ("AMD EPYC", False, "1")
    rows = {("resnet50", "2gbit", c): [{"step_s": 0.5, "samples_per_s": 64.0}] for c in ("compute", "overlap")}
    for row in training.summarize(rows, _ns(), quiet=True):
        assert row["machine"] == cpu_cost.machine() and row["machine"]["cores"] == os.cpu_count()


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


def test_tf_config_names_the_cluster_and_this_worker():
    addresses = ["10.77.0.1:23401", "10.77.0.2:23401"]
    for i in range(2):
        config = json.loads(mwms.tf_config(addresses, i))
        assert config == {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
    try:
        mwms.tf_config(addresses, 2)
        raise AssertionError("index 2 of 2 workers accepted")
    except ValueError as e:
        assert "index 2" in str(e)


def test_mwms_workers_each_in_their_host_namespace_with_their_tf_config():
    class FakeHosts:
        prefix = "mlslhabc123"
    procs = training.mwms_procs(_ns(steps=3, np=2), "resnet50", "mwms", FakeHosts(), port=23405, out_dir="/o")
    assert len(procs) == 2
    for i, (argv, env) in enumerate(procs):
        assert argv[:4] == ["ip", "netns", "exec", f"mlslhabc123{i}"] and argv[4] == "/py"
        assert argv[6:] == ["--worker", "--model", "resnet50", "--config", "mwms", "--impl", "mwms", "--steps", "3",
                            "--out-dir", "/o"]
        config = json.loads(env["TF_CONFIG"])
        assert config["cluster"]["worker"] == ["10.77.0.1:23405", "10.77.0.2:23405"]  # the hosts' eth0 addresses
        assert config["task"] == {"type": "worker", "index": i} and env["MWMS_WORKER_INDEX"] == str(i)
        assert "TF_USE_LEGACY_KERAS" not in env and not any(k.startswith("MLSL_TF_") for k in env)
    procs = training.mwms_procs(_ns(np=3), "vgg16", "mwms_tf_keras")  # shared memory: loopback, own ports
    workers = json.loads(procs[0][1]["TF_CONFIG"])["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("127.0.0.1:") for w in workers)
    assert all(argv[0] == "/py" and env["TF_USE_LEGACY_KERAS"] == "1" for argv, env in procs)
    procs = training.mwms_procs(_ns(np=2), "resnet50", "mwms_compute")  # alone: no cluster
    assert all("TF_CONFIG" not in env for _, env in procs)


def test_tf_keras_configurations_run_mlsl_tf_under_legacy_keras():
    for config in ("overlap_tf_keras", "compute_tf_keras"):
        argv, env = training.job_argv(_ns(), "resnet50", config, [])
        assert argv[2] == "mlsl_tf.runner" and env["TF_USE_LEGACY_KERAS"] == "1"
        assert not any(k.startswith("MLSL_TF_") for k in env)  # mlsl_tf's defaults
    _, env = training.job_argv(_ns(), "resnet50", "overlap", [])
    assert "TF_USE_LEGACY_KERAS" not in env


def test_comm_cpu_sums_each_librarys_communication_threads_over_the_ranks():
    ranks = [{"python": 0.9, "comm:mlsl_tf_comm": 0.2, "tf_Compute": 0.1},
             {"python": 0.8, "comm:mlsl_tf_comm": 0.3}]
    totals = training.cpu_totals("mlsl_tf", ranks, {"ksoftirqd_s": 0.05, "softirq_s": 0.1})
    assert abs(totals["comm_cpu_s_per_step"] - 0.5) < 1e-9 and abs(totals["process_cpu_s_per_step"] - 2.3) < 1e-9
    assert totals["ksoftirqd_s_per_step"] == 0.05 and totals["softirq_s_per_step"] == 0.1
    ranks = [{"python": 1.0, "collective_ops": 0.1, "event_engine": 0.05, "grpc_global_tim": 0.01, "tf_Compute": 0.2}] * 2
    assert abs(training.cpu_totals("mwms", ranks, {})["comm_cpu_s_per_step"] - 0.32) < 1e-9
    ranks = [{"python": 1.0, "comm:python": 0.4}, {"python": 1.0, "comm:python": 0.2}]  # Horovod's unnamed thread
    assert abs(training.cpu_totals("horovod", ranks, {})["comm_cpu_s_per_step"] - 0.6) < 1e-9


def test_thread_cpu_tells_apart_the_threads_a_library_started():
    before = cpu_cost.thread_times()
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))
    t = threading.Thread(target=spin)
    t.start()
    labels = cpu_cost.label_new_threads(before, "comm:")
    assert list(labels.values()) and all(v.startswith("comm:") for v in labels.values())
    label = next(iter(labels.values()))
    start = cpu_cost.thread_cpu(labels)
    deadline, cpu = time.perf_counter() + 20, {}
    while time.perf_counter() < deadline and cpu.get(label, 0) < 0.05:  # the machine may be busy
        time.sleep(0.02)
        cpu = cpu_cost.per_step(cpu_cost.thread_cpu(labels), start, 1)
    stop.set()
    t.join()
    assert cpu.get(label, 0) >= 0.05  # the spinning thread's CPU, under its label
    assert cpu.get(label, 0) > 5 * cpu.get(label[len("comm:"):], 0)  # not under the main thread's name
    kernel = cpu_cost.kernel_cpu()
    assert kernel["softirq_s"] >= 0 and kernel["ksoftirqd_s"] >= 0


def _jobs():
    """Job rows of one (model, link): steps in seconds, CPU per step of the communication."""
    steps = {"compute": 0.6, "compute_tf_keras": 0.62, "comm": 0.5, "comm_bf16": 0.3, "overlap": 0.75,
             "overlap_bf16": 0.65, "overlap_tf_keras": 0.8, "horovod": 0.9, "horovod_compute": 0.55,
             "mwms": 1.6, "mwms_tf_keras": 1.4, "mwms_compute": 0.7}
    comm_cpu = {"overlap": 0.4, "overlap_bf16": 0.5, "overlap_tf_keras": 0.4, "horovod": 0.6, "mwms": 0.9,
                "mwms_tf_keras": 1.0}
    rows = {}
    for c, s in steps.items():
        row = {"step_s": s, "samples_per_s": 32 / s, "process_cpu_s_per_step": 2 * s,
               "comm_cpu_s_per_step": comm_cpu.get(c, 0.0), "ksoftirqd_s_per_step": 0.02}
        rows[("resnet50", "2gbit", c)] = [row, dict(row, step_s=s * 1.1, samples_per_s=32 / (s * 1.1)),
                                           dict(row, step_s=s * 0.95, samples_per_s=32 / (s * 0.95))]
    return rows


def test_both_limits_from_measured_compute_link_and_communication_cpu(capsys):
    out = {r["config"]: r for r in training.summarize(_jobs(), _ns())}
    cores = training.CORES
    ours = out["overlap"]
    assert ours["runs"] == 3 and abs(ours["step_s"] - 0.75) < 1e-9  # the median run
    assert ours["compute_config"] == "compute" and abs(ours["limit_step_s"] - 0.6) < 1e-9
    cpu_limit = max(0.5, 0.6 + (0.4 + 0.02) / cores)
    assert abs(ours["cpu_limit_step_s"] - cpu_limit) < 1e-9 and abs(ours["cpu_efficiency"] - cpu_limit / 0.75) < 1e-9
    assert abs(ours["cpu_limit_samples_per_s"] - 32 / cpu_limit) < 1e-6
    assert abs(ours["added_cpu_s"] - (1.5 - 1.2)) < 1e-9
    # each foreign stack against its own compute alone
    assert out["mwms"]["compute_config"] == "mwms_compute" and abs(out["mwms"]["limit_step_s"] - 0.7) < 1e-9
    assert out["mwms_tf_keras"]["compute_config"] == "compute_tf_keras"
    assert out["overlap_tf_keras"]["compute_config"] == "compute_tf_keras"
    assert out["horovod"]["compute_config"] == "horovod_compute"
    assert abs(out["overlap_bf16"]["cpu_limit_step_s"] - max(0.3, 0.6 + 0.52 / cores)) < 1e-9  # comm_bf16's link
    # a CPU-bound limit never below the other one
    assert all(r["cpu_limit_step_s"] >= r["limit_step_s"] for r in out.values() if "cpu_limit_step_s" in r)
    # ratios: to the better MWMS form (tf_keras fit here) and to Horovod
    assert ours["best_mwms"] == "mwms_tf_keras" and abs(ours["over_best_mwms"] - 1.4 / 0.75) < 1e-9
    assert abs(ours["over_horovod"] - 0.9 / 0.75) < 1e-9
    assert "over_best_mwms" not in out["mwms"] and "efficiency" not in out["compute"]
    assert training.cpu_bound_limit(2.0, 1.0, 0.5, 2) == 2.0  # link-bound: the link time
    assert training.cpu_bound_limit(0.1, 1.0, 0.5, 2) == 1.25  # CPU-bound: compute + 0.5 s over 2 cores


def test_markdown_table_from_a_results_file(tmp_path, capsys):
    training.summarize(_jobs(), _ns())
    path = tmp_path / "r.jsonl"
    path.write_text(capsys.readouterr().out)
    head, rule, row = training.markdown([str(path)]).splitlines()
    names = [c.strip() for c in head.strip("|").split("|")]
    assert names[:8] == ["model", "link", "mlsl_tf", "mlsl_tf bf16", "mlsl_tf tf_keras", "Horovod 0.28.1",
                         "MWMS Keras 3 loop", "MWMS tf_keras fit"]
    assert rule.count("---") == len(names)
    cells = dict(zip(names, [c.strip() for c in row.strip("|").split("|")]))
    assert cells["model"] == "resnet50" and cells["link"] == "2gbit"
    assert cells["mlsl_tf"] == f"{32 / 0.75:.1f}" and cells["MWMS tf_keras fit"] == f"{32 / 1.4:.1f}"
    assert cells["mlsl_tf / best MWMS"] == f"{1.4 / 0.75:.2f}x (mwms_tf_keras)"
    assert cells["mlsl_tf / Horovod"] == f"{0.9 / 0.75:.2f}x"
    cpu_limit = max(0.5, 0.6 + 0.42 / training.CORES)
    assert cells["limit max(compute, comm)"] == f"{32 / 0.6:.1f} ({0.6 / 0.75:.0%})"
    assert cells["limit CPU-bound"] == f"{32 / cpu_limit:.1f} ({cpu_limit / 0.75:.0%})"
    assert cells[names[-1]] == "0.42 / 0.62 / 0.92 / 1.02"  # + ksoftirqd's 0.02 each


def test_mwms_job_of_two_workers_on_shared_memory(tmp_path):
    """A real MWMS job (tiny model, 2 workers, TF_CONFIG on loopback): both workers end with the
    same weights (the gradients were all-reduced), and their CPU per thread comes back."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "training.py"), "--models", "tiny",
                           "--links", "shm", "--configs", "mwms", "--runs", "1", "--timeout", "240"],
                          capture_output=True, text=True, timeout=300)
    jobs = [json.loads(line)["job"] for line in proc.stdout.splitlines() if line.startswith('{"job"')]
    assert proc.returncode == 0 and len(jobs) == 1, proc.stderr[-2000:]
    job = jobs[0]
    assert "error" not in job, job
    assert job["ranks"] == 2 and job["samples_per_s"] > 0 and len(job["cpu_s_per_step_ranks"]) == 2
    a, b = job["weights_sum_ranks"]
    assert a == b


def test_markdown_summarizes_the_jobs_of_several_files_together(tmp_path):
    """Horovod's jobs run apart (another file) still give the ratio to Horovod and its CPU."""
    files = {"a": tmp_path / "a.jsonl", "b": tmp_path / "b.jsonl"}
    lines = {"a": [], "b": []}
    for (model, link, config), runs in _jobs().items():
        for run, job in enumerate(runs):
            job = dict(job, model=model, link=link, config=config, run=run,
                       impl=training.IMPL_OF.get(config, "mlsl_tf"))
            lines["b" if config.startswith("horovod") else "a"].append(json.dumps({"job": job}))
    for k, path in files.items():
        path.write_text("\n".join(lines[k]) + "\n")
    _, _, row = training.markdown([str(files["a"]), str(files["b"])]).splitlines()
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == f"{32 / 0.9:.1f}" and cells[9] == f"{0.9 / 0.75:.2f}x"
    assert cells[-1].split(" / ")[1] == "0.62"
    _, _, row = training.markdown([str(files["a"])]).splitlines()  # without Horovod's jobs
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == "-" and cells[9] == "-" and cells[-1].split(" / ")[1] == "-"


def test_cpu_hog_runs_on_the_last_cpu_only_while_the_block_lasts():
    last = max(os.sched_getaffinity(0))

    def hogs():
        """Children of this process pinned to the last CPU alone (the hog)."""
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid == os.getpid() and os.sched_getaffinity(int(d)) == {last}:
                    found.append(int(d))
            except (OSError, ValueError):
                continue
        return found

    with training.cpu_hogs(1) as cpus:
        assert cpus == [last]
        pids = hogs()
        assert len(pids) == 1
        time.sleep(0.3)
        with open(f"/proc/{pids[0]}/stat") as f:
            utime = int(f.read().rsplit(")", 1)[1].split()[11])
        assert utime > 0  # it burns CPU
    assert hogs() == []
    with training.cpu_hogs(0) as cpus:
        assert cpus == [] and hogs() == []
    with pytest.raises(SystemExit):
        training.parse(["--cpu-hog", str(len(os.sched_getaffinity(0)))])
