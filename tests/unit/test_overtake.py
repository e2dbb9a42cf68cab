"""An urgent 4 KiB allreduce overtakes a big broadcast, allgather, alltoall and Adasum allreduce
between two of their pieces: 2 ranks under an emulated 2 Gbit/s link (benchmarks/netlink.py: a
network namespace with a tc tbf loopback, MPICH on TCP), a 128 MiB low-priority collective
started first, the priority-0 allreduce issued 30 ms later must finish first on every rank.
Needs root (ip netns)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and tc for the emulated link")
def test_urgent_allreduce_overtakes_big_broadcast_allgather_alltoall_adasum():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "PMI_", "HYD"))}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "overtake.py"), "--link", "2gbit",
                          "--np", "2", "--mib", "128"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # one JSON object per rank and op; mpiexec may merge two ranks' lines into one
    rows = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", out.stdout)]
    assert sorted((r["op"], r["rank"]) for r in rows) == sorted(
        (op, rank) for op in ("broadcast", "allgather", "alltoall", "adasum") for rank in (0, 1)), out.stdout
    for r in rows:
        # 128 MiB at 2 Gbit/s is >= 530 ms on the wire; the urgent one goes between two 1 MiB pieces
        assert r["big_ms"] > 400, r
        assert r["urgent_first"], r
        assert r["urgent_ms"] < 0.5 * r["big_ms"], r
