"""The Horovod-suite runner's counting (tests/horovod_suite/run.py), on made-up outcome files:
how graph/eager modes, ranks, skips and missing ranks combine into one outcome per method."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "horovod_suite"))

import run as suite  # noqa: E402
import skips  # noqa: E402


def write(prefix, rank, records):
    with open(f"{prefix}.rank{rank}.jsonl", "w") as f:
        for method, outcome, mode in records:
            f.write(json.dumps({"method": method, "when": "call", "outcome": outcome, "mode": mode,
                                "message": f"{outcome} in {mode}"}) + "\n")


def test_modes_decide_and_any_failure_fails(tmp_path):
    prefix = tmp_path / "t.np2"
    common = [("T::graph_only", "passed", "graph_mode"), ("T::graph_only", "skipped", "eager_mode"),
              ("T::graph_only", "passed", None),
              ("T::gpu", "skipped", "graph_mode"), ("T::gpu", "skipped", "eager_mode"), ("T::gpu", "passed", None),
              ("T::keras", "passed", None)]
    write(prefix, 0, common + [("T::flaky", "passed", "graph_mode"), ("T::flaky", "passed", None)])
    write(prefix, 1, common + [("T::flaky", "failed", "graph_mode"), ("T::flaky", "failed", None),
                               ("T::only_rank1", "passed", None)])
    got = suite.method_outcomes(prefix, 2)
    assert got["T::graph_only"][0] == "passed"  # a mode passed, none failed
    assert got["T::gpu"][0] == "skipped"  # both modes skipped: the method's own "passed" does not count
    assert got["T::keras"][0] == "passed"  # no modes: the method's outcome
    assert got["T::flaky"] == ("failed", "rank 1: failed in graph_mode")
    assert got["T::only_rank1"][0] == "unfinished"


def test_skip_list_entries_name_a_reason_and_a_file():
    for (test_file, method), reason in list(skips.SKIPS.items()) + list(skips.DIFFERENT.items()):
        assert test_file in suite.FILES and "::" in method and len(reason) > 20
    ported = [r for r in skips.SKIPS.values() if "ported:" in r]
    root = Path(__file__).resolve().parents[2]
    for reason in ported:  # every port named exists
        path, _, test = reason.split("ported: ")[1].partition("::")
        assert test.split("[")[0] in (root / path).read_text(), reason
