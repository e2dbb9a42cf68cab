"""mlslrun end to end: ``python -m mlsl_tf.runner`` with the venv's mpiexec on 2 ranks.

The rank programs are small ``python -c`` scripts that do not import mlsl_tf.
Every subprocess has a timeout, so a hang is a failure.  Also the pure helpers
of launch.py and task.py.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mlsl_tf import basics as hvd_basics
from mlsl_tf.runner import installed, job_verdicts, launch, output, placement, pmi_relay, rank_status, task

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
needs_mpi = pytest.mark.skipif(installed.find_mpiexec() is None, reason="no mpiexec found")


def mlslrun_env(extra_pythonpath=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "OMPI_"))}
    env["PYTHONPATH"] = os.pathsep.join([*extra_pythonpath, str(REPO),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def mlslrun(*args, env=None, cwd=REPO, timeout=TIMEOUT_S):
    """Run mlslrun as users do; returns the CompletedProcess (text output captured).

    Each start imports the mlsl_tf package (and so TensorFlow): errors of the
    command line are tested in-process with run_main instead.
    """
    return subprocess.run([sys.executable, "-m", "mlsl_tf.runner", *args],
                          env=env or mlslrun_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def run_main(capsys, *args):
    """launch.main in this process: (exit code, stdout, stderr)."""
    code = launch.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def program(source):
    """``python -c SOURCE`` for every rank; RANK is bound to this rank's number."""
    prelude = "import os, signal, sys, time\nRANK = int(os.environ['PMI_RANK'])\n"
    return [sys.executable, "-c", prelude + textwrap.dedent(source)]


# ---------------------------------------------------------------- end to end


@needs_mpi
def test_success_runs_every_rank():
    r = mlslrun("-np", "2", "--verbose", *program("print(f'hello from rank {RANK}', flush=True)"))
    assert r.returncode == 0, r.stderr
    assert "hello from rank 0" in r.stdout and "hello from rank 1" in r.stdout
    assert "mlslrun: mpich launcher:" in r.stdout and "task.py" in r.stdout  # --verbose
    assert "-hosts" not in r.stdout  # a local run lets hydra pick this machine


@needs_mpi
def test_rank_killed_by_sigkill_fails_the_job_and_is_named():
    # rank 0 would sleep past the timeout: the job must be torn down for the test to pass
    r = mlslrun("-np", "2", *program("""
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    """))
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    assert "rank 1" in r.stderr and "was killed by signal SIGKILL" in r.stderr
    assert "job failed" in r.stderr or "stopping the other ranks" in r.stderr


@needs_mpi
def test_rank_exit_code_fails_the_job_and_is_named():
    r = mlslrun("-np", "2", *program("""
        if RANK == 1:
            sys.exit(3)
        time.sleep(600)
    """))
    assert r.returncode == 3, r.stderr
    assert "mlslrun: rank 1 (host " in r.stderr and "exited with code 3" in r.stderr


# Real mlsl_tf jobs. No mpi4py here: mlsl_tf initialises MPI itself (tests/mpi import mpi4py
# first, so there mlsl_tf runs over a duplicate of mpi4py's world).

@needs_mpi
def test_mlsl_tf_job_initialises_mpi_itself():
    r = mlslrun("-np", "2", *program("""
        import mlsl_tf as hvd, tensorflow as tf
        hvd.init()
        assert "mpi4py" not in sys.modules
        got = hvd.allreduce(tf.constant([float(RANK + 1)]), op=hvd.Sum, name="own_mpi").numpy()
        print(f"rank {hvd.rank()} of {hvd.size()} got {got[0]}", flush=True)
    """), timeout=240)
    assert r.returncode == 0, r.stderr
    assert "rank 0 of 2 got 3.0" in r.stdout and "rank 1 of 2 got 3.0" in r.stdout


@needs_mpi
def test_rank_that_raises_fails_its_peers_pending_collective():
    # rank 1 raises; at exit it shuts mlsl_tf down, and rank 0's allreduce fails instead of waiting
    r = mlslrun("-np", "2", *program("""
        import mlsl_tf as hvd, tensorflow as tf
        hvd.init()
        if RANK == 1:
            time.sleep(1)
            raise RuntimeError("rank 1 gives up")
        try:
            hvd.allreduce(tf.ones([4]), name="abandoned")
        except tf.errors.OpError as e:
            print(f"rank 0 error: {e.message}", flush=True)
            sys.exit(5)
        print("rank 0: no error", flush=True)
    """), timeout=240)
    assert r.returncode != 0
    assert "rank 1 gives up" in r.stderr
    assert "rank 0 error:" in r.stdout and "rank 1 shut down" in r.stdout and "'abandoned'" in r.stdout, r.stdout
    assert re.search(r"mlslrun: rank 1 \(host .*exited with code 1", r.stderr), r.stderr


