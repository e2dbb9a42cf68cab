import os
"""mlslrun's pure half: command-line parsing and launcher argv building (no MPI)."""

import pytest

from mlsl_tf.runner import argv as A
from mlsl_tf.runner.argv import HostSlots, UsageError

PY = "/venv/bin/python"
TASK = "/pkg/mlsl_tf/runner/task.py"


def plan_for(args, *, program="mpiexec", environ=None, status_dir="/tmp/st", hosts=None):
    """Parse ``args`` and build a LaunchPlan as launch.py does (hosts: hostfile result)."""
    cfg = A.parse_args(args)
    rank_cmd = A.rank_command(PY, TASK, cfg, status_dir)
    return A.make_plan(cfg, program, hosts if hosts is not None else cfg.hosts,
                       environ or {}, rank_cmd)


def rank_cmd(*user, np=2, status_dir="/tmp/st", extra=()):
    return [PY, TASK, "--num-proc", str(np), *extra, "--status-dir", status_dir, "--", *user]


# ---------------------------------------------------------------- parse_args


def test_minimal_command_line():
    cfg = A.parse_args(["-np", "4", "python", "train.py", "--lr", "0.1"])
    assert cfg.num_proc == 4
    assert cfg.command == ("python", "train.py", "--lr", "0.1")
    assert cfg.hosts is None and cfg.hostfile is None
    assert cfg.env == () and cfg.mpi_args == () and cfg.flag_env == ()
    assert not cfg.verbose and cfg.output_filename is None and cfg.start_timeout is None
    assert cfg.launcher == "auto"


def test_long_num_proc_and_double_dash():
    cfg = A.parse_args(["--num-proc", "2", "--", "python", "-u", "x.py"])
    assert cfg.num_proc == 2 and cfg.command == ("python", "-u", "x.py")


def test_flags_after_the_command_belong_to_the_command():
    cfg = A.parse_args(["-np", "2", "python", "t.py", "-x", "1", "--verbose", "-np", "9"])
    assert cfg.num_proc == 2 and cfg.env == () and not cfg.verbose
    assert cfg.command == ("python", "t.py", "-x", "1", "--verbose", "-np", "9")


def test_all_flags():
    cfg = A.parse_args(["-np", "2", "-H", "a:1,b:1", "-x", "FOO", "-x", "BAR=1=2",
                        "--verbose", "--output-filename", "out", "--start-timeout", "2.5",
                        "--launcher", "mpi", "--mpi-args", "-l --foo 'a b'",
                        "python", "t.py"])
    assert cfg.hosts == (HostSlots("a", 1), HostSlots("b", 1))
    assert cfg.env == (A.EnvSpec("FOO", None), A.EnvSpec("BAR", "1=2"))
    assert cfg.verbose and cfg.output_filename == "out" and cfg.start_timeout == 2.5
    assert cfg.launcher == "mpi"
    assert cfg.mpi_args == ("-l", "--foo", "a b")


def test_mpi_args_equals_form():
    cfg = A.parse_args(["-np", "1", "--mpi-args=-bind-to core", "python"])
    assert cfg.mpi_args == ("-bind-to", "core")


def test_mpi_args_bad_quoting():
    with pytest.raises(UsageError, match="--mpi-args"):
        A.parse_args(["-np", "1", "--mpi-args", "'unclosed", "python"])


def test_unknown_flag():
    with pytest.raises(UsageError, match="--bogus"):
        A.parse_args(["-np", "2", "--bogus", "python", "t.py"])


def test_abbreviations_are_not_accepted():
    with pytest.raises(UsageError, match="--verb"):
        A.parse_args(["-np", "2", "--verb", "python"])


def test_missing_command():
    with pytest.raises(UsageError, match="missing the command"):
        A.parse_args(["-np", "2"])
    with pytest.raises(UsageError, match="missing the command"):
        A.parse_args(["-np", "2", "--"])


def test_missing_np():
    with pytest.raises(UsageError, match="-np N is required"):
        A.parse_args(["python", "t.py"])


