"""pip install . -- compiles ops/ against the TensorFlow and MPI already installed in the
target environment (as `pip install horovod` does) and puts the library inside mlsl_tf/."""

import os
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildOps(build_py):
    """Runs `make lib` with this interpreter before copying the package (not with
    MLSL_TF_SKIP_BUILD=1: `make venv`'s editable install, whose ops `make lib` builds)."""

    def run(self):
        if os.environ.get("MLSL_TF_SKIP_BUILD") != "1":
            subprocess.check_call(["make", "-j2", "lib", f"PYTHON={sys.executable}"], cwd=HERE)
        super().run()


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
    zip_safe=False,
)