@needs_mpi
def test_rank_that_raises_exits_while_its_peer_is_busy_elsewhere():
    # rank 0 raises while rank 1 computes outside mlsl_tf for minutes: rank 0 must not wait for
    # rank 1 at exit (MPI_Finalize would), so mlslrun sees the failure and stops the job.
    start = time.monotonic()
    r = mlslrun("-np", "2", *program("""
        import mlsl_tf as hvd, tensorflow as tf
        hvd.init()
        hvd.allreduce(tf.ones([4]), name="warm_up")
        if RANK == 0:
            raise RuntimeError("rank 0 gives up")
        time.sleep(300)
    """), timeout=240)
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert re.search(r"mlslrun: rank 0 \(host .*exited with code 1: RuntimeError: rank 0 gives up", r.stderr), r.stderr
    assert elapsed < 120, f"the job took {elapsed:.0f} s: the failed rank waited for its busy peer"


@needs_mpi
def test_the_rank_that_raised_is_blamed_not_the_rank_it_hit():
    # rank 1 raises; rank 0, waiting in a collective, fails because of it (and may exit first)
    for _ in range(3):
        r = mlslrun("-np", "2", *program("""
            import mlsl_tf as hvd, tensorflow as tf
            hvd.init()
            hvd.allreduce(tf.ones([4]), name="warm_up")
            if RANK == 1:
                time.sleep(0.5)
                raise ValueError("rank 1 is the culprit")
            hvd.allreduce(tf.ones([4]), name="never_answered")
        """), timeout=240)
        assert r.returncode != 0
        blamed = [line for line in r.stderr.splitlines() if line.startswith("mlslrun: ")][0]
        assert "rank 1 (host" in blamed and "rank 1 is the culprit" in blamed, r.stderr


@needs_mpi
def test_rank_killed_inside_mlsl_tf_fails_the_job():
    # rank 0 is blocked in a collective whose peer died: the job is torn down, naming rank 1
    r = mlslrun("-np", "2", *program("""
        import mlsl_tf as hvd, tensorflow as tf
        hvd.init()
        hvd.allreduce(tf.ones([4]), name="warm_up")
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(tf.ones([1 << 20]), name="never_answered")
        time.sleep(600)
    """), timeout=240)
    assert r.returncode != 0
    assert "rank 1" in r.stderr and "was killed by signal SIGKILL" in r.stderr, r.stderr


@needs_mpi
def test_output_filename_writes_per_rank_files(tmp_path):
    # relative to mlslrun's working directory, as every rank must see it
    r = mlslrun("-np", "2", "--output-filename", "logs", *program("""
        print(f'out {RANK}', flush=True)
        print(f'err {RANK}', file=sys.stderr, flush=True)
    """), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert (tmp_path / "logs" / f"rank.{rank}" / "stdout").read_text() == f"out {rank}\n"
        assert (tmp_path / "logs" / f"rank.{rank}" / "stderr").read_text() == f"err {rank}\n"
    assert "out 0" in r.stdout and "err 1" in r.stderr  # still echoed to the console


@needs_mpi
def test_env_reaches_the_ranks():
    env = mlslrun_env()
    env["PASSED_THROUGH"] = "from-shell"
    r = mlslrun("-np", "2", "-x", "FOO=bar", "-x", "PASSED_THROUGH", "--start-timeout", "60",
                *program("""
        print(f"rank {RANK}: FOO={os.environ.get('FOO')} "
              f"PT={os.environ.get('PASSED_THROUGH')} "
              f"ST={os.environ.get('MLSL_TF_START_TIMEOUT')}", flush=True)
    """), env=env)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert f"rank {rank}: FOO=bar PT=from-shell ST=60" in r.stdout


@needs_mpi
def test_start_timeout_names_the_rank_that_did_not_start(tmp_path):
    # a sitecustomize that stalls rank 1's wrapper before task.py runs
    (tmp_path / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('PMI_RANK') == '1':\n    time.sleep(600)\n")
    r = mlslrun("-np", "2", "--start-timeout", "5", *program("time.sleep(600)"),
                env=mlslrun_env([str(tmp_path)]))
    assert r.returncode != 0
    # rank 0 starts at once; only a very loaded machine makes it late too
    assert re.search(r"ranks? (0, )?1 did not start within 5 s \(--start-timeout\)", r.stderr)


@needs_mpi
def test_sigterm_to_mlslrun_stops_the_job(tmp_path):
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlsl_tf.runner", "-np", "2",
         *program(f"open({str(started)!r} + str(RANK), 'w').close()\ntime.sleep(600)")],
        env=mlslrun_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, stdin=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if all(pathlib.Path(f"{started}{r}").exists() for r in (0, 1)):
                break
            try:
                proc.wait(0.1)
                break
            except subprocess.TimeoutExpired:
                pass
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM (sent by the launcher)" in err
    assert err.rstrip().endswith("mlslrun: job stopped: mlslrun received SIGTERM"), err


def test_unknown_flag_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "-np", "2", "--bogus", "python")
    assert code == 2
    assert "usage: mlslrun" in err and "--bogus" in err


