"""`pip install <clone>` with no flags, into a fresh venv that sees TensorFlow and MPI, builds a
platform wheel holding the ops and the simulator, built against that environment, and the
installed package works outside the source tree: import, a 2-rank allreduce under `mlslrun`,
`python -m mlsl_tf.simulate`. The clone carries this tree's compiled objects (make reuses them:
the test costs a link, not a 4-minute compile; `make lib` proves the compile itself), and the
fresh venv sees this environment's site-packages through a .pth file (no TensorFlow download).
Also: the errors tools/toolchain.py gives when TensorFlow or MPI cannot be found, and its
cache of TensorFlow's flags."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLCHAIN = REPO / "tools" / "toolchain.py"
SOURCES = ("setup.py", "pyproject.toml", "MANIFEST.in", "Makefile", "tools", "ops", "mlsl_tf")


def _clean_env(**extra):
    drop = ("PYTHONPATH", "MLSL_TF_SKIP_BUILD", "MLSL_SIM_BINARY", "MPICXX", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def _clone(dst):
    """The tree's sources (no library, no simulator, no package build) and its object files, with
    their mtimes, so that make finds the objects up to date."""
    dst.mkdir()
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", "mlsl_sim", "_build.json")
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore)
        else:
            shutil.copy2(src, dst / name)
    for name in ("obj", "simobj", "toolchain.txt", "tf_flags.json"):
        src = REPO / "build" / name
        if src.is_dir():
            shutil.copytree(src, dst / "build" / name)
        elif src.is_file():
            (dst / "build").mkdir(exist_ok=True)
            shutil.copy2(src, dst / "build" / name)


def _fresh_venv(path):
    """A new venv (its own interpreter, prefix and bin/) whose sys.path also holds this
    environment's site-packages: TensorFlow, mpich, pip are there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = pathlib.Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; "
                                        "print(sysconfig.get_path('purelib'))"], check=True, capture_output=True,
                                       text=True, timeout=60).stdout.strip())
    (site / "shared-env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return path / "bin" / "python", site


@pytest.mark.timeout(900)
def test_pip_install_with_no_flags_into_a_fresh_venv(tmp_path):
    src, cwd = tmp_path / "clone", tmp_path / "elsewhere"
    _clone(src)
    cwd.mkdir()
    python, site = _fresh_venv(tmp_path / "venv")
    assert not (src / "mlsl_tf" / "_mlsl_tf.so").exists()

    run = subprocess.run([str(python), "-m", "pip", "install", str(src)], cwd=cwd,
                         env=_clean_env(), capture_output=True, text=True, timeout=880)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # A platform wheel, not py3-none-any: it holds code built for one Python, platform, TF and MPI.
    dist_info = site / "mlsl_tf-0.1.0.dist-info"
    wheel = (dist_info / "WHEEL").read_text()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"Tag: {tag}-{tag}-linux_x86_64" in wheel and "Root-Is-Purelib: false" in wheel, wheel
    record = {line.split(",")[0] for line in (dist_info / "RECORD").read_text().splitlines()}
    assert {"mlsl_tf/_mlsl_tf.so", "mlsl_tf/mlsl_sim", "mlsl_tf/_build.json",
            "mlsl_tf/sim_models/resnet50.json", "mlsl_tf/runner/launch.py"} <= record
    package = site / "mlsl_tf"
    assert os.access(package / "mlsl_sim", os.X_OK)
    # built with the MPI the fresh venv sees (mpich's, through the .pth: not beside its python)
    build_info = json.loads((package / "_build.json").read_text())
    mpich_bin = os.path.realpath(os.path.join(os.path.dirname(sys.executable)))
    assert build_info["mpicxx"] == os.path.join(mpich_bin, "mpicxx") and os.access(build_info["mpiexec"], os.X_OK)

    # From outside the source tree: the installed package, under mlslrun at 2 ranks (which must
    # find mpich's mpiexec through _build.json: none is beside the venv's python, none on PATH).
    bare_path = str(tmp_path / "empty-bin")
    os.mkdir(bare_path)
    env = _clean_env(PATH=f"{tmp_path / 'venv' / 'bin'}:{bare_path}")
    script = ("import mlsl_tf as hvd, tensorflow as tf; hvd.init(); "
              "s = hvd.allreduce(tf.constant([1.0 + hvd.rank(), 3.0]), op=hvd.Sum, name='installed'); "
              "print('RESULT', hvd.rank(), hvd.size(), hvd.__file__, s.numpy().tolist(), flush=True)")
    run = subprocess.run([str(tmp_path / "venv" / "bin" / "mlslrun"), "--verbose", "-np", "2",
                          str(python), "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Tagged output ("[R]<stdout>:" per line, the default): the two ranks' lines never interleave.
    results = sorted(line.split("RESULT ", 1)[1].split(" ", 3) for line in run.stdout.splitlines()
                     if "<stdout>:RESULT " in line)
    assert results == [["0", "2", str(package / "__init__.py"), "[3.0, 6.0]"],
                       ["1", "2", str(package / "__init__.py"), "[3.0, 6.0]"]], run.stdout
    assert build_info["mpiexec"] in run.stdout + run.stderr  # the --verbose command line

    # The simulator shipped in the package, from outside the tree.
    run = subprocess.run([str(python), "-m", "mlsl_tf.simulate", "--model", "resnet50", "--nodes", "8",
                          "--policies", "overlap"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    line = json.loads(run.stdout)
    assert line["nodes"] == 8 and line["label"] == "overlap" and line["model"] == "resnet50"
    assert 0 < line["efficiency"] <= 1
    run = subprocess.run([str(python), "-m", "mlsl_tf.simulate", "--model", "resnet5"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown model 'resnet5': known models are " in run.stderr
    assert "resnet50" in run.stderr.split("known models are ", 1)[1], run.stderr


def _toolchain(python, *args, **env):
    return subprocess.run([str(python), str(TOOLCHAIN), *args], capture_output=True, text=True, timeout=300,
                          env=_clean_env(**env))


def test_toolchain_names_what_it_looked_for(tmp_path):
    """A venv with neither TensorFlow nor MPI, and no mpicxx on PATH."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    python = tmp_path / "bare" / "bin" / "python"
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _toolchain(python, "mpicxx", PATH=str(empty))
    assert out.returncode == 1 and out.stdout == ""
    for looked_for in ("$MPICXX (unset)", str(tmp_path / "bare" / "bin" / "mpicxx"), "the mpich package",
                       "mpicxx on PATH", "set MPICXX="):
        assert looked_for in out.stderr, out.stderr
    out = _toolchain(python, "check", str(tmp_path / "flags.json"), PATH=str(empty), MPICXX=str(empty / "nope"))
    assert out.returncode == 1 and f"MPICXX={empty / 'nope'} is not an executable file" in out.stderr
    out = _toolchain(python, "cflags", str(tmp_path / "flags.json"), PATH=str(empty))
    assert out.returncode == 1 and f"TensorFlow is not importable by {python}" in out.stderr, out.stderr
    assert not (tmp_path / "flags.json").exists()


def test_toolchain_caches_tensorflows_flags_under_a_key(tmp_path):
    cache = tmp_path / "build" / "flags.json"
    cache.parent.mkdir()
    # Another TensorFlow's flags (another key): TensorFlow is asked, the cache rewritten.
    cache.write_text(json.dumps({"key": "/elsewhere/tensorflow 1 2 3", "cflags": "-DFROM_THE_CACHE"}))
    first = _toolchain(sys.executable, "cflags", str(cache))
    assert first.returncode == 0 and "tensorflow/include" in first.stdout and "FROM_THE_CACHE" not in first.stdout
    data = json.loads(cache.read_text())
    tf_dir = os.path.realpath(os.path.dirname(importlib.util.find_spec("tensorflow").origin))
    assert data["key"].split()[0] == tf_dir and data["cflags"] == first.stdout.strip()
    assert f"-I{tf_dir}/include" in data["cflags"]  # canonical: one environment, one spelling
    # A current key: the cache is believed (TensorFlow is not imported: the flags are the cache's).
    cache.write_text(json.dumps(dict(data, cflags="-DFROM_THE_CACHE")))
    assert _toolchain(sys.executable, "cflags", str(cache)).stdout.strip() == "-DFROM_THE_CACHE"
