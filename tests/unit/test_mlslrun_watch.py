"""mlslrun's own watch for a rank that left without finalizing MPI: the PMI commands the rank
wrapper reads on the way to the launcher (task.py), the decision (launch.py) with a fake status
dir and a fake job, and whole jobs under a fake launcher that, unlike hydra, never ends a job by
itself.  Every subprocess has a timeout, so a hang is a failure."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from mlsl_tf.runner import job_verdicts, launch, placement, pmi_relay, rank_status, task

TIMEOUT_S = 120


def status(rank, *, code=0, t=0.0, mpi=None, sig=None, forwarded=None):
    return rank_status.RankStatus(rank, "h", 100 + rank, code if sig is None else None, sig, forwarded, t, mpi=mpi)


# ---------------------------------------------------------------- PMI commands


def test_pmi_commands_names_each_whole_command():
    names, rest = pmi_relay.pmi_commands(b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_maxes\ncmd=fin")
    assert (names, rest) == (["init", "get_maxes"], b"cmd=fin")
    names, rest = pmi_relay.pmi_commands(rest + b"alize\n")
    assert (names, rest) == (["finalize"], b"")
    spawn = b"mcmd=spawn\nnprocs=1\nexecname=a.out\nendcmd\n"
    assert pmi_relay.pmi_commands(spawn + b"cmd=barrier_in\n") == (["spawn", "barrier_in"], b"")
    assert pmi_relay.pmi_commands(spawn[:-3]) == ([], spawn[:-3])
    pmi2 = b"cmd=fullinit;pmirank=1;"
    framed = b"%6d" % len(pmi2) + pmi2
    assert pmi_relay.pmi_commands(framed + b"    13cmd=finalize;") == (["fullinit", "finalize"], b"")
    assert pmi_relay.pmi_commands(framed[:-1]) == ([], framed[:-1])
    assert pmi_relay.pmi_commands(b"cmd") == ([], b"cmd")  # fewer bytes than any command


def test_pmi_commands_rejects_other_bytes():
    with pytest.raises(ValueError, match="not a PMI command"):
        pmi_relay.pmi_commands(b"hello world\n")
    with pytest.raises(ValueError, match="not a PMI-2 command"):
        pmi_relay.pmi_commands(b"     5hello")


# ---------------------------------------------------------------- the decision (pure)


def test_unfinalized_leaver():
    left = status(1, t=10.0, mpi=pmi_relay.MPI_NOT_FINALIZED)
    assert job_verdicts.unfinalized_leaver([left], 2, now=13.0, grace=3.0) == left
    assert job_verdicts.unfinalized_leaver([left], 2, now=12.9, grace=3.0) is None  # the launcher's turn still
    assert job_verdicts.unfinalized_leaver([left, status(0, t=11.0)], 2, now=20.0) is None  # every rank ended
    for mpi in (pmi_relay.MPI_FINALIZED, pmi_relay.MPI_UNUSED, None):  # left as it may, or not seen
        assert job_verdicts.unfinalized_leaver([status(1, t=10.0, mpi=mpi)], 2, now=20.0) is None
    failed = rank_status.RankStatus(1, "h", 101, 3, None, None, 10.0, mpi=pmi_relay.MPI_NOT_FINALIZED)
    assert job_verdicts.unfinalized_leaver([failed], 2, now=20.0) is None  # a failure, handled as one
    first = status(2, t=9.0, mpi=pmi_relay.MPI_NOT_FINALIZED)
    assert job_verdicts.unfinalized_leaver([left, first], 4, now=20.0) == first


def test_early_leaver_is_not_a_rank_that_finalized():
    finalized = status(1, t=1.0, mpi=pmi_relay.MPI_FINALIZED)
    culprit = status(2, t=2.0, mpi=pmi_relay.MPI_NOT_FINALIZED)
    assert job_verdicts.early_leaver([finalized, culprit], 3) == culprit
    assert job_verdicts.early_leaver([finalized], 2) is None
    assert job_verdicts.early_leaver([status(1, t=1.0, mpi=pmi_relay.MPI_UNUSED)], 2) is None
    assert job_verdicts.still_running([finalized, culprit, status(0, t=5.0)], 4, culprit) == [0, 3]


def test_the_rank_that_left_is_blamed_for_the_launchers_stop():
    # Open MPI's mpirun stops the other ranks (SIGTERM) when one leaves without finalizing
    left = status(1, t=1.0)
    stopped = status(0, sig=15, forwarded=15, t=2.0)
    assert job_verdicts.left_before_the_stop([left, stopped], 2) == left
    assert job_verdicts.left_before_the_stop([left], 2) is None  # nothing failed
    assert job_verdicts.left_before_the_stop([left, stopped, status(2, code=3, t=1.5)], 3) is None  # a real failure
    assert job_verdicts.left_before_the_stop([status(1, t=1.0, mpi=pmi_relay.MPI_FINALIZED), stopped], 2) is None


def test_status_files_without_mpi_still_read(tmp_path):
    path = rank_status.status_path(str(tmp_path), 0)
    with open(path, "w") as f:  # written by an older wrapper
        json.dump({"rank": 0, "host": "h", "pid": 1, "exitcode": 0, "signal": None, "forwarded": None,
                   "time": 1.0}, f)
    assert rank_status.read_status(path).mpi is None


# ---------------------------------------------------------------- _watch with a fake job


class FakeJob:
    """A launcher that ends by itself after ``ends_after`` polls (never: None), or on stop()."""

    def __init__(self, ends_after=None, code=0):
        self.polls, self.ends_after, self.code = 0, ends_after, code
        self.stopped_at = None
        self.signals_received = 0

    def poll(self):
        self.polls += 1
        if self.stopped_at is not None:
            return -signal.SIGTERM
        if self.ends_after is not None and self.polls > self.ends_after:
            return self.code
        return None

    def stop(self):
        self.stopped_at = time.monotonic()


def write_status(status_dir, s):
    rank_status.write_status(str(status_dir), s)


def test_watch_stops_a_job_a_rank_left_without_finalizing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch, "LEAVER_GRACE_S", 1.0)
    left_at = time.time()
    write_status(tmp_path, rank_status.RankStatus(1, "h", 101, 0, None, None, left_at, mpi=pmi_relay.MPI_NOT_FINALIZED))
    job = FakeJob()
    start = time.monotonic()
    outcome = launch._watch(job, str(tmp_path), 2, None)
    assert job.stopped_at is not None and outcome.code == -signal.SIGTERM
    assert 0.9 <= job.stopped_at - start <= 10, "stopped before the launcher's grace, or long after it"
    assert outcome.leaver.rank == 1
    err = capsys.readouterr().err
    assert re.search(r"mlslrun: rank 1 \(host h, pid 101\) exited with code 0 without finalizing MPI while "
                     r"rank 0 still ran, and the launcher has not ended the job 1 s later; stopping it", err), err


def test_watch_leaves_a_rank_that_finalized(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch, "LEAVER_GRACE_S", 0.0)
    for mpi in (pmi_relay.MPI_FINALIZED, pmi_relay.MPI_UNUSED, None):
        write_status(tmp_path, rank_status.RankStatus(1, "h", 101, 0, None, None, time.time() - 60, mpi=mpi))
        job = FakeJob(ends_after=20)
        assert launch._watch(job, str(tmp_path), 2, None) == launch.Outcome(0)
        assert job.stopped_at is None
    assert capsys.readouterr().err == ""


def test_watch_gives_the_launcher_its_grace(tmp_path, monkeypatch):
    # hydra usually ends such a job itself within the grace: then mlslrun stops nothing
    monkeypatch.setattr(launch, "LEAVER_GRACE_S", 30.0)
    write_status(tmp_path, rank_status.RankStatus(1, "h", 101, 0, None, None, time.time(), mpi=pmi_relay.MPI_NOT_FINALIZED))
    job = FakeJob(ends_after=5, code=9)
    assert launch._watch(job, str(tmp_path), 2, None) == launch.Outcome(9)
    assert job.stopped_at is None


# ---------------------------------------------------------------- the rank wrapper's relay


def run_task_with_pmi(tmp_path, source, rank=0):
    """task.py with a PMI connection whose far end this test serves: each command line gets
    ``cmd=reply_to_NAME``.  Returns (bytes the server got, the wrapper's CompletedProcess)."""
    server, client = socket.socketpair()
    env = {k: v for k, v in os.environ.items() if k not in placement.RANK_ENV_VARS}
    env.update(PMI_RANK=str(rank), PMI_FD=str(client.fileno()))
    proc = subprocess.Popen([sys.executable, task.__file__, "--status-dir", str(tmp_path), "--",
                             sys.executable, "-c", textwrap.dedent(source)],
                            env=env, pass_fds=[client.fileno()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    client.close()
    got, pending = b"", b""
    server.settimeout(TIMEOUT_S)
    try:
        while data := server.recv(4096):  # until the wrapper exits
            got += data
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                server.sendall(b"cmd=reply_to_" + line[4:].split(b" ")[0] + b"\n")
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        server.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return got, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


PMI_CLIENT = """
import os, sys
fd = int(os.environ["PMI_FD"])
def call(line):
    os.write(fd, line)
    reply = b""
    while not reply.endswith(b"\\n"):
        reply += os.read(fd, 1)
    print(reply.decode().strip(), flush=True)
"""


def test_task_relays_pmi_and_records_finalize(tmp_path):
    got, r = run_task_with_pmi(tmp_path, PMI_CLIENT + textwrap.dedent("""
        call(b"cmd=init pmi_version=1 pmi_subversion=1\\n")
        call(b"cmd=finalize\\n")
        os.close(fd)
    """))
    assert r.returncode == 0, r.stderr
    assert got == b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=finalize\n"  # passed on unchanged
    assert r.stdout == "cmd=reply_to_init\ncmd=reply_to_finalize\n"  # and the replies back
    assert rank_status.read_status(rank_status.status_path(str(tmp_path), 0)).mpi == pmi_relay.MPI_FINALIZED


def test_task_records_an_exit_without_finalize(tmp_path):
    got, r = run_task_with_pmi(tmp_path, PMI_CLIENT + textwrap.dedent("""
        call(b"cmd=init pmi_version=1 pmi_subversion=1\\n")
        os._exit(0)
    """), rank=1)
    assert r.returncode == 0 and got == b"cmd=init pmi_version=1 pmi_subversion=1\n", r.stderr
    s = rank_status.read_status(rank_status.status_path(str(tmp_path), 1))
    assert (s.exitcode, s.mpi) == (0, pmi_relay.MPI_NOT_FINALIZED)


# Runs task.main in-process for a command that starts PMI and leaves by os._exit(0) (after
# MPI_Finalize, MPICH sends PMI's finalize only from an atexit handler), then lives on a while.
KEEPS_PMI_DRIVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from mlsl_tf.runner import task
code = task.main(["--status-dir", sys.argv[2], "--", sys.executable, "-c", sys.argv[3]])
print("returned", flush=True)
time.sleep(float(sys.argv[4]))
sys.exit(code)
"""


def test_task_keeps_the_launchers_pmi_socket_open_until_it_exits(tmp_path):
    # hydra SIGKILLs every rank when a rank's PMI socket closes unfinalized while the process
    # holding it lives on: a job whose ranks all ended by os._exit(0) together failed under
    # mlslrun (BAD TERMINATION, exit 9) where plain mpiexec exited 0.
    linger_s = 1.5
    server, client = socket.socketpair()
    env = {k: v for k, v in os.environ.items() if k not in placement.RANK_ENV_VARS}
    env.update(PMI_RANK="0", PMI_FD=str(client.fileno()))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(task.__file__))))
    command = PMI_CLIENT + 'call(b"cmd=init pmi_version=1 pmi_subversion=1\\n")\nos._exit(0)\n'
    proc = subprocess.Popen([sys.executable, "-c", KEEPS_PMI_DRIVER, repo, str(tmp_path), command, str(linger_s)],
                            env=env, pass_fds=[client.fileno()], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    client.close()
    try:
        server.settimeout(TIMEOUT_S)
        assert server.recv(4096) == b"cmd=init pmi_version=1 pmi_subversion=1\n"
        server.sendall(b"cmd=response_to_init rc=0\n")
        assert proc.stdout.readline() == "cmd=response_to_init rc=0\n"
        assert proc.stdout.readline() == "returned\n"  # task.main is done; its process lives on
        server.settimeout(linger_s / 2)
        with pytest.raises(socket.timeout):
            server.recv(4096)  # no EOF while the wrapper's process lives
        server.settimeout(TIMEOUT_S)
        assert server.recv(4096) == b""  # its exit closes it
        assert proc.wait(TIMEOUT_S) == 0
    finally:
        server.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert rank_status.read_status(rank_status.status_path(str(tmp_path), 0)).mpi == pmi_relay.MPI_NOT_FINALIZED


def test_task_records_a_command_that_never_used_mpi(tmp_path):
    got, r = run_task_with_pmi(tmp_path, "print('no MPI here')")
    assert r.returncode == 0 and r.stdout == "no MPI here\n" and got == b""
    assert rank_status.read_status(rank_status.status_path(str(tmp_path), 0)).mpi == pmi_relay.MPI_UNUSED


def test_task_without_a_pmi_connection_records_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in placement.RANK_ENV_VARS and k != pmi_relay.PMI_FD_ENV}
    env["PMI_RANK"] = "0"
    r = subprocess.run([sys.executable, task.__file__, "--status-dir", str(tmp_path), "--", "true"],
                       env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert rank_status.read_status(rank_status.status_path(str(tmp_path), 0)).mpi is None


# ---------------------------------------------------------------- whole jobs under a launcher that notices nothing

# Starts task.py for 2 ranks, each with a PMI connection it never reads or answers, and waits for
# them; SIGTERM is passed on to the wrappers.  Unlike hydra it never ends a job by itself.
FAKE_LAUNCHER = """
import os, signal, socket, subprocess, sys
task_py, status_dir, program = sys.argv[1], sys.argv[2], sys.argv[3:]
servers, procs = [], []
for rank in range(2):
    server, client = socket.socketpair()
    env = dict(os.environ, PMI_RANK=str(rank), PMI_FD=str(client.fileno()))
    procs.append(subprocess.Popen([sys.executable, task_py, "--status-dir", status_dir, "--", *program],
                                  env=env, pass_fds=[client.fileno()]))
    client.close()
    servers.append(server)
signal.signal(signal.SIGTERM, lambda *_: [p.send_signal(signal.SIGTERM) for p in procs])
sys.exit(max(p.wait() for p in procs))
"""


def run_fake_job(tmp_path, source):
    """launch.run_job on FAKE_LAUNCHER running ``source`` on both ranks: (code, seconds)."""
    status_dir = tmp_path / "status"
    status_dir.mkdir()
    prelude = "import os, sys, time\nRANK = int(os.environ['PMI_RANK'])\nFD = int(os.environ['PMI_FD'])\n"
    argv = [sys.executable, "-c", FAKE_LAUNCHER, launch.TASK_PY, str(status_dir),
            sys.executable, "-c", prelude + textwrap.dedent(source)]
    start = time.monotonic()
    code = launch.run_job(argv, str(status_dir), 2, None)
    return code, time.monotonic() - start


def test_mlslrun_stops_a_job_whose_launcher_lets_it_run(tmp_path, capfd):
    code, seconds = run_fake_job(tmp_path, """
        os.write(FD, b"cmd=init pmi_version=1 pmi_subversion=1\\n")  # MPI started
        if RANK == 1:
            time.sleep(0.5)
            os._exit(0)
        time.sleep(600)
    """)
    err = capfd.readouterr().err
    assert code == launch.EXIT_FAILURE, err
    assert seconds < 60, f"the job took {seconds:.0f} s"
    blamed = [line for line in err.splitlines() if line.startswith("mlslrun: ")]
    assert any("without finalizing MPI while rank 0 still ran, and the launcher has not ended the job" in line
               for line in blamed), err
    assert re.fullmatch(r"mlslrun: job failed: rank 1 \(host .*exited with code 0 while rank 0 still ran: it left "
                        r"without finalizing MPI .*; then mlslrun stopped the job", blamed[-1]), err


def test_mlslrun_lets_a_rank_that_finalized_leave_first(tmp_path, capfd):
    code, seconds = run_fake_job(tmp_path, f"""
        os.write(FD, b"cmd=init pmi_version=1 pmi_subversion=1\\n")
        if RANK == 1:
            os.write(FD, b"cmd=finalize\\n")
            os._exit(0)
        time.sleep({launch.LEAVER_GRACE_S + 2})
    """)
    err = capfd.readouterr().err
    assert code == 0, err
    assert seconds >= launch.LEAVER_GRACE_S + 2
    assert "mlslrun: " not in err, err
