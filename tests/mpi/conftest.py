"""Multi-rank tests: every rank runs the same pytest session under `mpiexec -n N`.

mpi4py is imported first on purpose, so mlsl_tf runs over a duplicate of mpi4py's
MPI_COMM_WORLD. A failing test aborts the whole job (mpi4py's advice): a rank that went on
alone would wait for collectives its peers never start."""

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from mpi4py import MPI  # noqa: E402

import pytest  # noqa: E402

import mlsl_tf as hvd  # noqa: E402

hvd.init()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and not getattr(item, "_mlsl_may_fail", False):
        sys.stderr.write(f"\n[rank {MPI.COMM_WORLD.Get_rank()}] {item.nodeid} failed:\n{report.longreprtext}\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
