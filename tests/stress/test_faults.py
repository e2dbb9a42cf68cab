"""The fault matrix on 2 ranks: rank 1 raises, is SIGKILLed, calls shutdown() or exits(0)
while rank 0 waits in a collective. mlslrun's exit code, the rank it names and the time it
takes are asserted (and reported)."""

import re
import sys
import textwrap

import pytest

from conftest import report

FAULTS = {
    "raise": "raise ValueError('rank 1 raised')",
    "sigkill": "os.kill(os.getpid(), signal.SIGKILL)",
    "shutdown": "hvd.shutdown(); time.sleep(3)",
    "exit0": "sys.exit(0)",
}
# (exit code, blamed rank, what the line says)
EXPECTED = {
    "raise": (1, 1, "exited with code 1: ValueError: rank 1 raised"),
    "sigkill": (137, 1, "was killed by signal SIGKILL"),
    "shutdown": (1, 1, "left first: it shut mlsl_tf down"),
    "exit0": (1, 1, "left first: it shut mlsl_tf down"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault(mlslrun, fault):
    source = textwrap.dedent(f"""
        import os, signal, sys, time
        import mlsl_tf as hvd
        hvd.init()
        import tensorflow as tf
        hvd.allreduce(tf.ones([4]), name="warm_up")
        if hvd.rank() == 1:
            time.sleep(1)
            {FAULTS[fault]}
        else:
            hvd.allreduce(tf.ones([1 << 16]), name="victim")
            time.sleep(300)
    """)
    r, seconds = mlslrun(2, sys.executable, "-c", source, timeout=240)
    code, rank, words = EXPECTED[fault]
    lines = [line for line in r.stderr.splitlines() if line.startswith("mlslrun: ")]
    report(test="fault", fault=fault, exit_code=r.returncode, seconds=round(seconds, 1),
           blamed=lines[0] if lines else None)
    assert r.returncode == code, r.stderr[-3000:]
    assert lines and re.match(rf"mlslrun: rank {rank} \(host ", lines[0]) and words in lines[0], r.stderr[-3000:]
    assert seconds < 60, f"the job took {seconds:.0f} s to end"
