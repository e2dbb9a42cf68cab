"""What is installed where mlslrun runs: the MPI launcher it finds (the one MLSL_TF_MPIEXEC names,
else beside this Python, else the one of the MPI the library was built against, else on PATH),
the flavour's own program and version text, and --check-build's report. The package's compiled
library is loaded only for --check-build."""

import json
import os
import shutil
import subprocess
import sys
from typing import Mapping, Optional

from mlsl_tf.runner.launchers import Flavour, program_name

VERSION_TIMEOUT_S = 60.0


# Names the MPI launcher to use (a path, or a name looked up on PATH), e.g. mpirun.openmpi beside
# a venv whose mpiexec is PyPI's MPICH; mlslrun asks it which MPI it is and runs it as given.
MPIEXEC_ENV = "MLSL_TF_MPIEXEC"


def chosen_mpiexec(environ: Mapping[str, str], path: Optional[str] = None) -> Optional[str]:
    """The launcher MLSL_TF_MPIEXEC names (resolved on ``path``), None when it is unset;
    raises RuntimeError when it names no executable."""
    chosen = environ.get(MPIEXEC_ENV, "")
    if not chosen:
        return None
    found = shutil.which(chosen, path=path)
    if found is None:
        raise RuntimeError(f"{MPIEXEC_ENV}={chosen}: no such executable"
                           + ("" if os.sep in chosen else " on PATH"))
    return found


# Written by `pip install` (setup.py): the MPI the installed library was built against.
BUILD_INFO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build.json")


def _built_mpiexec(build_info: str = BUILD_INFO) -> Optional[str]:
    try:
        with open(build_info) as f:
            return json.load(f).get("mpiexec")
    except (OSError, ValueError, AttributeError):
        return None


def find_mpiexec(python: str = sys.executable, path: Optional[str] = None,
                 build_info: str = BUILD_INFO) -> Optional[str]:
    """mpiexec next to ``python`` (a venv's bin) if there, else the one of the MPI an installed
    package was built against (a venv that sees another environment's MPI), else the first on PATH."""
    for candidate in (os.path.join(os.path.dirname(python), "mpiexec"), _built_mpiexec(build_info)):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("mpiexec", path=path)


def flavour_program(flavour: Flavour, mpiexec: str) -> str:
    """The flavour's own launcher beside mpiexec (mpirun, mpiexec.hydra) or mpiexec."""
    sibling = os.path.join(os.path.dirname(mpiexec), program_name(flavour))
    return sibling if os.access(sibling, os.X_OK) else mpiexec


def mpi_version_text(mpiexec: str) -> str:
    """stdout + stderr of ``mpiexec --version``; raises OSError/TimeoutExpired."""
    out = subprocess.run([mpiexec, "--version"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", timeout=VERSION_TIMEOUT_S, check=False)
    return out.stdout


# ---------------------------------------------------------------------------
# --check-build.


def _op_library_status() -> tuple[bool, str]:
    """(loaded, reason): whether mlsl_tf's TensorFlow op library loads."""
    try:
        from mlsl_tf import _library  # written by the core; may be absent
        _library.load_ops()
    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def _version() -> str:
    try:
        from importlib import metadata
        return metadata.version("mlsl_tf")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        import mlsl_tf
        return str(getattr(mlsl_tf, "__version__", "unknown"))


def check_build_text(tf_loaded: bool, tf_reason: str, mpi_found: bool,
                     version: str) -> str:
    """horovodrun --check-build's report for mlsl_tf (pure)."""
    def mark(on: bool) -> str:
        return "[X]" if on else "[ ]"

    tf_line = f"    {mark(tf_loaded)} TensorFlow"
    if not tf_loaded:
        tf_line += f"  ({tf_reason})"
    lines = [f"mlsl_tf v{version}:", "", "Available Frameworks:", tf_line,
             "    [ ] PyTorch", "    [ ] MXNet", "",
             "Available Controllers:", f"    {mark(mpi_found)} MPI", "    [ ] Gloo", "",
             "Available Tensor Operations:", "    [ ] NCCL", "    [ ] DDL", "    [ ] CCL",
             f"    {mark(tf_loaded)} MPI", "    [ ] Gloo"]
    return "\n".join(lines) + "\n"


def check_build() -> int:
    loaded, reason = _op_library_status()
    sys.stdout.write(check_build_text(loaded, reason, find_mpiexec() is not None, _version()))
    sys.stdout.flush()
    return 0
