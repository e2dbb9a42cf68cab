"""pip install . -- compiles ops/ (the library) and ops/core/sim/ (the simulator) against the
TensorFlow and MPI already installed in the target environment (as `pip install horovod` does)
and puts both inside mlsl_tf/; the wheel is tagged for this Python and platform."""

import json
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SIM_BINARY = os.path.join("build", "mlsl_sim")
# the simulator's place inside the installed package (mlsl_tf/simulate.py looks there first)
SIM_IN_PACKAGE = "mlsl_sim"
BUILD_INFO = "_build.json"


def _clean_env():
    """This interpreter's own environment: pip's isolated build sets PYTHONPATH and
    PYTHONNOUSERSITE so that only the build requirements are importable."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}


class BuildOps(build_py):
    """Runs `make lib sim` with this interpreter (its TensorFlow, its MPI) before copying the
    package, then adds the simulator binary. Not with MLSL_TF_SKIP_BUILD=1 (`make venv`'s
    editable install: `make lib` and `make sim` build in the tree)."""

    def run(self):
        if os.environ.get("MLSL_TF_SKIP_BUILD") == "1":
            return super().run()
        env = _clean_env()
        check = subprocess.run([sys.executable, "tools/toolchain.py", "check", "build/tf_flags.json"],
                               cwd=HERE, env=env, capture_output=True, text=True)
        if check.returncode != 0:
            sys.exit(check.stderr.strip() or "mlsl_tf build: tools/toolchain.py check failed")
        print(check.stdout.strip(), flush=True)
        mpicxx = check.stdout.splitlines()[0].split(": ", 1)[1]
        subprocess.check_call(["make", "--no-print-directory", "lib", "sim", f"PYTHON={sys.executable}",
                               f"MPICXX={mpicxx}"], cwd=HERE, env=env)
        super().run()
        target = os.path.join(self.build_lib, "mlsl_tf", SIM_IN_PACKAGE)
        shutil.copy2(os.path.join(HERE, SIM_BINARY), target)  # keeps the executable bit
        # mlslrun launches with the mpiexec of the MPI the library links (runner/launch.py)
        with open(os.path.join(self.build_lib, "mlsl_tf", BUILD_INFO), "w") as f:
            json.dump({"mpicxx": mpicxx, "mpiexec": os.path.join(os.path.dirname(mpicxx), "mpiexec")}, f)


class PlatformDistribution(Distribution):
    """The package holds native code built for one Python, platform, TensorFlow and MPI: a
    platform wheel (cp311-cp311-linux_x86_64), never py3-none-any."""

    def has_ext_modules(self):
        return True


setup(
    name="mlsl_tf",
    version="0.1.0",
    description="MLSL-style priority-scheduled, bf16, grouped collectives for TensorFlow 2 / Keras 3; "
                "a drop-in for Horovod's TensorFlow API",
    python_requires=">=3.11",
    packages=find_packages(include=["mlsl_tf", "mlsl_tf.*"]),
    package_data={"mlsl_tf": ["_mlsl_tf.so", "sim_models/*.json"]},
    entry_points={"console_scripts": ["mlslrun = mlsl_tf.runner.launch:main"]},
    cmdclass={"build_py": BuildOps},
    distclass=PlatformDistribution,
    zip_safe=False,
)