@pytest.mark.parametrize("value", ["0", "-1"])
def test_np_must_be_positive(value):
    with pytest.raises(UsageError, match="-np must be at least 1"):
        A.parse_args(["-np", value, "python"])


def test_np_not_a_number():
    with pytest.raises(UsageError, match="-np"):
        A.parse_args(["-np", "two", "python"])


@pytest.mark.parametrize("value", ["0", "-3"])
def test_start_timeout_must_be_positive(value):
    with pytest.raises(UsageError, match="--start-timeout must be > 0"):
        A.parse_args(["-np", "1", "--start-timeout", value, "python"])


def test_bad_launcher_choice():
    with pytest.raises(UsageError, match="--launcher"):
        A.parse_args(["-np", "1", "--launcher", "ssh", "python"])


def test_hosts_and_hostfile_are_exclusive():
    with pytest.raises(UsageError, match="not allowed with"):
        A.parse_args(["-np", "1", "-H", "a:1", "--hostfile", "f", "python"])


def test_check_build_and_help_need_nothing_else():
    assert A.parse_args(["--check-build"]).check_build
    assert A.parse_args(["-cb"]).check_build
    assert A.parse_args(["-h"]).show_help
    assert A.parse_args(["--help"]).show_help


def test_help_text_lists_the_flags():
    text = A.build_parser().format_help()
    for flag in ["-np", "-H", "--hostfile", "-x", "--verbose", "--output-filename",
                 "--start-timeout", "--launcher", "--check-build", "--mpi-args"]:
        assert flag in text


def test_env_flags_name_declared_settings():
    import re
    settings = open(os.path.join(os.path.dirname(__file__), "..", "..", "ops", "core", "settings.cc")).read()
    declared = set(re.findall(r'"(MLSL_TF_[A-Z_]+)"', settings))
    assert {f.env_var for f in A.ENV_FLAGS} <= declared


# ---------------------------------------------------------------- hosts


def test_parse_hosts():
    assert A.parse_hosts("a:2,b:3") == (HostSlots("a", 2), HostSlots("b", 3))
    assert A.parse_hosts("node-1.example.com") == (HostSlots("node-1.example.com", 1),)


@pytest.mark.parametrize("text,problem", [
    ("a:2,,b:2", "empty host entry"),
    ("a:x", "slots for host 'a' must be an integer, got 'x'"),
    ("a:0", "slots for host 'a' must be >= 1, got 0"),
    ("a:-2", "must be >= 1"),
    ("a:2:3", "must be an integer, got '2:3'"),
    (":2", "bad host name ''"),
    ("a b:2", "bad host name 'a b'"),
    ("a:1,a:2", "host 'a' is listed more than once"),
])
def test_parse_hosts_errors(text, problem):
    with pytest.raises(UsageError) as e:
        A.parse_hosts(text)
    assert problem in str(e.value) and text in str(e.value)


def test_parse_hostfile_formats():
    text = "# cluster\n\nnode1 slots=4\nnode2:2   # comment\n  node3\n"
    assert A.parse_hostfile(text) == (HostSlots("node1", 4), HostSlots("node2", 2),
                                      HostSlots("node3", 1))


@pytest.mark.parametrize("text,problem", [
    ("a slots=4\nb slots=x\n",
     "hosts.txt line 2 ('b slots=x'): slots for host 'b' must be an integer"),
    ("a slots=0\n", "line 1 ('a slots=0'): slots for host 'a' must be >= 1"),
    ("a max_slots=4\n", "line 1 ('a max_slots=4'): expected 'host slots=N' or 'host:N'"),
    ("a slots=2 extra\n", "expected 'host slots=N'"),
    ("a:q\n", "must be an integer, got 'q'"),
    ("# nothing\n\n", "hosts.txt: no hosts found"),
    ("a slots=1\na:2\n", "host 'a' is listed more than once"),
])
def test_parse_hostfile_errors(text, problem):
    with pytest.raises(UsageError) as e:
        A.parse_hostfile(text, source="hosts.txt")
    assert problem in str(e.value)


