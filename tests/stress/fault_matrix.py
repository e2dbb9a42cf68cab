"""The launcher's fault matrix: one 2-rank mlsl_tf job per fault, a table of how each ended.

    PYTHONPATH=$PWD .venv/bin/python tests/stress/fault_matrix.py [--root TREE] [FAULT ...]

For each fault (something done to rank 1, to both ranks, or to mlslrun while both ranks
train) it prints mlslrun's exit code, the seconds from the fault until every process of the
job (mlslrun, mpiexec, hydra proxies, wrappers, ranks) was gone, and mlslrun's summary line
(else the first ``mlslrun:`` line of its stderr) and the rank it names.  Job processes are found by a marker variable in
their environment.  --root runs another tree's mlsl_tf (e.g. an unchanged copy, for
"before").  Not part of `make test`: the faults take about a minute each on a loaded machine.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[2]
GIVE_UP_S = 60.0  # a job still running this long after the fault counts as left behind

WORKER = r"""
import os, signal, sys, time
RANK = int(os.environ["PMI_RANK"])
D = os.environ["FM_DIR"]
FAULT = os.environ["FM_FAULT"]
import mlsl_tf as hvd
hvd.init()
import tensorflow as tf
hvd.allreduce(tf.ones([4]), name="warm_up")
open(f"{D}/ready.{RANK}", "w").close()

@tf.function
def mismatched():
    return hvd.allreduce(tf.ones([RANK + 1]), name="mismatch")

def fault_now():
    with open(f"{D}/fault_at", "w") as f:
        f.write(repr(time.time()))

step = 0
while True:
    step += 1
    if step == 30 and FAULT == "tf_function":
        if RANK == 1:
            fault_now()
        mismatched()
    if step == 30 and RANK == 1 and FAULT in ("raise", "sigkill_rank", "os_exit0", "sys_exit3"):
        fault_now()
        if FAULT == "raise":
            raise ValueError("rank 1 raised")
        if FAULT == "sigkill_rank":
            os.kill(os.getpid(), signal.SIGKILL)
        if FAULT == "os_exit0":
            os._exit(0)
        if FAULT == "sys_exit3":
            sys.exit(3)
    hvd.allreduce(tf.ones([1024]), name="step")
    time.sleep(0.05)
"""

# fault -> what is done, to whom
FAULTS = {
    "raise": "rank 1 raises ValueError",
    "sigkill_rank": "rank 1 SIGKILLs itself",
    "sigint_mlslrun": "SIGINT (Ctrl-C) to mlslrun",
    "sigkill_mlslrun": "SIGKILL to mlslrun",
    "os_exit0": "rank 1 calls os._exit(0)",
    "sys_exit3": "rank 1 calls sys.exit(3)",
    "tf_function": "both ranks: allreduce of mismatched shapes inside tf.function",
}


def job_pids(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries FM_TAG=tag."""
    needle = f"FM_TAG={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def run_fault(fault: str, root: pathlib.Path) -> dict:
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as d:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "MLSL_TF_"))}
        env.update(PYTHONPATH=str(root), FM_TAG=tag, FM_DIR=d, FM_FAULT=fault)
        out, err = open(f"{d}/out", "w"), open(f"{d}/err", "w")
        proc = subprocess.Popen([sys.executable, "-m", "mlsl_tf.runner", "-np", "2", sys.executable, "-c", WORKER],
                                env=env, cwd=d, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        fault_at = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if fault.endswith("_mlslrun") and all(os.path.exists(f"{d}/ready.{r}") for r in (0, 1)):
                time.sleep(1.0)
                fault_at = time.time()
                proc.send_signal(signal.SIGINT if fault == "sigint_mlslrun" else signal.SIGKILL)
                break
            if os.path.exists(f"{d}/fault_at"):
                break
            time.sleep(0.05)
        gone_at = None
        while time.time() < (fault_at or time.time()) + GIVE_UP_S:
            proc.poll()  # reap mlslrun: a zombie has no environment to match
            if fault_at is None and os.path.exists(f"{d}/fault_at"):
                try:
                    fault_at = float(pathlib.Path(f"{d}/fault_at").read_text())
                except ValueError:
                    pass
            if not job_pids(tag):
                gone_at = time.time()
                break
            time.sleep(0.1)
        left = job_pids(tag)
        for pid in left:  # processes this script started, left behind by the job
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            code = None
        out.close()
        err.close()
        stderr = pathlib.Path(f"{d}/err").read_text(errors="replace")
        lines = [l for l in stderr.splitlines() if l.startswith("mlslrun: ")]
        # mlslrun's own summary, else the first rank's wrapper's line
        lines = [l for l in lines if re.search(r"job (failed|stopped)|stopping the", l)] + lines
        named = re.search(r"rank (\d+) \(host", lines[0]) if lines else None
        seconds = None if gone_at is None or fault_at is None else round(gone_at - fault_at, 1)
        return {"fault": fault, "done": FAULTS[fault], "exit_code": code if code is None or code >= 0 else 128 - code,
                "seconds_until_gone": seconds if left == [] else f">{GIVE_UP_S:.0f} ({len(left)} left)",
                "named_rank": int(named.group(1)) if named else None,
                "summary": lines[0][:300] if lines else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(REPO), help="tree whose mlsl_tf to run (default: this one)")
    p.add_argument("faults", nargs="*", metavar="FAULT", help=f"some of {', '.join(FAULTS)} (default: all)")
    ns = p.parse_args()
    unknown = [f for f in ns.faults if f not in FAULTS]
    if unknown:
        p.error(f"unknown fault {unknown[0]!r}; choose from {', '.join(FAULTS)}")
    rows = []
    for fault in ns.faults or list(FAULTS):
        row = run_fault(fault, pathlib.Path(ns.root).resolve())
        print("FAULT " + json.dumps(row), flush=True)
        rows.append(row)
    print("\n| fault | exit code | s until all gone | rank named | summary line |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['done']} | {r['exit_code']} | {r['seconds_until_gone']} | {r['named_rank']} | "
              f"{(r['summary'] or '').replace('|', '/')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
