"""The timeline's environment variables and init-time errors in one small mpiexec job of 2 ranks:
HOROVOD_TIMELINE / HOROVOD_TIMELINE_MARK_CYCLES honoured (the file read while the job runs),
MLSL_TF_TIMELINE and HOROVOD_TIMELINE disagreeing, an unwritable path failing init on every
rank (no rank left waiting), start/stop_timeline before init (the run-time API:
tests/mpi/test_timeline_api.py)."""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

PROGRAM = r"""
import json, os, sys, time
import tensorflow as tf
import mlsl_tf as hvd
from mlsl_tf import timeline
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
out = {}

def refused(**env):
    for k, v in env.items():
        os.environ[k] = v
    try:
        hvd.init()
        hvd.shutdown()
        return None
    except RuntimeError as e:
        return str(e)
    finally:
        for k in env:
            del os.environ[k]

# before init: Horovod's error class (ValueError)
for fn, args in (("start_timeline", ("/tmp/x.json",)), ("stop_timeline", ())):
    try:
        getattr(hvd, fn)(*args)
    except ValueError as e:
        out[fn] = [type(e).__name__, str(e)]
missing = os.path.join(os.environ["TL_DIR"], "no", "dir")
out["disagree"] = refused(MLSL_TF_TIMELINE="/a.json", HOROVOD_TIMELINE="/b.json")
out["bad_mark"] = refused(HOROVOD_TIMELINE_MARK_CYCLES="sometimes")
out["bad_path"] = refused(MLSL_TF_TIMELINE=os.path.join(missing, "t.json"))
out["bad_rank_path"] = refused(HOROVOD_TIMELINE=os.path.join(missing, "t{rank}.json"))
out["dynamic"] = refused(HOROVOD_TIMELINE="DYNAMIC", MLSL_TF_TIMELINE_MARK_CYCLES="1",
                         HOROVOD_TIMELINE_MARK_CYCLES="true")

path = os.environ["TL_PATH"]
os.environ.update(HOROVOD_TIMELINE=path, HOROVOD_TIMELINE_MARK_CYCLES="1")
hvd.init()
out["setting"] = hvd.settings()["MLSL_TF_TIMELINE"].value
hvd.allreduce(tf.ones([10]), name="env.sum")
hvd.broadcast(tf.ones([10]), root_rank=1, name="env.bcast")
if rank == 0:
    deadline = time.monotonic() + 20
    while True:  # read while the job runs: no stop_timeline, no shutdown yet
        t = timeline.parse(timeline.load_events(path))
        found = {n: bool(t.activity(n, tensor)) for n, tensor in (
            ("NEGOTIATE_ALLREDUCE", "env.sum"), ("ALLREDUCE", "env.sum"), ("NEGOTIATE_BROADCAST", "env.bcast"),
            ("BROADCAST", "env.bcast"))}
        found["CYCLE_START"] = bool(t.cycle_starts)
        if all(found.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    out["found"] = found
hvd.allreduce(tf.ones([1]), name="env.done")
hvd.shutdown()
if rank == 0:
    text = open(path).read()
    out["closed"] = text.endswith("]\n") and isinstance(json.loads(text), list)
out["cwd_files"] = sorted(os.listdir("."))
sys.stdout.write("RESULT %d %s\n" % (rank, json.dumps(out)))  # one write: the ranks share mpiexec's stdout
sys.stdout.flush()
"""


def test_environment_variables_and_init_errors(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "HOROVOD_", "PMI_", "HYD"))}
    path = str(tmp_path / "env.json")
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", TL_DIR=str(tmp_path), TL_PATH=path)
    work = tmp_path / "cwd"
    work.mkdir()
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", PROGRAM], env=env, cwd=work, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # a rank's line may still land inside the other's: split the output at every marker
    results = {int(m.group(1)): json.JSONDecoder().raw_decode(m.group(2))[0]
               for m in re.finditer(r"RESULT (\d+) (\{(?:(?!RESULT ).)*)", r.stdout, re.S)}
    assert sorted(results) == [0, 1], r.stdout[-3000:] + r.stderr[-3000:]
    missing = os.path.join(str(tmp_path), "no", "dir")
    for rank, out in results.items():
        for fn in ("start_timeline", "stop_timeline"):
            assert out[fn][0] == "NotInitializedError" and "init()" in out[fn][1]
        assert "MLSL_TF_TIMELINE=/a.json and HOROVOD_TIMELINE=/b.json disagree" in out["disagree"]
        assert "HOROVOD_TIMELINE_MARK_CYCLES=sometimes is not valid: expected one of 1, 0" in out["bad_mark"]
        # every rank fails init with the writing rank's error: the variable, the rank, the file
        assert out["bad_path"].startswith("mlsl_tf.init() failed: mlsl_tf: rank 0 cannot write the timeline file "
                                          f"'{missing}/t.json': No such file or directory "
                                          f"(MLSL_TF_TIMELINE={missing}/t.json)"), out["bad_path"]
        assert f"rank 0 cannot write the timeline file '{missing}/t0.json'" in out["bad_rank_path"]
        assert "(HOROVOD_TIMELINE=" in out["bad_rank_path"] and "(and 1 other rank)" in out["bad_rank_path"]
        assert out["dynamic"] is None  # DYNAMIC: no file now; "1" and "true" mean the same
        assert out["setting"] == path
        assert out["cwd_files"] == []  # no file named DYNAMIC (or anything else) appeared
    assert results[0]["found"] == dict.fromkeys(
        ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "NEGOTIATE_BROADCAST", "BROADCAST", "CYCLE_START"], True)
    assert results[0]["closed"]
