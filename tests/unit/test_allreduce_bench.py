"""benchmarks/allreduce.py's CPU accounting: the process CPU of the timed calls, summed over the
ranks, per GB of messages reduced (one rank here, a stand-in communicator; no MPI job)."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import allreduce  # noqa: E402


class OneRank:
    """What Timer uses of an mpi4py communicator, for one rank (or `ranks` identical ones)."""

    def __init__(self, ranks=1):
        self.ranks = ranks

    def Barrier(self):  # noqa: N802 (mpi4py's name)
        pass

    def allreduce(self, value, op=None):
        from mpi4py import MPI
        return value * self.ranks if op == MPI.SUM else value


def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_core_seconds_per_gb_count_only_the_timed_calls_of_each_key():
    timer = allreduce.Timer(OneRank(ranks=2))
    for _ in range(3):
        timer.sample(lambda: _burn(0.05), 1, key="busy")
        timer.sample(lambda: time.sleep(0.05), 1, key="idle")  # waiting costs no CPU
    _burn(0.1)  # outside any sample: not counted
    busy = timer.core_s_per_gb("busy", 3 * 100_000_000)  # 3 calls of a 100 MB message
    idle = timer.core_s_per_gb("idle", 3 * 100_000_000)
    # >= 0.15 s on this rank, x2 ranks, over 0.3 GB; a busy machine only stretches the wall time
    assert 0.15 * 2 / 0.3 * 0.99 <= busy < 0.25 * 2 / 0.3
    assert idle < 0.02 * 2 / 0.3
    assert timer.core_s_per_gb("never", 1e9) == 0.0
