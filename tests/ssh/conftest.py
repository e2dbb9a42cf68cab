"""tests/ssh: the repository on sys.path; SIGTERM becomes an interrupt, so teardown still removes the hosts.

The make target's `timeout` sends SIGTERM: pytest's teardown then stops the emulated hosts' processes and
deletes their namespaces, files and keys.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupt)
