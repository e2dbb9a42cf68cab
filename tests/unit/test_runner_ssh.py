"""mlslrun's ssh flags, each MPI's argv for them, the ssh wrapper and the ssh check (a stand-in ssh; no root).

The check runs against a stand-in `ssh` placed first on PATH: no sshd, no network, no root.
"""

import os
import shlex
import socket
import subprocess
import sys
import textwrap

import pytest

from mlsl_tf.runner import installed, launch, ssh, ssh_check
from mlsl_tf.runner.argv import build_parser, parse_args
from mlsl_tf.runner.config import UsageError
from mlsl_tf.runner.launchers import build_launch_argv, make_plan, needs_ssh_exec, rank_command

PY = "/venv/bin/python"
TASK = "/pkg/mlsl_tf/runner/task.py"
KEY = "/keys/id_ed25519"


def plan_for(args, program="mpiexec", ssh_exec=None):
    cfg = parse_args(args)
    return make_plan(cfg, program, cfg.hosts, {}, rank_command(PY, TASK, cfg, "/tmp/st"), ssh_exec)


RANK = [PY, TASK, "--num-proc", "2", "--status-dir", "/tmp/st", "--tag-output", "--", "python", "t.py"]


# ---------------------------------------------------------------- command line

def test_ssh_flags_parse_in_both_spellings():
    for args in (["-p", "2222", "-i", KEY], ["--ssh-port", "2222", "--ssh-identity-file", KEY],
                 ["--ssh-port=2222", f"--ssh-identity-file={KEY}"]):
        cfg = parse_args(["-np", "2", "-H", "a:1,b:1", *args, "python", "t.py"])
        assert (cfg.ssh_port, cfg.ssh_identity_file, cfg.ssh_check) == (2222, KEY, True)
        assert cfg.command == ("python", "t.py")
    cfg = parse_args(["-np", "2", "python", "-p", "1", "-i", "x"])  # after the command: the command's
    assert cfg.ssh_port is None and cfg.ssh_identity_file is None and cfg.command == ("python", "-p", "1", "-i", "x")
    assert not parse_args(["-np", "2", "--no-ssh-check", "python"]).ssh_check


@pytest.mark.parametrize("args,message", [
    (["--ssh-port", "0"], "--ssh-port must be a TCP port, 1 to 65535, got 0"),
    (["--ssh-port", "65536"], "got 65536"),
    (["--ssh-port", "ssh"], "--ssh-port: invalid int value: 'ssh'"),
    (["--ssh-identity-file", ""], "--ssh-identity-file needs a file name"),
])
def test_bad_ssh_flags_are_usage_errors(args, message):
    with pytest.raises(UsageError) as e:
        parse_args(["-np", "2", *args, "python"])
    assert message in str(e.value)


def test_help_lists_the_ssh_flags():
    text = build_parser().format_help()
    for flag in ("--ssh-port", "--ssh-identity-file", "--no-ssh-check"):
        assert flag in text


# ---------------------------------------------------------------- launcher argv

def test_mpich_gets_the_wrapper_as_its_ssh():
    args = ["-np", "2", "-H", "a:1,b:1", "-p", "2222", "-i", KEY, "python", "t.py"]
    assert needs_ssh_exec("mpich", parse_args(args))
    argv = build_launch_argv("mpich", plan_for(args, ssh_exec="/tmp/st/ssh"))
    assert argv == ["mpiexec", "-hosts", "a:1,b:1", "-launcher", "ssh", "-launcher-exec", "/tmp/st/ssh",
                    "-n", "2", *RANK]
    with pytest.raises(ValueError, match="ssh wrapper"):
        build_launch_argv("mpich", plan_for(args))


def test_without_ssh_flags_the_launchers_use_their_own_ssh():
    args = ["-np", "2", "-H", "a:1,b:1", "python", "t.py"]
    assert not needs_ssh_exec("mpich", parse_args(args))
    assert build_launch_argv("mpich", plan_for(args)) == ["mpiexec", "-hosts", "a:1,b:1", "-n", "2", *RANK]
    for flavour, program in (("openmpi", "mpirun"), ("intel", "mpiexec.hydra")):
        argv = build_launch_argv(flavour, plan_for(args, program=program))
        assert not {"plm_rsh_args", "-bootstrap-exec-args", "-launcher-exec"} & set(argv)


def test_open_mpi_gets_plm_rsh_args():
    args = ["-np", "2", "-H", "a:1,b:1", "--ssh-port", "2222", "--ssh-identity-file", KEY, "python", "t.py"]
    assert not needs_ssh_exec("openmpi", parse_args(args))
    argv = build_launch_argv("openmpi", plan_for(args, program="mpirun"))
    i = argv.index("plm_rsh_args")
    assert argv[i - 1:i + 2] == ["--mca", "plm_rsh_args", f"-o BatchMode=yes -p 2222 -i {KEY}"]
    assert argv[-len(RANK):] == RANK
    port_only = build_launch_argv("openmpi", plan_for(["-np", "2", "-p", "2200", "python", "t.py"], program="mpirun"))
    assert "-o BatchMode=yes -p 2200" in port_only


