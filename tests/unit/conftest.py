import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


@pytest.fixture(scope="session")
def sim_binary():
    """build/mlsl_sim (`make sim`; make test-unit builds it first), built here if missing; its
    path is also exported as MLSL_SIM_BINARY for code that runs it itself."""
    root = pathlib.Path(__file__).resolve().parents[2]
    path = root / "build" / "mlsl_sim"
    if not path.exists():
        subprocess.run(["make", "-s", "sim"], cwd=root, check=True, timeout=900)
    os.environ["MLSL_SIM_BINARY"] = str(path)
    return str(path)