def test_missing_command_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "-np", "2")
    assert code == 2 and "missing the command" in err


def test_too_many_ranks_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "-np", "3", "-H", "localhost:2", "python")
    assert code == 2 and "-np 3 is more than the 2 slots" in err


def test_missing_hostfile_is_a_usage_error(capsys, tmp_path):
    code, _, err = run_main(capsys, "-np", "2", "--hostfile", str(tmp_path / "nope"), "python")
    assert code == 2 and "--hostfile" in err and "No such file" in err


def test_bad_hostfile_names_the_line(capsys, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=2\nother slots=many\n")
    code, _, err = run_main(capsys, "-np", "2", "--hostfile", str(hf), "python")
    assert code == 2 and "line 2" in err and "'many'" in err


def test_non_utf8_hostfile_is_one_error_line(capsys, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_bytes(b"localhost slots=2\n\xff\xfe\n")
    code, _, err = run_main(capsys, "-np", "2", "--hostfile", str(hf), "python")
    assert code == 2 and f"--hostfile {hf}: not UTF-8 text (byte 18" in err and "Traceback" not in err


def test_output_filename_under_a_regular_file_is_one_error_line(capsys, tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    for path in (regular, regular / "logs" / "deeper"):
        code, _, err = run_main(capsys, "-np", "2", "--output-filename", str(path), "python", "-c", "pass")
        assert code == 2 and f"mlslrun: error: --output-filename {path}: {regular} is not a directory" in err, err
        assert "Traceback" not in err


def test_srun_launcher_without_srun(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "")
    code, _, err = run_main(capsys, "-np", "2", "--launcher", "srun", "python")
    assert code == 1 and "srun is not on PATH" in err


def test_help(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0 and "--output-filename" in out


def test_check_build():
    r = mlslrun("--check-build")
    assert r.returncode == 0, r.stderr
    for line in ("Available Frameworks:", "TensorFlow", "[ ] PyTorch", "[ ] MXNet",
                 "Available Controllers:", "[ ] Gloo", "Available Tensor Operations:",
                 "[ ] NCCL", "[ ] DDL", "[ ] CCL", "[X] MPI"):
        assert line in r.stdout


# ---------------------------------------------------------------- task.py


def run_task(args, rank="0", timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in placement.RANK_ENV_VARS}
    env["PMI_RANK"] = rank
    return subprocess.run([sys.executable, task.__file__, *args], env=env,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_task_writes_markers_and_status(tmp_path):
    r = run_task(["--status-dir", str(tmp_path), "--", sys.executable, "-c", "exit(4)"],
                 rank="3")
    assert r.returncode == 4
    assert (tmp_path / "start.3.json").exists()
    status = rank_status.read_status(rank_status.status_path(str(tmp_path), 3))
    assert status.exitcode == 4 and status.signal is None and status.failed
    assert "mlslrun: rank 3 (host " in r.stderr and "exited with code 4" in r.stderr


def test_task_under_srun_without_pmi_refuses(tmp_path):
    """srun --mpi=none: the task has its rank only in SLURM_PROCID and no PMI; MPI would make it a
    world of one, so the wrapper says why and does not start the command."""
    env = {k: v for k, v in os.environ.items()
           if k not in placement.RANK_ENV_VARS and k not in pmi_relay.PMI_ENV_VARS}
    marker = tmp_path / "ran"
    r = subprocess.run([sys.executable, task.__file__, "--num-proc", "2", "--", "touch", str(marker)],
                       env=dict(env, SLURM_PROCID="1"), capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and not marker.exists()
    assert "rank 1 (host " in r.stderr and "srun started this task with no PMI" in r.stderr, r.stderr
    assert "instead of as one of 2 ranks" in r.stderr and "srun --mpi=pmi2" in r.stderr


@pytest.mark.parametrize("environ,num_proc,refused", [
    ({"SLURM_PROCID": "0"}, 2, True),
    ({"SLURM_PROCID": "0"}, 1, False),  # a world of one is what was asked
    ({"SLURM_PROCID": "0", "PMI_FD": "5", "PMI_RANK": "0"}, 2, False),  # srun --mpi=pmi2
    ({"SLURM_PROCID": "0", "PMIX_NAMESPACE": "slurm.pmix.1.0", "PMIX_RANK": "0"}, 2, False),  # --mpi=pmix
    ({"PMI_RANK": "0", "PMI_FD": "5"}, 2, False),  # hydra
])
def test_srun_without_pmi(environ, num_proc, refused):
    assert (pmi_relay.srun_without_pmi(environ, num_proc) is not None) == refused


def test_task_success_is_quiet(tmp_path):
    r = run_task(["--status-dir", str(tmp_path), "--", sys.executable, "-c", "print('ok')"])
    assert r.returncode == 0 and r.stdout == "ok\n" and r.stderr == ""
    assert not rank_status.read_status(rank_status.status_path(str(tmp_path), 0)).failed


def test_task_reports_signal(tmp_path):
    r = run_task(["--", sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert r.returncode == 128 + 9 and "was killed by signal SIGKILL" in r.stderr


def test_task_command_not_found():
    r = run_task(["--", "/nonexistent/program"])
    assert r.returncode == 127 and "could not start" in r.stderr


def test_task_without_rank_env_is_an_error():
    env = {k: v for k, v in os.environ.items() if k not in placement.RANK_ENV_VARS}
    r = subprocess.run([sys.executable, task.__file__, "--", "true"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "PMI_RANK" in r.stderr


# Every rank starts through task.py before its command, so the wrapper must start fast and must never
# load TensorFlow or mlsl_tf's heavy modules (the loaded library, basics, ops ...).  Of the package it
# loads exactly: the lazy __init__ (imports nothing), cpu_placement.py (the one parser of MLSL_TF_COMM_CORE)
# and the wrapper's own modules of runner/ -- runner/__init__ (a docstring), placement, rank_status,
# output, pmi_relay, child -- each standard library only.  Not launch.py, argv.py or the other
# modules of mlslrun itself, which the wrapper never needs.  A module added here must be as light.
TASK_MODULES = ["mlsl_tf", "mlsl_tf.cpu_placement", "mlsl_tf.runner", "mlsl_tf.runner.child", "mlsl_tf.runner.output",
                "mlsl_tf.runner.placement", "mlsl_tf.runner.pmi_relay", "mlsl_tf.runner.rank_status",
                "mlsl_tf.runner.worker_env"]


def test_task_imports_only_light_modules(tmp_path):
    """The rank wrapper starts before TensorFlow: of the package it loads TASK_MODULES only."""
    code = ("import runpy, sys; sys.argv = ['task.py', '--', 'true']; "
            f"runpy.run_path({task.__file__!r}, run_name='not_main'); "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mlsl_tf', 'tensorflow')); "
            f"assert loaded == {TASK_MODULES!r}, loaded")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_find_rank():
    assert placement.find_rank({"PMI_RANK": "2"}) == 2
    assert placement.find_rank({"OMPI_COMM_WORLD_RANK": "5"}) == 5
    assert placement.find_rank({"SLURM_PROCID": "1", "PMIX_RANK": "7"}) == 1
    assert placement.find_rank({"PMIX_RANK": "7"}) == 7
    with pytest.raises(ValueError, match="none of PMI_RANK"):
        placement.find_rank({})
    with pytest.raises(ValueError, match="not a rank number"):
        placement.find_rank({"PMI_RANK": "x"})


def test_rank_dir_name_pads_like_horovodrun():
    assert output.rank_dir_name(1, 2) == "rank.1"
    assert output.rank_dir_name(3, 16) == "rank.03"
    assert output.rank_dir_name(7, 100) == "rank.07"
    assert output.rank_dir_name(0, 1) == "rank.0"
    assert output.rank_dir_name(4, None) == "rank.4"


def status(rank, *, code=None, sig=None, forwarded=None, t=0.0, **failure):
    return rank_status.RankStatus(rank, "h", 100 + rank, code, sig, forwarded, t, **failure)


def test_describe():
    assert status(1, code=3).describe() == "rank 1 (host h, pid 101) exited with code 3"
    assert status(0, sig=9).describe() == "rank 0 (host h, pid 100) was killed by signal SIGKILL"
    assert status(0, sig=15, forwarded=15).describe().endswith("SIGTERM (sent by the launcher)")
    assert status(0, sig=15).wrapper_exit_code == 143


# ---------------------------------------------------------------- launch.py helpers


def test_first_failure_prefers_the_cause():
    assert job_verdicts.first_failure([status(0, code=0)]) is None
    stopped = status(0, sig=15, forwarded=15, t=1.0)
    cause = status(1, code=3, t=2.0)
    assert job_verdicts.first_failure([stopped, cause]) == cause
    assert job_verdicts.first_failure([status(1, code=2, t=5.0), status(0, code=1, t=4.0)]).rank == 0
    # a rank that only reports another rank's end is not the cause, even when it ended first
    hit = status(0, code=1, t=1.0, failed_at=1.0, caused_by_peer=True)
    culprit = status(1, code=1, t=3.0, failed_at=0.5, error="ValueError: x")
    assert job_verdicts.first_failure([hit, culprit]) == culprit
    # when the exception was raised counts, not when the process ended
    late_exit = status(1, code=1, t=9.0, failed_at=1.0)
    assert job_verdicts.first_failure([status(0, code=1, t=2.0, failed_at=2.0), late_exit]) == late_exit


def test_failure_record_counts_before_the_status(tmp_path):
    d = str(tmp_path)
    with open(rank_status.start_marker_path(d, 1), "w") as f:
        json.dump({"rank": 1, "host": "hx", "pid": 7, "time": 0.0}, f)
    with open(rank_status.failure_path(d, 1), "w") as f:
        json.dump({"time": 5.0, "pid": 8, "error": "ValueError: bad", "caused_by_peer": False}, f)
    [s] = job_verdicts.rank_statuses(d, 2)
    assert (s.rank, s.host, s.pid, s.exitcode, s.failed_at, s.caused_by_peer) == (1, "hx", 8, 1, 5.0, False)
    assert s.describe() == "rank 1 (host hx, pid 8) exited with code 1: ValueError: bad"
    assert rank_status.FAILURE_FILE_ENV == hvd_basics.FAILURE_FILE_ENV


def test_exit_code_of():
    assert job_verdicts.exit_code_of(0) == 0
    assert job_verdicts.exit_code_of(3) == 3
    assert job_verdicts.exit_code_of(-9) == 137


def test_format_ranks():
    assert job_verdicts.format_ranks([3]) == "rank 3"
    assert job_verdicts.format_ranks([2, 1]) == "ranks 1, 2"


def test_check_build_text():
    text = installed.check_build_text(False, "ImportError: no op library", True, "0.1")
    assert text.startswith("mlsl_tf v0.1:\n")
    assert "[ ] TensorFlow  (ImportError: no op library)" in text
    controllers, operations = text.split("Available Tensor Operations:")
    assert "[X] MPI" in controllers and "[ ] MPI" in operations  # no op library: no MPI operations
    loaded = installed.check_build_text(True, "", False, "0.1")
    assert "[X] TensorFlow\n" in loaded
    controllers, operations = loaded.split("Available Tensor Operations:")
    assert "[ ] MPI" in controllers and "[X] MPI" in operations


def test_find_mpiexec_prefers_the_python_sibling(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mpiexec"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert installed.find_mpiexec(str(bin_dir / "python"), path="") == str(fake)
    assert installed.find_mpiexec(str(tmp_path / "python"), path=str(bin_dir)) == str(fake)
    assert installed.find_mpiexec(str(tmp_path / "python"), path="", build_info=str(tmp_path / "none.json")) is None


def test_find_mpiexec_then_the_mpi_the_package_was_built_with(tmp_path):
    """An installed package records its MPI's mpiexec (setup.py: _build.json): used when no
    mpiexec is beside the interpreter (a venv that sees another environment's MPI), before PATH."""
    built, on_path = tmp_path / "mpi" / "bin", tmp_path / "path"
    for d in (built, on_path):
        d.mkdir(parents=True)
        (d / "mpiexec").write_text("#!/bin/sh\n")
        (d / "mpiexec").chmod(0o755)
    info = tmp_path / "_build.json"
    info.write_text(json.dumps({"mpicxx": str(built / "mpicxx"), "mpiexec": str(built / "mpiexec")}))
    python = str(tmp_path / "venv" / "bin" / "python")
    assert installed.find_mpiexec(python, path=str(on_path), build_info=str(info)) == str(built / "mpiexec")
    (built / "mpiexec").unlink()  # that MPI is gone: PATH's
    assert installed.find_mpiexec(python, path=str(on_path), build_info=str(info)) == str(on_path / "mpiexec")
    info.write_text("not json")
    assert installed.find_mpiexec(python, path="", build_info=str(info)) is None


@needs_mpi
def test_found_mpiexec_is_recognised():
    from mlsl_tf.runner import launchers
    text = installed.mpi_version_text(installed.find_mpiexec())
    assert launchers.detect_flavour(text) in ("mpich", "openmpi", "intel")


# ---------------------------------------------------------------- faults the launcher must survive


def job_processes(marker):
    """pids of live processes whose environment holds MLSLRUN_TEST_JOB=marker: mlslrun, mpiexec,
    hydra's proxies, the wrappers and the ranks of one job."""
    needle = f"MLSLRUN_TEST_JOB={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@needs_mpi
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_mlslrun_leaves_no_rank_behind(tmp_path):
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    env = mlslrun_env()
    env["MLSLRUN_TEST_JOB"] = marker
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlsl_tf.runner", "-np", "2", *program(f"""
            d = {str(tmp_path)!r}
            open(f"{{d}}/pid.{{RANK}}.tmp", "w").write(str(os.getpid()))
            os.rename(f"{{d}}/pid.{{RANK}}.tmp", f"{{d}}/pid.{{RANK}}")
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a rank deaf to SIGTERM is killed too
            while True:
                open(f"{{d}}/beat.{{RANK}}", "w").write(str(time.time()))
                time.sleep(0.1)
        """)], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL)
    pids = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not all((tmp_path / f"beat.{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
        proc.kill()
        proc.wait(10)
        killed_at = time.monotonic()
        while time.monotonic() < killed_at + 5 and (job_processes(marker) or any(map(alive, pids))):
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)], "ranks still running 5 s after mlslrun was killed"
        assert job_processes(marker) == [], "mpiexec, proxies or wrappers left 5 s after mlslrun was killed"
    finally:
        for pid in set(job_processes(marker) + [p for p in pids if alive(p)]):
            os.kill(pid, signal.SIGKILL)  # this test's own job, if the launcher left it


@needs_mpi
def test_rank_that_leaves_with_os_exit_0_is_named():
    r = mlslrun("-np", "2", *program("""
        from mpi4py import MPI
        MPI.COMM_WORLD.barrier()
        if RANK == 1:
            time.sleep(0.5)
            os._exit(0)
        time.sleep(600)
    """))
    assert r.returncode != 0, r.stderr
    blamed = [line for line in r.stderr.splitlines() if line.startswith("mlslrun: ")]
    assert blamed and re.match(r"mlslrun: job failed: rank 1 \(host .*exited with code 0 while rank 0 still ran",
                               blamed[-1]), r.stderr


@needs_mpi
def test_rank_that_leaves_before_init_ends_the_job_naming_it():
    # rank 1 returns early (code 0) without starting MPI, rank 0 calls mlsl_tf.init(): MPI_Init
    # needs every rank, so rank 0 would wait for ever; mlslrun ends the job naming rank 1
    start = time.monotonic()
    r = mlslrun("-np", "2", *program("""
        if RANK == 1:
            sys.exit(0)
        import mlsl_tf
        mlsl_tf.init()
        print("rank 0 initialized", flush=True)
    """), timeout=120)
    assert r.returncode != 0 and "rank 0 initialized" not in r.stdout, r.stderr
    assert re.search(r"mlslrun: rank 1 \(host .*\) exited with code 0 without starting MPI \(before init\(\)\), "
                     r"while rank 0 started it and wait in MPI_Init", r.stderr), r.stderr
    assert time.monotonic() - start < 60


@needs_mpi
def test_rank_that_finalizes_while_another_works_is_not_stopped():
    # rank 1 finalizes MPI and exits 0 while rank 0 works on past mlslrun's grace for a rank that
    # did not finalize: legal, the job succeeds (MPICH's MPI_Finalize returns once every rank
    # called it, so here rank 1 ends with rank 0)
    r = mlslrun("-np", "2", *program(f"""
        from mpi4py import MPI
        MPI.COMM_WORLD.barrier()
        if RANK == 1:
            print("rank 1 finalizing", flush=True)
            MPI.Finalize()
            sys.exit(0)
        time.sleep({launch.LEAVER_GRACE_S + 2})
        print("rank 0 done", flush=True)
    """))
    assert r.returncode == 0, r.stderr
    assert "rank 1 finalizing" in r.stdout and "rank 0 done" in r.stdout, r.stdout
    assert "mlslrun: " not in r.stderr, r.stderr


@needs_mpi
def test_rank_without_mpi_may_end_first():
    # no rank starts MPI: rank 1 ends at once, rank 0 after mlslrun's grace; the job succeeds
    r = mlslrun("-np", "2", *program(f"""
        if RANK == 0:
            time.sleep({launch.LEAVER_GRACE_S + 2})
        print(f"rank {{RANK}} done", flush=True)
    """))
    assert r.returncode == 0, r.stderr
    assert "rank 0 done" in r.stdout and "rank 1 done" in r.stdout, r.stdout
    assert "mlslrun: " not in r.stderr, r.stderr


@needs_mpi
def test_error_inside_tf_function_reaches_the_summary():
    r = mlslrun("-np", "2", *program("""
        import mlsl_tf as hvd, tensorflow as tf
        hvd.init()

        @tf.function
        def step():
            return hvd.allreduce(tf.ones([RANK + 1]), name="mismatched")

        step()
    """), timeout=240)
    assert r.returncode == 1, r.stderr
    blamed = [line for line in r.stderr.splitlines() if line.startswith("mlslrun: ")][0]
    assert "Graph execution error" not in blamed, r.stderr
    assert "allreduce 'mismatched': shape [1] on rank 0 vs [2] on rank 1" in blamed, r.stderr


LINE_CHARS, LINES = 3000, 400


def whole_lines_check(text, stream, lines=LINES):
    """Every line of ``text`` is '[R]<stream>:R:i:RRR...' whole; each rank's i run 0..lines-1,
    and the last one (written without newline) is there too."""
    seen = {0: [], 1: []}
    pattern = re.compile(rf"\[(\d)\]<{stream}>:(\d):(\d+):(\d+)")
    for line in text.splitlines():
        m = pattern.fullmatch(line)
        assert m, f"a {stream} line that is not one rank's whole line: {line[:120]!r}...{line[-60:]!r}"
        tag, rank, i, body = int(m[1]), int(m[2]), int(m[3]), m[4]
        assert tag == rank and body == str(rank) * LINE_CHARS, f"rank {tag}'s line {i} is mixed"
        seen[rank].append(i)
    assert seen == {0: list(range(lines + 1)), 1: list(range(lines + 1))}, "lines lost or reordered"


@needs_mpi
def test_output_lines_are_tagged_and_whole():
    # block-buffered writes of long lines from both ranks at once: 8 KiB writes cut lines anywhere
    r = mlslrun("-np", "2", *program(f"""
        body = str(RANK) * {LINE_CHARS}
        for i in range({LINES}):
            sys.stdout.write(f"{{RANK}}:{{i}}:{{body}}\\n")
            sys.stderr.write(f"{{RANK}}:{{i}}:{{body}}\\n")
        sys.stdout.write(f"{{RANK}}:{LINES}:{{body}}")  # no newline at the end
        sys.stderr.write(f"{{RANK}}:{LINES}:{{body}}")
    """))
    assert r.returncode == 0, r.stderr[-2000:]
    whole_lines_check(r.stdout, "stdout")
    whole_lines_check(r.stderr, "stderr")


@needs_mpi
def test_no_tag_output_passes_output_unchanged(tmp_path):
    r = mlslrun("-np", "2", "--no-tag-output", "--output-filename", str(tmp_path), *program("""
        print(f"plain {RANK}", flush=True)
    """))
    assert r.returncode == 0, r.stderr
    # untagged, the ranks' bytes reach the console as the launcher merges them (even mid-line)
    assert "<stdout>:" not in r.stdout and sorted(r.stdout) == sorted("plain 0\nplain 1\n"), r.stdout
    assert (tmp_path / "rank.1" / "stdout").read_text() == "plain 1\n"


def test_tag_lines():
    tag = output.output_tag(3, "stderr")
    assert tag == b"[3]<stderr>:"
    assert output.tag_lines(b"", b"a\nbc", tag) == ([b"[3]<stderr>:a\n"], b"bc")
    assert output.tag_lines(b"bc", b"d\n\n", tag) == ([b"[3]<stderr>:bcd\n", b"[3]<stderr>:\n"], b"")
    assert output.tag_lines(b"x", b"", tag, final=True) == ([b"[3]<stderr>:x\n"], b"")
    assert output.tag_lines(b"", b"", tag, final=True) == ([], b"")
    long = b"y" * (output.LINE_MAX + 5)
    assert output.tag_lines(b"", long, tag) == ([tag + b"y" * output.LINE_MAX + b"\n"], b"yyyyy")


def test_batch_lines_keeps_lines_whole():
    lines = [b"a" * 3, b"b" * 4, b"c" * 9, b"d" * 2]
    assert output.batch_lines(lines, limit=8) == [b"aaabbbb", b"c" * 9, b"dd"]
    assert output.batch_lines([], limit=8) == []


def test_early_leaver():
    left = status(1, code=0, t=1.0)
    assert job_verdicts.early_leaver([left], 2) == left  # rank 0 never reported: it was still running
    assert job_verdicts.early_leaver([status(0, code=0, t=5.0), left], 2) == left
    assert job_verdicts.early_leaver([status(0, code=0, t=1.0), status(1, code=0, t=1.0)], 2) is None
    assert job_verdicts.early_leaver([status(0, code=1, t=0.5)], 2) is None


def test_graph_execution_error_keeps_the_op_message():
    text = ("Graph execution error:\n\nDetected at node MlslAllreduce defined at (most recent call last):\n"
            '  File "t.py", line 7, in <module>\n\n  File "<string>", line 110, in mlsl_allreduce\n\n'
            "mlsl_tf: allreduce 'm': shape [1] on rank 0 vs [2] on rank 1\n"
            "\t [[{{node MlslAllreduce}}]] [Op:__inference_f_6]")
    assert hvd_basics._graph_error_message(text) == "mlsl_tf: allreduce 'm': shape [1] on rank 0 vs [2] on rank 1"
    assert hvd_basics._graph_error_message("plain\nmessage") == "plain\nmessage"


def test_blame_names_the_rank_that_shut_down(tmp_path):
    d = str(tmp_path)
    with open(rank_status.start_marker_path(d, 1), "w") as f:
        json.dump({"rank": 1, "host": "hx", "pid": 7, "time": 0.0}, f)
    error = "AbortedError: mlsl_tf: rank 1 shut down, so collectives can no longer complete"
    hit = status(0, code=1, t=2.0, failed_at=1.0, caused_by_peer=True, error=error)
    assert job_verdicts.shut_down_peer(hit) == 1
    assert job_verdicts.blame(hit, d).startswith("rank 1 (host hx) left first: it shut mlsl_tf down")
    assert job_verdicts.blame(hit, d).endswith(hit.describe())
    several = status(0, code=1, t=2.0, failed_at=1.0, caused_by_peer=True,
                     error="AbortedError: mlsl_tf: ranks 2, 3 shut down, so collectives can no longer complete")
    assert job_verdicts.shut_down_peer(several) == 2
    own = status(0, code=1, t=2.0, failed_at=1.0, error="ValueError: rank 1 shut down the party")
    assert job_verdicts.shut_down_peer(own) is None and job_verdicts.blame(own, d) == own.describe()


def test_far_more_ranks_than_cores_needs_oversubscribe(capsys):
    code, _, err = run_main(capsys, "-np", "100000", "python", "-c", "pass")
    cores = len(os.sched_getaffinity(0))
    assert code == 2 and "Traceback" not in err
    assert (f"mlslrun: error: -np 100000 puts 100000 ranks on this host, which has {cores} core" in err
            and "needs --oversubscribe" in err), err


def test_ranks_here_counts_only_this_machines_hosts():
    from mlsl_tf.runner.argv import parse_args
    from mlsl_tf.runner.config import HostSlots, UsageError
    cfg = parse_args(["-np", "9", "python"])
    with pytest.raises(UsageError, match="-np 9 puts 9 ranks on this host, which has 2 cores: more than 8"):
        launch.check_ranks_here(cfg, None, cores=2)
    launch.check_ranks_here(cfg, None, cores=3)  # 9 <= 12
    launch.check_ranks_here(parse_args(["-np", "9", "--oversubscribe", "python"]), None, cores=2)
    # ranks on other hosts are theirs to carry; local names count
    launch.check_ranks_here(cfg, [HostSlots("localhost", 1), HostSlots("node-b.invalid", 8)], cores=2)
    with pytest.raises(UsageError, match="puts 9 ranks on this host"):
        launch.check_ranks_here(cfg, [HostSlots("localhost", 5), HostSlots("127.0.0.1", 4)], cores=2)