def test_np_more_than_slots_is_an_error():
    with pytest.raises(UsageError, match=r"-np 5 is more than the 4 slots given by -H \(a:2,b:2\)"):
        A.parse_args(["-np", "5", "-H", "a:2,b:2", "python"])


def test_np_more_than_hostfile_slots_is_an_error():
    cfg = A.parse_args(["-np", "3", "--hostfile", "hosts.txt", "python"])
    hosts = A.parse_hostfile("a slots=1\nb slots=1\n")
    with pytest.raises(UsageError, match="-np 3 is more than the 2 slots given by --hostfile"):
        A.make_plan(cfg, "mpiexec", hosts, {}, ["cmd"])


def test_allocate_fills_hosts_in_order():
    hosts = (HostSlots("a", 2), HostSlots("b", 2), HostSlots("c", 2))
    assert A.allocate(3, hosts) == (HostSlots("a", 2), HostSlots("b", 1))
    assert A.allocate(6, hosts) == hosts
    assert A.allocate(1, hosts) == (HostSlots("a", 1),)


# ---------------------------------------------------------------- environment


def test_env_spec_forms():
    assert A.parse_env_spec("FOO") == A.EnvSpec("FOO", None)
    assert A.parse_env_spec("FOO=bar") == A.EnvSpec("FOO", "bar")
    assert A.parse_env_spec("FOO=") == A.EnvSpec("FOO", "")
    assert A.parse_env_spec("A_1=x=y") == A.EnvSpec("A_1", "x=y")


@pytest.mark.parametrize("text", ["", "=x", "1FOO=x", "FO-O", "A B=1"])
def test_env_spec_errors(text):
    with pytest.raises(UsageError, match="not a valid environment variable name"):
        A.parse_env_spec(text)


def test_resolve_env_passes_through_and_skips_unset():
    cfg = A.parse_args(["-np", "1", "-x", "HOME", "-x", "UNSET", "-x", "FOO=bar",
                        "-x", "HOME=/override", "--start-timeout", "30", "python"])
    environ = {"HOME": "/home/me"}
    assert A.resolve_env(cfg, environ) == (("HOME", "/override"), ("FOO", "bar"),
                                           ("MLSL_TF_START_TIMEOUT", "30"))
    assert A.missing_env(cfg, environ) == ("UNSET",)


def test_format_seconds():
    assert A.format_seconds(30.0) == "30"
    assert A.format_seconds(2.5) == "2.5"


# ---------------------------------------------------------------- flavours


@pytest.mark.parametrize("text,flavour", [
    ("HYDRA build details:\n    Version:   5.0.2\n", "mpich"),
    ("mpiexec (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
     "openmpi"),
    ("mpirun (OpenRTE) 1.10.7\n", "openmpi"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.9 Build 20230307\n"
     "Copyright 2003-2023, Intel Corporation.\nHYDRA build details:\n", "intel"),
])
def test_detect_flavour(text, flavour):
    assert A.detect_flavour(text) == flavour


def test_detect_flavour_unknown():
    with pytest.raises(ValueError, match="cannot tell which MPI.*'mystery mpi 1.0'"):
        A.detect_flavour("mystery mpi 1.0\nmore\n")
    with pytest.raises(ValueError, match="no output"):
        A.detect_flavour("")


@pytest.mark.parametrize("requested,in_job,have,expected", [
    ("auto", False, True, "mpi"),
    ("auto", True, False, "mpi"),
    ("auto", True, True, "srun"),
    ("mpi", True, True, "mpi"),
    ("srun", False, False, "srun"),
])
def test_choose_launcher(requested, in_job, have, expected):
    assert A.choose_launcher(requested, in_job, have) == expected


def test_program_names():
    assert [A.program_name(f) for f in ("mpich", "openmpi", "intel", "slurm")] == \
        ["mpiexec", "mpirun", "mpiexec.hydra", "srun"]


