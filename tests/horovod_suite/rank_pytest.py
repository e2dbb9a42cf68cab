"""One rank of a Horovod-suite run: pytest on one test file with plugin.py; always exits 0 (the
outcomes are in the results file, and a non-zero exit would make the launcher stop the others)."""

import os
import sys

import pytest


def main():
    test_file, results_prefix = sys.argv[1], sys.argv[2]
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    os.environ["HVD_SUITE_RESULTS"] = f"{results_prefix}.rank{rank}.jsonl"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    code = pytest.main([test_file, "-p", "plugin", "-p", "no:cacheprovider", "-q", "-rN",
                        "-W", "ignore::DeprecationWarning", *sys.argv[3:]])
    print(f"rank {rank}: pytest exit code {int(code)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
