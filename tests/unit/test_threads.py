"""The inter-op pool that init() sets for several ranks per machine (mlsl_tf/cpu_placement.py)."""

import concurrent.futures
import os
import subprocess
import sys

import pytest

from mlsl_tf import cpu_placement

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.parametrize("spec,want", [
    ("auto", 2), ("", 2), ("tf", None), ("TF", None), ("3", 3), (" 1 ", 1),
])
def test_inter_op_threads(spec, want):
    assert cpu_placement.inter_op_threads(spec) == want


@pytest.mark.parametrize("spec", ["0", "-2", "many", "1.5"])
def test_bad_setting_names_the_variable(spec):
    with pytest.raises(ValueError, match="MLSL_TF_INTER_OP_THREADS"):
        cpu_placement.inter_op_threads(spec)


def after_init(env_extra, before_init=""):
    """(inter-op threads TensorFlow reports, whether the eager context's pools may spin) after
    mlsl_tf.init() in a fresh process; spinning is read from the configuration TensorFlow builds
    the pools from, once an op has run."""
    code = ("import tensorflow as tf, mlsl_tf as hvd\n"
            "from tensorflow.python.eager import context\n" + before_init +
            "hvd.init()\ntf.constant(1.0) + 1.0\n"
            "print('THREADS', tf.config.threading.get_inter_op_parallelism_threads())\n"
            "print('SPIN', not context.context().config.experimental.disable_thread_spinning)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "TF_NUM_"))}
    env.update(env_extra, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    threads_line, spin_line = out.stdout.split("THREADS")[1].split("SPIN")
    return int(threads_line), spin_line.strip() == "True"


# One fresh process per case (TensorFlow's pools are set once per process), two at a time.
CASES = {
    "default": ({}, ""),
    "three": ({"MLSL_TF_INTER_OP_THREADS": "3"}, ""),
    "tf": ({"MLSL_TF_INTER_OP_THREADS": "tf"}, ""),
    "user-set": ({}, "tf.config.threading.set_inter_op_parallelism_threads(5)\n"),
    "running": ({}, "tf.constant(1.0) + 1.0\n"),
    "spin": ({"MLSL_TF_THREAD_SPINNING": "1"}, ""),
    "user-intra": ({}, "tf.config.threading.set_intra_op_parallelism_threads(1)\n"),
}


@pytest.fixture(scope="module")
def inits():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(after_init, *case) for name, case in CASES.items()}
        return {name: f.result() for name, f in futures.items()}


def test_init_sets_the_pool_and_respects_the_user(inits):
    assert inits["default"][0] == 2
    assert inits["three"][0] == 3
    assert inits["tf"][0] == 0  # TensorFlow's default, untouched
    assert inits["user-set"][0] == 5
    # A runtime already running keeps its pools; init still succeeds.
    assert inits["running"][0] == 0


@pytest.mark.parametrize("spec,want", [("0", False), ("", False), ("off", False), ("1", True), (" On ", True)])
def test_spinning_setting(spec, want):
    assert cpu_placement.spinning(spec) is want


def test_bad_spinning_setting_names_the_variable():
    with pytest.raises(ValueError, match="MLSL_TF_THREAD_SPINNING"):
        cpu_placement.spinning("sometimes")


def test_init_stops_spinning_unless_asked(inits):
    assert inits["default"][1] is False
    assert inits["spin"][1] is True
    # The user's own configuration fields survive; a running runtime keeps its pools.
    assert inits["user-intra"][1] is False
    assert inits["running"][1] is True
