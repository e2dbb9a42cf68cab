"""mlslrun's launchers: flavour detection, the rank command and each MPI's argv (no MPI)."""

import pytest

from mlsl_tf.runner.argv import parse_args
from mlsl_tf.runner.config import UsageError
from mlsl_tf.runner.hosts import parse_hostfile
from mlsl_tf.runner.launchers import (build_launch_argv, choose_launcher, detect_flavour, make_plan,
                                      program_name, rank_command)

PY = "/venv/bin/python"
TASK = "/pkg/mlsl_tf/runner/task.py"


def plan_for(args, *, program="mpiexec", environ=None, status_dir="/tmp/st", hosts=None):
    """Parse ``args`` and build a LaunchPlan as launch.py does (hosts: hostfile result)."""
    cfg = parse_args(args)
    rank_cmd = rank_command(PY, TASK, cfg, status_dir)
    return make_plan(cfg, program, hosts if hosts is not None else cfg.hosts,
                     environ or {}, rank_cmd)


def rank_cmd(*user, np=2, status_dir="/tmp/st", extra=()):
    return [PY, TASK, "--num-proc", str(np), *extra, "--status-dir", status_dir, "--tag-output", "--", *user]


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
    assert detect_flavour(text) == flavour


def test_detect_flavour_unknown():
    with pytest.raises(ValueError, match="cannot tell which MPI.*'mystery mpi 1.0'"):
        detect_flavour("mystery mpi 1.0\nmore\n")
    with pytest.raises(ValueError, match="no output"):
        detect_flavour("")


@pytest.mark.parametrize("requested,in_job,have,expected", [
    ("auto", False, True, "mpi"),
    ("auto", True, False, "mpi"),
    ("auto", True, True, "srun"),
    ("mpi", True, True, "mpi"),
    ("srun", False, False, "srun"),
])
def test_choose_launcher(requested, in_job, have, expected):
    assert choose_launcher(requested, in_job, have) == expected


def test_program_names():
    assert [program_name(f) for f in ("mpich", "openmpi", "intel", "slurm")] == \
        ["mpiexec", "mpirun", "mpiexec.hydra", "srun"]


def test_unknown_flavour():
    with pytest.raises(ValueError, match="unknown MPI flavour 'lam'"):
        build_launch_argv("lam", plan_for(["-np", "1", "python"]))


# ---------------------------------------------------------------- rank command


def test_rank_command_wraps_the_user_command():
    cfg = parse_args(["-np", "12", "--output-filename", "/abs/out", "python", "t.py"])
    assert rank_command(PY, TASK, cfg, "/tmp/st") == (
        PY, TASK, "--num-proc", "12", "--output-filename", "/abs/out",
        "--status-dir", "/tmp/st", "--tag-output", "--", "python", "t.py")
    untagged = parse_args(["-np", "12", "--output-filename", "/abs/out", "--no-tag-output", "python", "t.py"])
    assert rank_command(PY, TASK, untagged, None) == (
        PY, TASK, "--num-proc", "12", "--output-filename", "/abs/out", "--", "python", "t.py")


# ---------------------------------------------------------------- MPICH hydra


def test_mpich_local_run_passes_no_hosts():
    argv = build_launch_argv("mpich", plan_for(["-np", "2", "python", "t.py"]))
    assert argv == ["mpiexec", "-n", "2", *rank_cmd("python", "t.py")]


def test_mpich_hosts_env_and_mpi_args():
    plan = plan_for(["-np", "3", "-H", "a:2,b:2", "-x", "FOO=bar", "-x", "HOME",
                     "--start-timeout", "5", "--mpi-args", "-iface eth0", "python", "t.py"],
                    environ={"HOME": "/h"})
    assert build_launch_argv("mpich", plan) == [
        "mpiexec", "-hosts", "a:2,b:1",
        "-genv", "FOO", "bar", "-genv", "HOME", "/h", "-genv", "MLSL_TF_START_TIMEOUT", "5",
        "-iface", "eth0", "-n", "3", *rank_cmd("python", "t.py", np=3)]


def test_mpich_hostfile():
    hosts = parse_hostfile("a slots=1\nb slots=1\n")
    plan = plan_for(["-np", "2", "--hostfile", "hf", "python"], hosts=hosts)
    assert build_launch_argv("mpich", plan)[:3] == ["mpiexec", "-hosts", "a:1,b:1"]


def test_output_filename_goes_to_the_rank_wrapper():
    plan = plan_for(["-np", "2", "--output-filename", "/o", "python"])
    argv = build_launch_argv("mpich", plan)
    assert argv == ["mpiexec", "-n", "2",
                    *rank_cmd("python", extra=("--output-filename", "/o"))]