def test_unknown_flavour():
    with pytest.raises(ValueError, match="unknown MPI flavour 'lam'"):
        A.build_launch_argv("lam", plan_for(["-np", "1", "python"]))


# ---------------------------------------------------------------- rank command


def test_rank_command_wraps_the_user_command():
    cfg = A.parse_args(["-np", "12", "--output-filename", "/abs/out", "python", "t.py"])
    assert A.rank_command(PY, TASK, cfg, "/tmp/st") == (
        PY, TASK, "--num-proc", "12", "--output-filename", "/abs/out",
        "--status-dir", "/tmp/st", "--", "python", "t.py")
    assert A.rank_command(PY, TASK, cfg, None) == (
        PY, TASK, "--num-proc", "12", "--output-filename", "/abs/out", "--", "python", "t.py")


# ---------------------------------------------------------------- MPICH hydra


def test_mpich_local_run_passes_no_hosts():
    argv = A.build_launch_argv("mpich", plan_for(["-np", "2", "python", "t.py"]))
    assert argv == ["mpiexec", "-n", "2", *rank_cmd("python", "t.py")]


def test_mpich_hosts_env_and_mpi_args():
    plan = plan_for(["-np", "3", "-H", "a:2,b:2", "-x", "FOO=bar", "-x", "HOME",
                     "--start-timeout", "5", "--mpi-args", "-iface eth0", "python", "t.py"],
                    environ={"HOME": "/h"})
    assert A.build_launch_argv("mpich", plan) == [
        "mpiexec", "-hosts", "a:2,b:1",
        "-genv", "FOO", "bar", "-genv", "HOME", "/h", "-genv", "MLSL_TF_START_TIMEOUT", "5",
        "-iface", "eth0", "-n", "3", *rank_cmd("python", "t.py", np=3)]


def test_mpich_hostfile():
    hosts = A.parse_hostfile("a slots=1\nb slots=1\n")
    plan = plan_for(["-np", "2", "--hostfile", "hf", "python"], hosts=hosts)
    assert A.build_launch_argv("mpich", plan)[:3] == ["mpiexec", "-hosts", "a:1,b:1"]


def test_output_filename_goes_to_the_rank_wrapper():
    plan = plan_for(["-np", "2", "--output-filename", "/o", "python"])
    argv = A.build_launch_argv("mpich", plan)
    assert argv == ["mpiexec", "-n", "2",
                    *rank_cmd("python", extra=("--output-filename", "/o"))]


def test_verbose_does_not_change_the_argv():
    quiet = A.build_launch_argv("mpich", plan_for(["-np", "2", "python"]))
    loud = A.build_launch_argv("mpich", plan_for(["-np", "2", "--verbose", "python"]))
    assert quiet == loud


# ---------------------------------------------------------------- Open MPI


def test_openmpi_local():
    argv = A.build_launch_argv("openmpi", plan_for(["-np", "2", "python"], program="mpirun"))
    assert argv == ["mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "none", "--map-by", "slot",
                    *rank_cmd("python")]


def test_openmpi_hosts_env_and_mpi_args():
    plan = plan_for(["-np", "4", "-H", "a:2,b:2", "-x", "FOO=a b", "-x", "PATH",
                     "--mpi-args", "--oversubscribe", "python"],
                    program="mpirun", environ={"PATH": "/bin"})
    assert A.build_launch_argv("openmpi", plan) == [
        "mpirun", "--allow-run-as-root", "-np", "4", "-H", "a:2,b:2", "--bind-to", "none", "--map-by", "slot",
        "-x", "FOO=a b", "-x", "PATH=/bin", "--oversubscribe", *rank_cmd("python", np=4)]


# ---------------------------------------------------------------- Intel MPI


def test_intel_local():
    plan = plan_for(["-np", "2", "-x", "A=1", "python"], program="mpiexec.hydra")
    assert A.build_launch_argv("intel", plan) == [
        "mpiexec.hydra", "-genv", "A", "1", "-n", "2", *rank_cmd("python")]


