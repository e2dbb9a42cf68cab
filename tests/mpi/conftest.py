"""Multi-rank tests: every rank runs the same pytest session under `mpiexec -n N`.

mpi4py is imported first on purpose, so mlsl_tf runs over a duplicate of mpi4py's
MPI_COMM_WORLD. A failing test aborts the whole job (mpi4py's advice): a rank that went on
alone would wait for collectives its peers never start.

`make test-mpi` runs every file in one session per rank count (starting TensorFlow once per rank,
not once per file): each file starts on a runtime of its own (shut down and initialised again with
the defaults), and rank 0 prints each file's seconds at the end."""

import collections
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


@pytest.fixture(scope="module", autouse=True)
def _a_runtime_of_its_own():
    """Each file starts as it would alone: a runtime initialised with the defaults, whatever the
    file before it left (its groups, names, settings)."""
    if hvd.is_initialized():
        hvd.shutdown()
    hvd.init()
    yield


_SECONDS = collections.Counter()


def pytest_runtest_logreport(report):
    _SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if MPI.COMM_WORLD.Get_rank() == 0 and len(_SECONDS) > 1:
        terminalreporter.write_line(f"seconds per file on {MPI.COMM_WORLD.Get_size()} ranks (tests only):")
        for path, seconds in _SECONDS.most_common():
            terminalreporter.write_line(f"  {seconds:6.1f}  {path}")
