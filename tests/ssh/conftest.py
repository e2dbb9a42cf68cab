"""tests/ssh: the repository first on sys.path, and SIGTERM (the make target's timeout) turned into an interrupt, so pytest's teardown still removes the emulated hosts."""

import os
import signal
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupt)
