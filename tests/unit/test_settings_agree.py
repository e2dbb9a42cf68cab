"""Ranks started with different MLSL_TF_CACHE_CAPACITY (an MPMD job: one environment per rank)
fail init() on every rank with an error naming the setting and each rank's value -- before the
check, such a job hung or crashed (malloc(): invalid size) once one rank forgot names."""

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

PROGRAM = """
import sys
import tensorflow as tf
import mlsl_tf as hvd
try:
    hvd.init()
except RuntimeError as e:
    # one write per rank, so the ranks' lines cannot interleave (mpiexec merges their stdout)
    sys.stdout.write("INIT-ERROR " + str(e).replace(chr(10), " ") + chr(10))
    sys.stdout.flush()
    sys.exit(3)
# Without the check: many distinct names make the rank with the small cache forget names.
for i in range(200):
    hvd.allreduce(tf.ones([4]), op=hvd.Sum, name=f"n{i}")
print("NO-ERROR", flush=True)
"""


def test_cache_capacity_mismatch_is_an_init_error_on_every_rank():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLSL_TF_")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    def rank(capacity):
        return ["-n", "1", "env", f"MLSL_TF_CACHE_CAPACITY={capacity}", sys.executable, "-c", PROGRAM]

    argv = [MPIEXEC, *rank(16), ":", *rank(64)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    # a rank's line may still land inside the other's: split the output at every marker
    lines = [m.group(0) for m in re.finditer(r"(INIT-ERROR|NO-ERROR)((?!INIT-ERROR|NO-ERROR).)*", out.stdout)]
    assert len(lines) == 2, out.stdout + out.stderr
    for line in lines:
        assert line.startswith("INIT-ERROR"), line
        assert "MLSL_TF_CACHE_CAPACITY must be the same on every rank" in line, line
        assert "rank 0 has 16" in line and "rank 1 has 64" in line, line


def _mpmd(*rank_envs):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "HOROVOD_"))}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    argv = [MPIEXEC]
    for i, settings in enumerate(rank_envs):
        argv += ([":"] if i else []) + ["-n", "1", "env", *settings, sys.executable, "-c", PROGRAM]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    lines = [m.group(0) for m in re.finditer(r"(INIT-ERROR|NO-ERROR)((?!INIT-ERROR|NO-ERROR).)*", out.stdout)]
    assert len(lines) == len(rank_envs), out.stdout + out.stderr
    return lines


def test_autotune_on_one_rank_only_is_an_init_error_on_every_rank():
    """Autotune widens every scheduler's slots, and rank 0 decides for all: ranks must agree on it
    (HOROVOD_AUTOTUNE=1 on one rank and MLSL_TF_AUTOTUNE unset on the other included)."""
    for line in _mpmd(["HOROVOD_AUTOTUNE=1"], ["MLSL_TF_AUTOTUNE=0"]):
        assert line.startswith("INIT-ERROR"), line
        assert "MLSL_TF_AUTOTUNE must be the same on every rank" in line, line
        assert "rank 0 has 1" in line and "rank 1 has 0" in line, line


def test_autotune_with_a_knob_fixed_on_one_rank_only_is_an_init_error_on_every_rank():
    """A tuned knob set in the environment stays fixed; rank 0 decides what is tuned for every
    rank, so the ranks must agree on which knobs their environments fix."""
    for line in _mpmd(["MLSL_TF_AUTOTUNE=1", "MLSL_TF_SPIN_US=100"], ["MLSL_TF_AUTOTUNE=1"]):
        assert line.startswith("INIT-ERROR"), line
        assert "MLSL_TF_AUTOTUNE's settings set in the environment (not tuned) must be the same" in line, line
        assert "rank 0 has MLSL_TF_SPIN_US" in line and "rank 1 has none" in line, line
