"""`pip install .` into an environment that already has TensorFlow and MPI compiles the ops
against them and installs a package that works outside the source tree, with `mlslrun`
(as `pip install horovod` does)."""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLSL_TF_SKIP_BUILD")}
    env.update(extra)
    return env


@pytest.mark.timeout(900)
def test_pip_install_compiles_the_ops_and_installs_mlslrun(tmp_path):
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in ("setup.py", "Makefile"):
        shutil.copy(os.path.join(REPO, name), src / name)
    for name in ("ops", "mlsl_tf"):  # sources only: no library, no objects
        shutil.copytree(os.path.join(REPO, name), src / name,
                        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    assert not (src / "mlsl_tf" / "_mlsl_tf.so").exists()

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, env=_clean_env(), timeout=880)

    assert (target / "mlsl_tf" / "_mlsl_tf.so").is_file()
    toolchain = (src / "build" / "toolchain.txt").read_text()
    assert os.path.dirname(sys.executable) in toolchain  # built with this environment's MPI and TF

    # From outside the source tree, the installed package runs a collective.
    script = ("import mlsl_tf as hvd, tensorflow as tf; hvd.init(); print(hvd.__file__); "
              "print(hvd.allreduce(tf.constant([2.0, 3.0]), op=hvd.Sum, name='installed').numpy().tolist())")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_clean_env(PYTHONPATH=str(target)),
                         capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert out[-2].startswith(str(target)) and out[-1] == "[2.0, 3.0]"

    # The console script, importing the installed package.
    report = subprocess.run([str(target / "bin" / "mlslrun"), "--check-build"], cwd=tmp_path,
                            env=_clean_env(PYTHONPATH=str(target)), capture_output=True, text=True,
                            timeout=120, check=True).stdout
    frameworks, operations = report.split("Available Tensor Operations:")
    assert "[X] TensorFlow" in frameworks and "[X] MPI" in operations