def test_intel_equal_slots_use_ppn():
    plan = plan_for(["-np", "4", "-H", "a:2,b:2", "python"], program="mpiexec.hydra")
    assert A.build_launch_argv("intel", plan) == [
        "mpiexec.hydra", "-n", "4", "-hosts", "a,b", "-ppn", "2", *rank_cmd("python", np=4)]


def test_intel_unequal_slots_use_mpmd():
    plan = plan_for(["-np", "3", "-H", "a:2,b:2", "--mpi-args", "-l", "python"],
                    program="mpiexec.hydra")
    cmd = rank_cmd("python", np=3)
    assert A.build_launch_argv("intel", plan) == [
        "mpiexec.hydra", "-l", "-n", "2", "-host", "a", *cmd, ":", "-n", "1", "-host", "b", *cmd]


# ---------------------------------------------------------------- SLURM srun


def test_srun_inside_allocation():
    argv = A.build_launch_argv("slurm", plan_for(["-np", "8", "python"], program="srun"))
    assert argv == ["srun", "--ntasks=8", "--kill-on-bad-exit=1", *rank_cmd("python", np=8)]


def test_srun_hosts_env_and_mpi_args():
    plan = plan_for(["-np", "4", "-H", "a:2,b:2", "-x", "FOO=bar", "--start-timeout", "9",
                     "--mpi-args", "--mpi=pmi2", "python"], program="srun")
    assert A.build_launch_argv("slurm", plan) == [
        "srun", "--ntasks=4", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=2",
        "--nodelist=a,b", "--export=ALL,FOO=bar,MLSL_TF_START_TIMEOUT=9", "--mpi=pmi2",
        *rank_cmd("python", np=4)]


def test_srun_rejects_unequal_hosts():
    plan = plan_for(["-np", "3", "-H", "a:2,b:1", "python"], program="srun")
    with pytest.raises(UsageError, match="same number of ranks on every host.*a:2,b:1"):
        A.build_launch_argv("slurm", plan)


def test_srun_rejects_comma_in_env_value():
    plan = plan_for(["-np", "1", "-x", "LIST=a,b", "python"], program="srun")
    with pytest.raises(UsageError, match="-x LIST: srun --export cannot carry"):
        A.build_launch_argv("slurm", plan)


def test_no_shell_strings():
    """Every argv element is one word as given, never a joined shell command."""
    plan = plan_for(["-np", "2", "python", "-c", "print('a b; c')"])
    for flavour in ("mpich", "openmpi", "intel", "slurm"):
        argv = A.build_launch_argv(flavour, plan)
        assert argv[-1] == "print('a b; c')" and all(isinstance(a, str) for a in argv)


def test_scheduler_flags_become_rank_environment():
    cfg = A.parse_args(["-np", "2", "--fusion-threshold-mb", "2", "--chunk-mb", "0.5", "--priority", "fifo",
                        "--comm-core", "0,1", "--timeline-filename", "/tmp/t.json", "--inflight", "3",
                        "python", "x.py"])
    env = dict(cfg.flag_env)
    assert env == {"MLSL_TF_FUSION_THRESHOLD": str(2 << 20), "MLSL_TF_CHUNK_BYTES": str(1 << 19),
                   "MLSL_TF_PRIORITY": "fifo", "MLSL_TF_COMM_CORE": "0,1", "MLSL_TF_TIMELINE": "/tmp/t.json",
                   "MLSL_TF_INFLIGHT": "3"}


@pytest.mark.parametrize("flag,value", [("--priority", "lifo"), ("--comm-core", "a"), ("--chunk-mb", "-1"), ("--chunk-mb", "0"),
                                        ("--inflight", "0")])
def test_scheduler_flags_reject_bad_values(flag, value):
    with pytest.raises(ValueError):
        A.parse_args(["-np", "2", flag, value, "python", "x.py"])
