"""Stalls on N ranks: a collective that some ranks submitted and others did not yet gets a
warning on each waiting rank within the threshold, naming the ranks it waits for and repeating;
with MLSL_TF_STALL_SHUTDOWN_SECONDS, ranks out of step (each waiting in a different
collective) all fail with what every rank waits for, instead of waiting forever."""

import os
import re
import time

import pytest
import tensorflow as tf

import mlsl_tf as hvd

hvd.init()
N, R = hvd.size(), hvd.rank()
LAST = N - 1


def _restart(**env):
    """Settings are read at init: shut down (every rank), set them, start again."""
    hvd.shutdown()
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    hvd.init()


def test_a_late_rank_is_named_within_the_threshold_and_again(capfd):
    _restart(MLSL_TF_STALL_WARNING_SECONDS="1")
    try:
        capfd.readouterr()
        if R == LAST:
            time.sleep(2.7)
        out = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="stall.late")
        assert float(out[0]) == N
        err = capfd.readouterr().err
        if R == LAST:
            assert "stall.late" not in err
        else:
            first = f"[mlsl_tf WARNING rank {R}] allreduce 'stall.late' has waited 1 s on rank {R} for rank(s) {LAST} " \
                    "to submit it"
            assert first in err, err
            assert re.search(r"'stall.late' has waited 2 s on rank", err), err  # repeated every threshold
    finally:
        _restart(MLSL_TF_STALL_WARNING_SECONDS=None)


def test_ranks_out_of_step_all_fail_with_what_each_waits_for():
    _restart(MLSL_TF_STALL_SHUTDOWN_SECONDS="2")
    try:
        start = time.monotonic()
        with pytest.raises(tf.errors.AbortedError) as e:
            hvd.allreduce(tf.ones([1]), name=f"stall.step.{R}")  # every rank in a different collective
        waited = time.monotonic() - start
        message = str(e.value)
        assert "stalled for more than 2 s (MLSL_TF_STALL_SHUTDOWN_SECONDS)" in message
        for r in range(N):
            assert f"rank {r} waits for 'stall.step.{r}'" in message
        assert waited < 6, waited
    finally:
        _restart(MLSL_TF_STALL_SHUTDOWN_SECONDS=None)
    # The restarted runtime works.
    assert float(hvd.allreduce(tf.ones([1]), op=hvd.Sum, name="stall.after")[0]) == N
