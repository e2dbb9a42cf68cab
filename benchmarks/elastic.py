"""Elastic training under failure: mlsl_tf's elastic mlslrun beside Horovod 0.28.1's elastic horovodrun.

    python benchmarks/elastic.py --runs 5 [--horovod-python <horovod-venv>/bin/python]
    python benchmarks/elastic.py --resets 20          # leaks across resets (mlsl_tf)

Fault matrix (one JSON line per run): 3 workers on two names of this machine as two hosts
(localhost:2, 127.0.0.1:1, printed by a discovery script), a small Keras `fit` with KerasState and
Horovod's three elastic callbacks (benchmarks/elastic_worker.py, the same script for both
libraries), `--blacklist-cooldown-range 1 2`; the worker on 127.0.0.1 is SIGKILLed mid-epoch.
Scenario `short`: 4 epochs of 100 steps, the kill at step 150; `long`: 2 epochs of 600 steps, the
kill at step 100, so the host's cooldown ends while the job trains.  Per run: seconds from the kill
to the next step at the reduced size, and to the first step back at full size; steps lost (done
before the kill, done again after it); outcome finished / failed / hung (no end within
--timeout).  Runs of the two libraries are interleaved.

Leak run (--resets N): the discovery script alternates between 3 and 2 slots each time a generation
has trained 20 steps, N times; per generation, mlslrun's threads, open descriptors and resident
memory, and rank 0's resident memory and threads when it starts training."""

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "elastic_worker.py"
SCENARIOS = {"short": {"epochs": 4, "steps": 100, "kill_at": 150}, "long": {"epochs": 2, "steps": 600, "kill_at": 100}}