def test_intel_gets_bootstrap_exec_args():
    args = ["-np", "2", "-H", "a:1,b:1", "-i", KEY, "python", "t.py"]
    argv = build_launch_argv("intel", plan_for(args, program="mpiexec.hydra"))
    assert argv[:5] == ["mpiexec.hydra", "-bootstrap", "ssh", "-bootstrap-exec-args", f"-o BatchMode=yes -i {KEY}"]


def test_a_key_name_with_a_blank_cannot_pass_through_split_options():
    args = ["-np", "2", "-H", "a:1,b:1", "-i", "/my keys/id", "python", "t.py"]
    with pytest.raises(UsageError, match="'/my keys/id': Open MPI's plm_rsh_args splits its value at blanks"):
        build_launch_argv("openmpi", plan_for(args, program="mpirun"))
    with pytest.raises(UsageError, match="Intel MPI's -bootstrap-exec-args"):
        build_launch_argv("intel", plan_for(args, program="mpiexec.hydra"))
    assert "-launcher-exec" in build_launch_argv("mpich", plan_for(args, ssh_exec="/w"))  # the wrapper quotes it


def test_srun_refuses_ssh_flags():
    with pytest.raises(UsageError, match="srun starts the ranks without ssh"):
        build_launch_argv("slurm", plan_for(["-np", "2", "-p", "2222", "python"], program="srun"))


# ---------------------------------------------------------------- a stand-in ssh

