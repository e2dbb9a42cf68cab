"""Stress tests (`make stress`, not in the default CI): each test launches mlslrun jobs as a
user would and asserts on what they print and how they end; figures go to stdout as JSON lines
(run with -s to see them)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "OMPI_", "MLSL_TF_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture
def mlslrun():
    """mlslrun(np, *command, timeout=) -> (CompletedProcess, seconds); a hang fails the test."""
    def run(np_, *command, timeout=900):
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "mlsl_tf.runner", "-np", str(np_), *map(str, command)],
                           env=_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        return r, time.monotonic() - start
    return run


def records(stdout, tag):
    """The JSON objects of the lines that start with `tag` (after mlslrun's `[R]<stdout>:`)."""
    lines = (re.sub(r"^\[\d+\]<stdout>:", "", line) for line in stdout.splitlines())
    return [json.loads(line[len(tag) + 1:]) for line in lines if line.startswith(tag + " ")]


def report(**figures):
    print("STRESS " + json.dumps(figures), flush=True)