def records(path):
    try:
        return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def worker_pids(host):
    """Training processes of elastic_worker.py whose HOROVOD_HOSTNAME is `host` (no wrappers)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        joined = b" ".join(cmdline)
        if str(WORKER).encode() in joined and b"task.py" not in joined and b"horovodrun" not in joined \
                and f"HOROVOD_HOSTNAME={host}".encode() in environ:
            out.append(int(pid))
    return out


def discovery(work, hosts):
    hosts_file = work / "hosts.txt"
    hosts_file.write_text("".join(h + "\n" for h in hosts))
    script = work / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    return script, hosts_file


def command(library, script, log, scenario, horovod_python):
    worker = [str(WORKER), "--library", library, "--step-log", str(log), "--epochs", str(scenario["epochs"]),
              "--steps", str(scenario["steps"])]
    flags = ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
             "--blacklist-cooldown-range", "1", "2"]
    if library == "mlsl_tf":
        return [sys.executable, "-m", "mlsl_tf.runner", *flags, sys.executable, *worker], dict(os.environ)
    venv_bin = pathlib.Path(horovod_python).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    return [str(venv_bin / "horovodrun"), *flags, horovod_python, *worker], env


def fault_run(library, scenario_name, timeout, horovod_python):
    scenario = SCENARIOS[scenario_name]
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        work = pathlib.Path(tmp)
        script, _ = discovery(work, ["localhost:2", "127.0.0.1:1"])
        log = work / "log.jsonl"
        cmd, env = command(library, script, log, scenario, horovod_python)
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        start = time.time()
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                               start_new_session=True, text=True, errors="replace")
        lines = []  # (arrival time, line) of the launcher's stderr
        reader = threading.Thread(target=lambda: [lines.append((time.time(), line)) for line in job.stderr],
                                  daemon=True)
        reader.start()
        killed_at, outcome = None, None
        try:
            while time.time() < start + timeout:
                if job.poll() is not None:
                    break
                if killed_at is None and any(r.get("step", 0) >= scenario["kill_at"] for r in records(log)
                                             if r["event"] == "step"):
                    pids = worker_pids("127.0.0.1")
                    if pids:
                        os.kill(pids[0], signal.SIGKILL)
                        killed_at = time.time()
                time.sleep(0.05)
            if job.poll() is None:
                outcome = "hung"
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            else:
                outcome = "finished" if job.returncode == 0 else f"failed (exit {job.returncode})"
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        reader.join(5)
        recs = records(log)
        stderr_tail = "".join(line for _, line in lines)[-400:] if outcome != "finished" else ""
    line = {"library": library, "scenario": scenario_name, "outcome": outcome, "killed": killed_at is not None,
            "seconds": round(time.time() - start, 1)}
    if killed_at is not None:
        steps = [r for r in recs if r["event"] == "step"]
        reduced = next((r for r in steps if r["time"] > killed_at and r["size"] < 3), None)
        full = next((r for r in steps if reduced and r["time"] > reduced["time"] and r["size"] == 3), None)
        before = [r["step"] for r in steps if r["time"] <= killed_at]
        resumed = next((r for r in recs if r["event"] == "start" and r["time"] > killed_at), None)
        line.update({
            "kill_to_next_step_s": round(reduced["time"] - killed_at, 2) if reduced else None,
            "kill_to_full_size_s": round(full["time"] - killed_at, 2) if full else None,
            "steps_lost": (max(before) - resumed["step"]) if before and resumed else None,
        })
        if library == "mlsl_tf":  # where the time goes: the driver's own lines
            def after(words):
                t = next((t for t, line in lines if t >= killed_at and words in line), None)
                return round(t - killed_at, 2) if t else None
            line.update({"detected_s": after("resetting the other workers"), "relaunched_s": after("generation 2 on"),
                         "resumed_s": round(resumed["time"] - killed_at, 2) if resumed else None})
    if stderr_tail:
        line["stderr_tail"] = stderr_tail
    return line


def leak_run(resets, timeout):
    """mlsl_tf only: N resets by discovery, measuring the driver and rank 0 per generation."""
    with tempfile.TemporaryDirectory(prefix="elastic-leak-") as tmp:
        work = pathlib.Path(tmp)
        script, hosts_file = discovery(work, ["localhost:2", "127.0.0.1:1"])
        log = work / "log.jsonl"
        cmd, env = command("mlsl_tf", script, log, {"epochs": 1000, "steps": 100}, None)
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               start_new_session=True)
        out, start, seen = [], time.time(), 0
        try:
            while len(out) <= resets and time.time() < start + timeout and job.poll() is None:
                starts = [r for r in records(log) if r["event"] == "start"]
                if len(starts) > seen:
                    s = starts[seen]
                    steps = [r for r in records(log) if r["event"] == "step" and r["time"] > s["time"]]
                    if len(steps) >= 20:
                        proc = pathlib.Path(f"/proc/{job.pid}")
                        rss = next(int(line.split()[1]) for line in (proc / "status").read_text().splitlines()
                                   if line.startswith("VmRSS:")) / 1024
                        out.append({"generation": seen + 1, "size": s["size"],
                                    "driver_threads": len(os.listdir(proc / "task")),
                                    "driver_fds": len(os.listdir(proc / "fd")), "driver_rss_mib": round(rss, 1),
                                    "rank0_rss_mib": round(s["rss_mib"], 1), "rank0_threads": s["threads"]})
                        print(json.dumps(out[-1]), flush=True)
                        seen += 1
                        hosts_file.write_text("localhost:2\n" if seen % 2 else "localhost:2\n127.0.0.1:1\n")
                time.sleep(0.1)
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--scenarios", default="short,long")
    p.add_argument("--horovod-python", help="the interpreter of a venv with Horovod 0.28.1 (with Gloo)")
    p.add_argument("--timeout", type=float, default=180, help="seconds a run may take before it counts as hung")
    p.add_argument("--resets", type=int, help="instead: the leak run, this many resets")
    p.add_argument("--summarize", nargs="+", metavar="JSONL",
                   help="instead: the fault matrix of the run lines in these files (runs of several sessions)")
    args = p.parse_args()
    if args.summarize:
        lines = [json.loads(line) for path in args.summarize for line in open(path) if line.strip()]
        summarize([r for r in lines if "scenario" in r and "outcome" in r and "summary" not in r])
        return 0
    if args.resets:
        gens = leak_run(args.resets, args.timeout * 10)
        if len(gens) > 1:
            first, last = gens[1], gens[-1]  # generation 1 has no reset behind it
            print(json.dumps({"summary": "leaks", "resets": len(gens) - 1,
                              **{f"{k}_first_last": [first[k], last[k]] for k in first if k not in ("generation",)}}))
        return 0
    libraries = ["mlsl_tf"]
    if args.horovod_python:
        libraries.append("horovod")
    else:
        print(json.dumps({"library": "horovod", "skipped": True, "why": "no --horovod-python"}), flush=True)
    results = []
    for _ in range(args.runs):
        for scenario in args.scenarios.split(","):
            for library in libraries:
                line = fault_run(library, scenario, args.timeout, args.horovod_python)
                results.append(line)
                print(json.dumps(line), flush=True)
    summarize(results)
    return 0


def summarize(results):
    """Prints the fault matrix of `results` (run lines): one line per library and scenario."""
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        for library in dict.fromkeys(r["library"] for r in results):
            rs = [r for r in results if r["library"] == library and r["scenario"] == scenario]
            if not rs:
                continue

            def med(key):
                vals = [r[key] for r in rs if r.get(key) is not None]
                return round(statistics.median(vals), 2) if vals else None
            print(json.dumps({"summary": "fault_matrix", "library": library, "scenario": scenario, "runs": len(rs),
                              "outcomes": {o: sum(1 for r in rs if r["outcome"] == o) for o in {r["outcome"] for r in rs}},
                              "kill_to_next_step_s_median": med("kill_to_next_step_s"),
                              "kill_to_full_size_s_median": med("kill_to_full_size_s"),
                              "steps_lost_median": med("steps_lost")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
