"""mlslrun --autotune end to end on 2 ranks: the flags reach every rank, the ranks search, agree on
every change and freeze the same values, and rank 0's log says what was tried and what won
(docs/autotune.md)."""

import csv
import json
import os
import pathlib
import subprocess
import sys

import pytest

from mlsl_tf.runner import installed

REPO = pathlib.Path(__file__).resolve().parents[2]

PROGRAM = """
import json
import tensorflow as tf
import mlsl_tf as hvd
hvd.init()
a, b = tf.ones([20000]), tf.ones([300])
for step in range(60):  # the same number of steps on every rank
    hvd.allreduce(a, name="grad.a")
    hvd.allreduce(b, name="grad.b")
hvd.allreduce(b, name="done").numpy()
print("AUTOTUNE " + json.dumps(hvd.stats()["autotune"], sort_keys=True), flush=True)
"""


@pytest.mark.skipif(installed.find_mpiexec() is None, reason="no mpiexec found")
def test_mlslrun_autotune_searches_agrees_and_logs(tmp_path):
    log = tmp_path / "tune.csv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "HOROVOD_", "SLURM_", "PMI_"))}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-m", "mlsl_tf.runner", "-np", "2", "--autotune", "--autotune-log-file",
                        str(log), "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "2",
                        sys.executable, "-c", PROGRAM],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    states = [json.loads(line.split("AUTOTUNE ", 1)[1]) for line in r.stdout.splitlines() if "AUTOTUNE " in line]
    assert len(states) == 2 and states[0] == states[1], r.stdout
    state = states[0]
    assert state["enabled"] and state["frozen"] and state["tuned"] == ["MLSL_TF_INFLIGHT", "MLSL_TF_SPIN_US"]
    rows = list(csv.reader(log.open()))
    assert rows[0][:4] == ["kind", "sample", "cycle", "step"]
    samples = [row for row in rows[1:] if row[0] == "sample"]
    start_won = min(samples, key=lambda row: float(row[6])) is samples[0]  # else the winner is confirmed
    assert [row[0] for row in rows[1:]] == ["sample"] * 8 + ([] if start_won else ["confirm"] * 4) + ["final"]
    assert [int(v) for v in rows[-1][4:6]] == [state["values"]["MLSL_TF_INFLIGHT"], state["values"]["MLSL_TF_SPIN_US"]]
    assert int(rows[-1][2]) == state["applied"][-1][0]  # the cycle every rank froze in
