"""Choosing Open MPI beside a venv's MPICH: MLSL_TF_MPIEXEC picks the launcher (run as given),
MLSL_TF_LIBRARY the build of the ops, and init() refuses an MPI thread level its background
thread cannot use. No Open MPI needed: fake launchers and the venv's MPICH."""

import os
import pathlib
import subprocess
import sys

import pytest

from mlsl_tf.runner import installed, launch
from mlsl_tf.runner.argv import parse_args

REPO = pathlib.Path(__file__).resolve().parents[2]


def fake_launcher(path, version_line):
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(0o755)
    return path


def test_chosen_mpiexec_unset_or_empty_is_none():
    assert installed.chosen_mpiexec({}) is None
    assert installed.chosen_mpiexec({installed.MPIEXEC_ENV: ""}) is None


def test_chosen_mpiexec_by_name_on_path_and_by_path(tmp_path):
    fake = fake_launcher(tmp_path / "mpirun.openmpi", "mpirun.openmpi (OpenRTE) 4.1.4")
    assert installed.chosen_mpiexec({installed.MPIEXEC_ENV: "mpirun.openmpi"}, path=str(tmp_path)) == str(fake)
    assert installed.chosen_mpiexec({installed.MPIEXEC_ENV: str(fake)}, path="") == str(fake)


def test_chosen_mpiexec_missing_is_an_error_naming_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"MLSL_TF_MPIEXEC=mpirun.nothere: no such executable on PATH"):
        installed.chosen_mpiexec({installed.MPIEXEC_ENV: "mpirun.nothere"}, path=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"MLSL_TF_MPIEXEC=/no/such/mpirun: no such executable\Z"):
        installed.chosen_mpiexec({installed.MPIEXEC_ENV: "/no/such/mpirun"}, path=str(tmp_path))


def test_plan_uses_the_chosen_open_mpi_launcher_as_given(tmp_path):
    """Debian's /usr/bin/mpirun beside mpirun.openmpi may be another MPI's: the launcher
    MLSL_TF_MPIEXEC names is the one run, with Open MPI's command line."""
    chosen = fake_launcher(tmp_path / "mpirun.openmpi", "mpirun.openmpi (OpenRTE) 4.1.4")
    fake_launcher(tmp_path / "mpirun", "HYDRA build details:")
    cfg = parse_args(["-np", "2", "python", "t.py"])
    environ = {installed.MPIEXEC_ENV: "mpirun.openmpi", "PATH": str(tmp_path)}
    flavour, argv = launch.plan_argv(cfg, environ, str(tmp_path / "status"))
    assert flavour == "openmpi"
    assert argv[:4] == [str(chosen), "--allow-run-as-root", "-np", "2"]
    assert argv[-2:] == ["python", "t.py"]


def test_plan_with_a_chosen_mpich_launcher(tmp_path):
    chosen = fake_launcher(tmp_path / "mpiexec.mpich", "HYDRA build details:\n    Version: 4.0")
    cfg = parse_args(["-np", "3", "python"])
    flavour, argv = launch.plan_argv(cfg, {installed.MPIEXEC_ENV: str(chosen)}, str(tmp_path))
    assert flavour == "mpich"
    assert argv[:3] == [str(chosen), "-n", "3"]


def test_plan_with_a_missing_chosen_launcher_fails_naming_it(tmp_path):
    cfg = parse_args(["-np", "2", "python"])
    with pytest.raises(RuntimeError, match="MLSL_TF_MPIEXEC=mpirun.gone: no such executable"):
        launch.plan_argv(cfg, {installed.MPIEXEC_ENV: "mpirun.gone", "PATH": str(tmp_path)}, str(tmp_path))


def run_python(code, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "PMI_", "OMPI_"))}
    full.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=180, cwd=str(REPO))


def test_library_env_names_a_missing_file():
    out = run_python("import mlsl_tf as hvd\ntry:\n    hvd.init()\nexcept ImportError as e:\n    print('ERR', e)",
                     MLSL_TF_LIBRARY="build/nowhere/_mlsl_tf.so")
    assert out.returncode == 0, out.stderr
    assert f"ERR MLSL_TF_LIBRARY=build/nowhere/_mlsl_tf.so: no such library file ({REPO}/build/nowhere/_mlsl_tf.so)" \
        in out.stdout, out.stdout + out.stderr


def test_library_env_loads_that_build(tmp_path):
    """A copy of the package's library under another name is what gets loaded and runs."""
    copy = tmp_path / "other" / "_mlsl_tf.so"
    copy.parent.mkdir()
    copy.write_bytes((REPO / "mlsl_tf" / "_mlsl_tf.so").read_bytes())
    code = ("import mlsl_tf as hvd, tensorflow as tf\nfrom mlsl_tf import _library\nhvd.init()\n"
            "print('LIB', _library.LIBRARY_PATH)\n"
            "print('MAPPED', any(l.rstrip().endswith(_library.LIBRARY_PATH) for l in open('/proc/self/maps')))\n"
            "print('SUM', hvd.allreduce(tf.constant([2.0]), op=hvd.Sum).numpy()[0])")
    out = run_python(code, MLSL_TF_LIBRARY=str(copy))
    assert out.returncode == 0, out.stderr
    assert f"LIB {copy}\nMAPPED True\nSUM 2.0\n" in out.stdout, out.stdout


@pytest.mark.parametrize("level", ["single", "funneled"])
def test_init_refuses_a_thread_level_below_serialized(level):
    """mpi4py initialised MPI first with a level at which mlsl_tf's background thread may not
    call MPI: init() fails naming the level and how to fix it, instead of undefined behaviour."""
    code = (f"import mpi4py\nmpi4py.rc.thread_level = {level!r}\nfrom mpi4py import MPI\n"
            "import mlsl_tf as hvd\ntry:\n    hvd.init()\nexcept RuntimeError as e:\n    print('ERR', e)")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert f"ERR mlsl_tf.init() failed: MPI provides only MPI_THREAD_{level.upper()}" in out.stdout, out.stdout
    assert "mpi4py.rc.thread_level" in out.stdout


def test_init_accepts_serialized():
    code = ("import mpi4py\nmpi4py.rc.thread_level = 'serialized'\nfrom mpi4py import MPI\n"
            "import mlsl_tf as hvd\nhvd.init()\nprint('SIZE', hvd.size(), hvd.mpi_threads_supported())")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "SIZE 1 False" in out.stdout, out.stdout
