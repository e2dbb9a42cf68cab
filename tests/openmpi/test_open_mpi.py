"""Under Open MPI (run by `make test-openmpi`, not `make test`: it needs Debian's Open MPI and
build/openmpi/_mlsl_tf.so): mlslrun's Open MPI job is what mlsl_tf and mpi4py see, and a
library of one MPI under the other MPI's launcher fails with a message, never a silent job of
singletons. Paths come from the environment the Makefile target sets (MLSL_TF_MPIEXEC,
MLSL_TF_LIBRARY); every subprocess has a timeout."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
OMPI_LIB = os.environ.get("MLSL_TF_LIBRARY", "")
OMPI_MPIRUN = os.environ.get("MLSL_TF_MPIEXEC", "")
HYDRA = os.path.join(os.path.dirname(sys.executable), "mpiexec")
TIMEOUT_S = 240

if not (OMPI_LIB and OMPI_MPIRUN):
    pytest.fail("run through `make test-openmpi` (it sets MLSL_TF_LIBRARY and MLSL_TF_MPIEXEC)",
                pytrace=False)

RANK_REPORT = """
import json, os, sys
from mpi4py import MPI
import mlsl_tf as hvd
from mlsl_tf import _library
hvd.init()
line = json.dumps(dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                       local_size=hvd.local_size(), threads=hvd.mpi_threads_supported(),
                       mpi4py_size=MPI.COMM_WORLD.Get_size(),
                       mpi4py_lib=MPI.Get_library_version().splitlines()[0],
                       library=_library.LIBRARY_PATH, cpus=sorted(os.sched_getaffinity(0)),
                       sum=float(hvd.allreduce([float(hvd.rank() + 1)], op=hvd.Sum).numpy()[0])))
sys.stdout.write("REPORT " + line + chr(10))
sys.stdout.flush()
"""


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLSL_TF_", "PMI_", "OMPI_", "PMIX_", "MPI4PY_"))}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", **extra)
    return env


def run(argv, env):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=str(REPO))


def test_mlslrun_job_under_open_mpi():
    """mlslrun finds Open MPI by MLSL_TF_MPIEXEC, runs its mpirun (as root, two ranks on this
    machine, no binding by Open MPI) and mpi4py picks Open MPI's extension: both it and mlsl_tf
    see the 2-rank world, MPI_THREAD_MULTIPLE, and mlsl_tf's affinity splits the cores."""
    env = clean_env(MLSL_TF_MPIEXEC=OMPI_MPIRUN, MLSL_TF_LIBRARY=OMPI_LIB)
    out = run([sys.executable, "-m", "mlsl_tf.runner", "--verbose", "--no-tag-output", "-np", "2",
               sys.executable, "-c", RANK_REPORT], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"mlslrun: openmpi launcher: \S*mpirun\.openmpi --allow-run-as-root -np 2 "
                     r"--oversubscribe --bind-to none --map-by slot --mca btl '\^openib' -x MPI4PY_MPIABI=openmpi ",
                     out.stdout), out.stdout
    reports = sorted((json.loads(m) for m in re.findall(r"REPORT (\{.*?\})", out.stdout)), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1], out.stdout + out.stderr
    ncpu = len(os.sched_getaffinity(0))
    for r in reports:
        assert (r["size"], r["local_rank"], r["local_size"]) == (2, r["rank"], 2)
        assert r["threads"] is True  # Open MPI gave MPI_THREAD_MULTIPLE
        assert r["mpi4py_size"] == 2 and r["mpi4py_lib"].startswith("Open MPI"), r
        assert r["library"] == os.path.abspath(OMPI_LIB)
        assert r["sum"] == 3.0
        if ncpu >= 2:  # each rank on its own block of cores (mpirun did not bind it)
            assert 0 < len(r["cpus"]) <= ncpu // 2, r
    if ncpu >= 2:
        assert not set(reports[0]["cpus"]) & set(reports[1]["cpus"])


def test_open_mpi_library_under_hydra_is_an_error_on_every_rank():
    """MPICH's mpiexec starts an Open MPI library as singletons: each would train alone."""
    program = "import mlsl_tf as hvd\nhvd.init()\nprint('REPORT', hvd.size())"
    out = run([HYDRA, "-n", "2", sys.executable, "-c", program], clean_env(MLSL_TF_LIBRARY=OMPI_LIB))
    assert out.returncode != 0
    assert "REPORT" not in out.stdout
    errors = re.findall(r"this process was started by an MPICH-style launcher[^\n]*", out.stdout + out.stderr)
    assert len(errors) == 2, out.stdout + out.stderr
    for e in errors:
        assert "for 2 ranks (PMI_SIZE=2) but MPI_COMM_WORLD has 1" in e, e
        assert "built against another MPI (Open MPI v4" in e and "MLSL_TF_LIBRARY" in e, e


def test_mpich_library_under_open_mpi_fails_fast():
    """The venv's MPICH library under Open MPI's mpirun stops at MPI_Init (MPICH cannot talk
    PMIx), and mlslrun names the failed rank: a failure, neither a hang nor singletons."""
    env = clean_env(MLSL_TF_MPIEXEC=OMPI_MPIRUN, MPI4PY_MPIABI="openmpi")
    program = "import mlsl_tf as hvd\nhvd.init()\nprint('REPORT', hvd.size())"
    out = run([sys.executable, "-m", "mlsl_tf.runner", "-np", "2", sys.executable, "-c", program], env)
    assert out.returncode != 0
    assert "REPORT" not in out.stdout
    assert "PMIx" in out.stdout + out.stderr, out.stdout + out.stderr
    assert re.search(r"mlslrun: rank \d \(host [^)]*\) exited with code", out.stderr), out.stderr


def test_mlslrun_hosts_command_line_is_accepted_by_open_mpi():
    """With -H, mlslrun names its whole environment with -x (for ranks on other hosts); Open MPI
    accepts that command line and ranks get -x values. Per-job state (SLURM_*) is not named; the
    ranks here still inherit it from mpirun, as local ranks do."""
    env = clean_env(MLSL_TF_MPIEXEC=OMPI_MPIRUN, MLSL_OMPI_PROBE="from mlslrun's environment",
                    SLURM_NODEID="7")
    program = ("import os\nprint('PROBE', os.environ['OMPI_COMM_WORLD_RANK'], os.environ.get('MLSL_OMPI_PROBE'), "
               "os.environ.get('EXPLICIT'), os.environ.get('SLURM_NODEID'), flush=True)")
    out = run([sys.executable, "-m", "mlsl_tf.runner", "--verbose", "--no-tag-output", "-np", "2",
               "-H", "localhost:2", "-x", "EXPLICIT=a b", sys.executable, "-c", program], env)
    assert out.returncode == 0, out.stdout + out.stderr
    command = next(line for line in out.stdout.splitlines() if line.startswith("mlslrun: openmpi launcher:"))
    assert " -H localhost:2 " in command and " -x MLSL_OMPI_PROBE " in command and " -x PATH " in command
    assert "SLURM_NODEID" not in command
    assert sorted(re.findall(r"^PROBE \d .*", out.stdout, re.M)) == [
        "PROBE 0 from mlslrun's environment a b 7", "PROBE 1 from mlslrun's environment a b 7"]
