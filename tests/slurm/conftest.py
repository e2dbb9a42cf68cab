"""tests/slurm: the repository on sys.path; SIGTERM becomes an interrupt, so teardown still removes the cluster.

The make target's `timeout` sends SIGTERM: pytest's teardown then stops the daemons and every process on
the emulated hosts and deletes their namespaces and files.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupt)