def test_verbose_does_not_change_the_argv():
    quiet = build_launch_argv("mpich", plan_for(["-np", "2", "python"]))
    loud = build_launch_argv("mpich", plan_for(["-np", "2", "--verbose", "python"]))
    assert quiet == loud


def test_np_more_than_hostfile_slots_is_an_error():
    cfg = parse_args(["-np", "3", "--hostfile", "hosts.txt", "python"])
    hosts = parse_hostfile("a slots=1\nb slots=1\n")
    with pytest.raises(UsageError, match="-np 3 is more than the 2 slots given by --hostfile"):
        make_plan(cfg, "mpiexec", hosts, {}, ["cmd"])


# ---------------------------------------------------------------- Open MPI


OMPI_COMMON = ["--oversubscribe", "--bind-to", "none", "--map-by", "slot", "--mca", "btl", "^openib"]


def test_openmpi_local():
    argv = build_launch_argv("openmpi", plan_for(["-np", "2", "python"], program="mpirun"))
    assert argv == ["mpirun", "--allow-run-as-root", "-np", "2", *OMPI_COMMON,
                    "-x", "MPI4PY_MPIABI=openmpi", *rank_cmd("python")]


def test_openmpi_local_does_not_list_the_environment():
    """Ranks on this machine inherit mpirun's environment: nothing to forward by name."""
    plan = plan_for(["-np", "3", "python"], program="mpirun", environ={"PATH": "/bin", "HOME": "/root"})
    assert build_launch_argv("openmpi", plan) == [
        "mpirun", "--allow-run-as-root", "-np", "3", *OMPI_COMMON,
        "-x", "MPI4PY_MPIABI=openmpi", *rank_cmd("python", np=3)]


def test_openmpi_hosts_env_and_mpi_args():
    plan = plan_for(["-np", "4", "-H", "a:2,b:2", "-x", "FOO=a b", "-x", "PATH",
                     "--mpi-args", "--report-bindings", "python"],
                    program="mpirun", environ={"PATH": "/bin"})
    assert build_launch_argv("openmpi", plan) == [
        "mpirun", "--allow-run-as-root", "-np", "4", "-H", "a:2,b:2", *OMPI_COMMON,
        "-x", "FOO=a b", "-x", "PATH=/bin", "-x", "MPI4PY_MPIABI=openmpi", "--report-bindings",
        *rank_cmd("python", np=4)]


def test_openmpi_hosts_forward_the_environment_by_name():
    """Open MPI gives ranks on other hosts only the variables -x names (hydra passes them all):
    with hosts every variable is named, except per-job, per-host and launcher state."""
    environ = {"PATH": "/bin", "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/lib", "MLSL_TF_CHUNK_BYTES": "9",
               "OMPI_COMM_WORLD_RANK": "0", "OMPI_MCA_plm_rsh_agent": "ssh", "PMI_RANK": "1",
               "PMIX_RANK": "0", "SLURM_NODEID": "3", "HYDRA_PROXY_PORT": "1", "MPI_LOCALRANKID": "0",
               "BASH_FUNC_f%%": "() { :; }", "HOSTNAME": "h0", "PWD": "/x", "OLDPWD": "/y", "SHLVL": "2",
               "_": "/usr/bin/mlslrun", "CUDA_VISIBLE_DEVICES": "0", "bad-name": "1", "HOME": "/root"}
    plan = plan_for(["-np", "2", "-H", "a:1,b:1", "-x", "PATH=/opt/bin", "python"],
                    program="mpirun", environ=environ)
    argv = build_launch_argv("openmpi", plan)
    named = [argv[i + 1] for i, w in enumerate(argv) if w == "-x"]
    assert named == ["HOME", "LD_LIBRARY_PATH", "MLSL_TF_CHUNK_BYTES", "PYTHONPATH",
                     "PATH=/opt/bin", "MPI4PY_MPIABI=openmpi"]


@pytest.mark.parametrize("mpi_args,environ", [
    ("--mca btl self,vader,tcp", {}),
    ("-mca btl tcp,self", {}),
    ("--gmca btl tcp,self", {}),
    ("", {"OMPI_MCA_btl": "tcp,self"}),
])
def test_openmpi_user_btl_choice_replaces_ours(mpi_args, environ):
    """Open MPI joins two values of one MCA parameter with a comma ('^openib,tcp' is an error):
    a btl the user chose replaces mlslrun's."""
    args = ["-np", "2"] + (["--mpi-args", mpi_args] if mpi_args else []) + ["python"]
    argv = build_launch_argv("openmpi", plan_for(args, program="mpirun", environ=environ))
    assert "^openib" not in argv
    assert argv.count("btl") == (1 if mpi_args else 0)


