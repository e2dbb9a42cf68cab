"""The inter-op pool that init() sets for several ranks per machine (mlsl_tf/threads.py)."""

import os
import subprocess
import sys

import pytest

from mlsl_tf import threads

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.parametrize("spec,want", [
    ("auto", 2), ("", 2), ("tf", None), ("TF", None), ("3", 3), (" 1 ", 1),
])
def test_inter_op_threads(spec, want):
    assert threads.inter_op_threads(spec) == want


@pytest.mark.parametrize("spec", ["0", "-2", "many", "1.5"])
def test_bad_setting_names_the_variable(spec):
    with pytest.raises(ValueError, match="MLSL_TF_INTER_OP_THREADS"):
        threads.inter_op_threads(spec)


def run_init(env_extra, before_init=""):
    """Inter-op threads TensorFlow reports after mlsl_tf.init() in a fresh process."""
    code = ("import tensorflow as tf, mlsl_tf as hvd\n" + before_init +
            "hvd.init()\nprint('THREADS', tf.config.threading.get_inter_op_parallelism_threads())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "TF_NUM_"))}
    env.update(env_extra, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split("THREADS")[1])


def test_init_sets_the_pool_and_respects_the_user():
    assert run_init({}) == 2
    assert run_init({"MLSL_TF_INTER_OP_THREADS": "3"}) == 3
    assert run_init({"MLSL_TF_INTER_OP_THREADS": "tf"}) == 0  # TensorFlow's default, untouched
    assert run_init({}, "tf.config.threading.set_inter_op_parallelism_threads(5)\n") == 5
    # A runtime already running keeps its pools; init still succeeds.
    assert run_init({}, "tf.constant(1.0) + 1.0\n") == 0


@pytest.mark.parametrize("spec,want", [("0", False), ("", False), ("off", False), ("1", True), (" On ", True)])
def test_spinning_setting(spec, want):
    assert threads.spinning(spec) is want


def test_bad_spinning_setting_names_the_variable():
    with pytest.raises(ValueError, match="MLSL_TF_THREAD_SPINNING"):
        threads.spinning("sometimes")


def spinning_after_init(env_extra, before_init=""):
    """Whether the eager context's pools may spin after mlsl_tf.init() in a fresh process, read
    from the configuration TensorFlow builds them from."""
    code = ("import tensorflow as tf, mlsl_tf as hvd\n"
            "from tensorflow.python.eager import context\n" + before_init +
            "hvd.init()\ntf.constant(1.0) + 1.0\n"
            "print('SPIN', not context.context().config.experimental.disable_thread_spinning)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "TF_NUM_"))}
    env.update(env_extra, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("SPIN")[1].strip() == "True"


def test_init_stops_spinning_unless_asked():
    assert spinning_after_init({}) is False
    assert spinning_after_init({"MLSL_TF_THREAD_SPINNING": "1"}) is True
    # The user's own configuration fields survive; a running runtime keeps its pools.
    assert spinning_after_init({}, "tf.config.threading.set_intra_op_parallelism_threads(1)\n") is False
    assert spinning_after_init({}, "tf.constant(1.0) + 1.0\n") is True
