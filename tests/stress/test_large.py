"""Large inputs on 2 ranks: a broadcast of more than 2^31-1 elements works (MPI counts are int:
the runtime sends it in pieces), and the peak memory of a 512 MiB allreduce is reported."""

import sys

from conftest import HERE, records, report


def test_broadcast_beyond_int_counts(mlslrun):
    r, seconds = mlslrun(2, sys.executable, HERE / "large_worker.py", "broadcast", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    results = records(r.stdout, "LARGE")
    assert len(results) == 2 and all(res["ok"] for res in results), r.stdout[-2000:]
    report(test="broadcast_2^31+8_uint8", seconds=round(seconds, 1), peak_mib=[res["peak_mib"] for res in results])


def test_allreduce_512mib_peak_memory(mlslrun):
    r, seconds = mlslrun(2, sys.executable, HERE / "large_worker.py", "allreduce", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    results = records(r.stdout, "LARGE")
    assert len(results) == 2 and all(res["ok"] for res in results), r.stdout[-2000:]
    report(test="allreduce_512MiB", seconds=round(seconds, 1),
           extra_peak_over_input=[res["extra_over_input"] for res in results])