def test_openmpi_other_mca_params_keep_our_btl_choice():
    argv = build_launch_argv("openmpi", plan_for(["-np", "2", "--mpi-args", "--mca pml ob1", "python"],
                                                 program="mpirun", environ={"OMPI_MCA_pml": "ob1"}))
    assert argv[argv.index("^openib") - 2:argv.index("^openib") + 1] == ["--mca", "btl", "^openib"]


@pytest.mark.parametrize("args,environ", [
    (["-x", "MPI4PY_MPIABI=mpich"], {}),
    (["-x", "MPI4PY_LIBMPI=/opt/ompi/lib/libmpi.so"], {}),
    ([], {"MPI4PY_MPIABI": "openmpi"}),
    ([], {"MPI4PY_LIBMPI": "libmpi.so.40"}),
])
def test_openmpi_user_mpi4py_choice_is_kept(args, environ):
    argv = build_launch_argv("openmpi", plan_for(["-np", "2", *args, "python"], program="mpirun",
                                                 environ=environ))
    assert "MPI4PY_MPIABI=openmpi" not in argv


# ---------------------------------------------------------------- Intel MPI


def test_intel_local():
    plan = plan_for(["-np", "2", "-x", "A=1", "python"], program="mpiexec.hydra")
    assert build_launch_argv("intel", plan) == [
        "mpiexec.hydra", "-genv", "A", "1", "-n", "2", *rank_cmd("python")]


def test_intel_equal_slots_use_ppn():
    plan = plan_for(["-np", "4", "-H", "a:2,b:2", "python"], program="mpiexec.hydra")
    assert build_launch_argv("intel", plan) == [
        "mpiexec.hydra", "-n", "4", "-hosts", "a,b", "-ppn", "2", *rank_cmd("python", np=4)]


def test_intel_unequal_slots_use_mpmd():
    plan = plan_for(["-np", "3", "-H", "a:2,b:2", "--mpi-args", "-l", "python"],
                    program="mpiexec.hydra")
    cmd = rank_cmd("python", np=3)
    assert build_launch_argv("intel", plan) == [
        "mpiexec.hydra", "-l", "-n", "2", "-host", "a", *cmd, ":", "-n", "1", "-host", "b", *cmd]


# ---------------------------------------------------------------- SLURM srun


def test_srun_inside_allocation():
    """srun is told to give the ranks SLURM's pmi2 (PyPI's MPICH speaks no PMIx; without a PMI
    every rank would be a world of one)."""
    argv = build_launch_argv("slurm", plan_for(["-np", "8", "python"], program="srun"))
    assert argv == ["srun", "--ntasks=8", "--kill-on-bad-exit=1", "--mpi=pmi2", *rank_cmd("python", np=8)]


@pytest.mark.parametrize("mpi_args,environ", [
    (["--mpi-args", "--mpi=pmix"], {}),
    (["--mpi-args", "--mpi pmix"], {}),
    ([], {"SLURM_MPI_TYPE": "pmix"}),
])
def test_srun_pmi_chosen_by_the_user_is_kept(mpi_args, environ):
    argv = build_launch_argv("slurm", plan_for(["-np", "2", *mpi_args, "python"], program="srun",
                                               environ=environ))
    assert "--mpi=pmi2" not in argv
    assert argv[:3] == ["srun", "--ntasks=2", "--kill-on-bad-exit=1"]


def test_srun_hosts_env_and_mpi_args():
    plan = plan_for(["-np", "4", "-H", "a:2,b:2", "-x", "FOO=bar", "--start-timeout", "9",
                     "--mpi-args", "--mpi=pmi2", "python"], program="srun")
    assert build_launch_argv("slurm", plan) == [
        "srun", "--ntasks=4", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=2",
        "--nodelist=a,b", "--export=ALL,FOO=bar,MLSL_TF_START_TIMEOUT=9", "--mpi=pmi2",
        *rank_cmd("python", np=4)]


def test_srun_rejects_unequal_hosts():
    plan = plan_for(["-np", "3", "-H", "a:2,b:1", "python"], program="srun")
    with pytest.raises(UsageError, match="same number of ranks on every host.*a:2,b:1"):
        build_launch_argv("slurm", plan)


def test_srun_rejects_comma_in_env_value():
    plan = plan_for(["-np", "1", "-x", "LIST=a,b", "python"], program="srun")
    with pytest.raises(UsageError, match="-x LIST: srun --export cannot carry"):
        build_launch_argv("slurm", plan)


def test_no_shell_strings():
    """Every argv element is one word as given, never a joined shell command."""
    plan = plan_for(["-np", "2", "python", "-c", "print('a b; c')"])
    for flavour in ("mpich", "openmpi", "intel", "slurm"):
        argv = build_launch_argv(flavour, plan)
        assert argv[-1] == "print('a b; c')" and all(isinstance(a, str) for a in argv)
