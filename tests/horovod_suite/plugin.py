"""pytest plugin loaded on each rank of a Horovod-suite run: applies skips.SKIPS and appends each
test's outcome on this rank to $HVD_SUITE_RESULTS as a JSON line, as it happens (so a run that
is killed still leaves the outcomes of the tests before it)."""

import json
import os

import pytest

from skips import SKIPS

_OUT = os.environ.get("HVD_SUITE_RESULTS")


def _method(nodeid):
    """'test_x.py::Class::test_y[param]' -> 'Class::test_y[param]'."""
    return nodeid.split("::", 1)[-1]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HVD_SUITE_NO_SKIPS"):  # the reference run against Horovod itself
        return
    filename = os.path.basename(str(config.args[0])) if config.args else ""
    for item in items:
        reason = SKIPS.get((filename, _method(item.nodeid).split("[")[0])) or SKIPS.get(
            (filename, _method(item.nodeid)))
        if reason:
            item.add_marker(pytest.mark.skip(reason="skip list: " + reason))


def pytest_runtest_logreport(report):
    if not _OUT:
        return
    if report.when != "call" and report.outcome == "passed":
        return
    message = ""
    if report.outcome == "failed":
        message = (report.longreprtext or "").strip().splitlines()
        errors = [line for line in message if line.startswith("E ")]
        message = (errors[0] if errors else (message[-1] if message else ""))[:300]
    elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])[:300]
    with open(_OUT, "a") as f:
        context = getattr(report, "context", None)  # a unittest subTest: TF's "graph_mode" / "eager_mode"
        f.write(json.dumps({"method": _method(report.nodeid), "when": report.when, "outcome": report.outcome,
                            "mode": getattr(context, "msg", None) if context is not None else None,
                            "seconds": round(report.duration, 3), "message": message}) + "\n")
        f.flush()