FAKE_SSH = textwrap.dedent("""\
    #!{python}
    # Stand-in ssh: records its arguments, then acts by host name (the word before the command).
    import os, sys, time
    with open(os.environ["FAKE_SSH_LOG"], "a") as f:
        f.write(repr(sys.argv[1:]) + "\\n")
    host = sys.argv[-2] if len(sys.argv) > 2 else ""
    port = sys.argv[sys.argv.index("-p") + 1] if "-p" in sys.argv else "22"
    if host.startswith("down"):
        sys.stderr.write(f"ssh: connect to host {{host}} port {{port}}: No route to host\\n"); sys.exit(255)
    if host.startswith("nokey"):
        sys.stderr.write(f"Warning: Permanently added '{{host}}' (ED25519) to the list of known hosts.\\n"
                         f"root@{{host}}: Permission denied (publickey).\\n"); sys.exit(255)
    if host.startswith("hang"):
        time.sleep(30)
    if host.startswith("nopython"):
        sys.exit({no_python})
    sys.exit(0)
""")


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """A stand-in `ssh` first on PATH; returns a function giving the argv lists it was called with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ssh"
    script.write_text(FAKE_SSH.format(python=sys.executable, no_python=ssh.NO_PYTHON_EXIT))
    script.chmod(0o755)
    log = tmp_path / "ssh.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return lambda: [eval(line) for line in log.read_text().splitlines()]  # noqa: S307 - our own repr()s


def test_the_wrapper_passes_options_and_the_launchers_arguments_intact(tmp_path, fake_ssh):
    key = str(tmp_path / "it's a key")
    wrapper = ssh_check.write_launcher_exec(str(tmp_path), ssh.SshOptions(port=2222, identity_file=key))
    assert os.stat(wrapper).st_mode & 0o777 == 0o700
    subprocess.run([wrapper, "-x", "node7", "/path/hydra_pmi_proxy --control-port 'h0:1234'"], check=True,
                   timeout=30)
    assert fake_ssh() == [["-o", "BatchMode=yes", "-p", "2222", "-i", key, "-x", "node7",
                           "/path/hydra_pmi_proxy --control-port 'h0:1234'"]]


def test_the_check_command_runs_the_remote_tests(tmp_path):
    argv = ssh.check_argv("node1", ssh.SshOptions(port=2222, identity_file=KEY), "/e nv/python", TASK)
    assert argv[:-1] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "-i", KEY, "node1"]
    python, task_py = tmp_path / "python", tmp_path / "task.py"
    remote = ssh.check_argv("n", ssh.SshOptions(), str(python), str(task_py))[-1]

    def remote_exit():  # what the remote shell does with it
        return subprocess.run(["sh", "-c", remote], timeout=30).returncode

    assert remote_exit() == ssh.NO_PYTHON_EXIT
    python.write_text("#!/bin/sh\n")
    assert remote_exit() == ssh.NO_PYTHON_EXIT  # there but not executable
    python.chmod(0o755)
    assert remote_exit() == ssh.NO_TASK_EXIT
    task_py.write_text("")
    assert remote_exit() == 0


def test_check_hosts_lists_every_failing_host_in_order(fake_ssh):
    opts = ssh.SshOptions(port=2222, identity_file=KEY)
    failures = ssh_check.check_hosts(["ok1", "down1", "nokey1", "ok2", "nopython1", "hang1"], opts, PY, TASK,
                                     timeout_s=3)
    assert failures == [
        "down1: unreachable by ssh on port 2222 (ssh: connect to host down1 port 2222: No route to host)",
        f"nokey1: ssh login refused (root@nokey1: Permission denied (publickey).); is the public key of {KEY} "
        "(--ssh-identity-file) in that host's authorized_keys?",
        f"nopython1: the ranks' interpreter {PY} is missing or not executable there (install the same "
        "environment at the same path on every host)",
        "hang1: no answer within 3 s (ssh connection or login hangs)",
    ]
    calls = fake_ssh()
    assert sorted(c[-2] for c in calls) == ["down1", "hang1", "nokey1", "nopython1", "ok1", "ok2"]
    assert all(c[:9] == ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "-i", KEY, c[-2]]
               for c in calls)


def test_mlslrun_stops_before_launching_and_names_the_hosts(capsys, fake_ssh):
    if installed.find_mpiexec() is None:
        pytest.fail("no mpiexec next to this Python or on PATH: mlslrun's tests need one")
    code = launch.main(["-np", "3", "-H", "localhost:1,down-a:1,nokey-b:1", "-p", "2222", "python", "t.py"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [
        "mlslrun: error: ssh check failed for 2 of 2 remote hosts; no rank was started:",
        "  down-a: unreachable by ssh on port 2222 (ssh: connect to host down-a port 2222: No route to host)",
        "  nokey-b: ssh login refused (root@nokey-b: Permission denied (publickey).); is the public key of "
        "ssh's default keys (--ssh-identity-file) in that host's authorized_keys?"]
    assert sorted(c[-2] for c in fake_ssh()) == ["down-a", "nokey-b"]  # localhost is not ssh'd to


def test_missing_identity_file_is_a_usage_error(capsys, tmp_path):
    code = launch.main(["-np", "2", "-H", "a:1,b:1", "-i", str(tmp_path / "nope"), "python"])
    assert code == 2 and f"--ssh-identity-file {tmp_path / 'nope'}: no such file" in capsys.readouterr().err
    with pytest.raises(UsageError, match="not a file"):
        ssh_check.check_identity_file(ssh.SshOptions(identity_file=str(tmp_path)))
    (tmp_path / "key").write_text("k")
    ssh_check.check_identity_file(ssh.SshOptions(identity_file=str(tmp_path / "key")))


# ---------------------------------------------------------------- verdicts and locality

@pytest.mark.parametrize("code,output,expected", [
    (0, "", None),
    (255, "ssh: connect to host n1 port 22: Connection refused\n",
     "n1: unreachable by ssh on ssh's port (22 unless ssh_config says otherwise) "
     "(ssh: connect to host n1 port 22: Connection refused)"),
    (255, "ssh: connect to host n1 port 22: Connection timed out\n", "n1: unreachable by ssh on"),
    (255, "ssh: Could not resolve hostname n1: Name or service not known\n",
     "n1: unknown host name (ssh: Could not resolve hostname n1: Name or service not known)"),
    (255, "@@@@\nHost key verification failed.\n",
     "n1: its ssh host key is unknown or changed (Host key verification failed.); add the right key to "
     "known_hosts (ssh-keyscan)"),
    (255, "kex_exchange_identification: banner line contains invalid characters\n",
     "n1: ssh failed (kex_exchange_identification: banner line contains invalid characters)"),
    (127, "bash: line 1: test: command not found\n",
     "n1: the check's remote command failed with exit code 127: bash: line 1: test: command not found"),
    (ssh.NO_TASK_EXIT, "", f"n1: mlslrun's rank wrapper {TASK} is missing there"),
])
def test_describe_failure(code, output, expected):
    got = ssh.describe_failure("n1", code, output, ssh.SshOptions(), PY, TASK)
    assert got == expected if expected is None else got.startswith(expected), got


def test_failure_report_counts_hosts():
    assert ssh.failure_report(["a: x"], 1) == "ssh check failed for 1 of 1 remote host; no rank was started:\n  a: x"
    assert ssh.failure_report(["a: x", "b: y"], 5).splitlines() == [
        "ssh check failed for 2 of 5 remote hosts; no rank was started:", "  a: x", "  b: y"]


def test_is_local():
    for host in ("localhost", socket.gethostname(), "127.0.0.1"):
        assert ssh_check.is_local(host), host
    for host in ("192.0.2.1", "no-such-host.invalid"):  # TEST-NET-1 is never a local address
        assert not ssh_check.is_local(host), host
    assert ssh_check.remote_hosts(["localhost", "192.0.2.1", "127.0.0.1"]) == ["192.0.2.1"]


def test_launcher_exec_script_quotes_every_word():
    text = ssh.launcher_exec_script(ssh.SshOptions(port=22, identity_file="/a b/$k"))
    assert text.splitlines()[-1] == "exec ssh -o BatchMode=yes -p 22 -i " + shlex.quote("/a b/$k") + ' "$@"'
