"""Elastic mlslrun across emulated hosts reached through ssh (make test-ssh; root only).

mlslrun on h0 trains examples/keras_elastic.py on h0:1 and h1:2 (three workers, a discovery script
naming both hosts).  Both ranks of h1 are SIGKILLed mid-epoch and h1's sshd is stopped: the job goes
on with h0 alone; when h1's cooldown ends the ssh check finds it unreachable and blacklists it
again (a longer cooldown); its sshd is started again, and after that cooldown the job is back at
three workers and finishes.  No commit is lost.  Where the cluster cannot be built the test
fails with the reason; it never skips."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import cluster as emulated  # noqa: E402
from test_ssh_launch import TCP  # noqa: E402

EXAMPLE = os.path.join(emulated.ROOT, "examples", "keras_elastic.py")


def records(path):
    p = pathlib.Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def wait_for(what, check, proc, deadline_s=240):
    deadline = time.time() + deadline_s
    while not check():
        assert proc.poll() is None, f"the job ended while waiting for {what}"
        assert time.time() < deadline, f"no {what} within {deadline_s} s"
        time.sleep(0.2)


def test_a_host_lost_and_unreachable_then_back(tmp_path):
    with emulated.SshCluster(count=2) as c:
        hosts_file = tmp_path / "hosts.txt"
        hosts_file.write_text("h0:1\nh1:2\n")
        script = tmp_path / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
        script.chmod(0o755)
        log, err_path = tmp_path / "log.jsonl", tmp_path / "stderr"
        python = sys.executable
        argv = [python, "-m", "mlsl_tf.runner", "-np", "3", "--min-np", "1", "--host-discovery-script", str(script),
                "--blacklist-cooldown-range", "1", "1.5", "--ssh-port", str(emulated.PORT),
                "--ssh-identity-file", c.key, *TCP, python, EXAMPLE, "--log", str(log), "--epochs", "24",
                "--steps-per-epoch", "40"]
        full = ["ip", "netns", "exec", c.namespace(0), "unshare", "--uts", "sh", "-c", emulated._IN_HOST, "h0", *argv]
        env = c.env(dict(os.environ, PYTHONPATH=emulated.ROOT, TF_CPP_MIN_LOG_LEVEL="3"))
        with open(err_path, "w") as err:
            proc = subprocess.Popen(full, env=env, cwd=emulated.ROOT, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            wait_for("a commit in epoch 1", lambda: any(r["event"] == "commit" and r["epoch"] >= 1
                                                        for r in records(log)), proc)
            ranks = [pid for pid in c.pids(1) if _is_worker(pid)]
            assert len(ranks) == 2, ranks
            for pid in ranks:
                os.kill(pid, signal.SIGKILL)
            c.stop_sshd(1)
            killed = time.time()
            stderr = lambda: err_path.read_text(errors="replace")  # noqa: E731
            wait_for("h1 found unreachable", lambda: stderr().count("host h1 blacklisted") >= 2, proc)
            c.start_sshd(1)
            proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        text = err_path.read_text(errors="replace")
        lines = "\n".join(line for line in text.splitlines() if line.startswith("mlslrun"))
        print(f"\n{lines}", flush=True)
        assert proc.returncode == 0, text[-3000:]
        recs = records(log)
        sizes = [(r["generation"], r["size"]) for r in recs if r["event"] == "resume"]
        assert sizes[0] == (1, 3) and sizes[-1][1] == 3 and all(s == 1 for _, s in sizes[1:-1]), sizes
        assert len(sizes) >= 3, sizes
        assert "was killed by SIGKILL" in lines
        assert "h1:" in lines and lines.count("host h1 blacklisted") >= 2  # the ssh check's failure, named
        for g in range(2, sizes[-1][0] + 1):
            last = [r for r in recs if r["generation"] == g - 1 and r["event"] in ("resume", "commit")][-1]
            resume = next(r for r in recs if r["generation"] == g and r["event"] == "resume")
            assert (resume["epoch"], resume["batch"]) in {(last["epoch"], last["batch"]), (last["epoch"], last["batch"] + 5),
                                                          (last["epoch"] + 1, 0)}, (g, resume, last)
        done = recs[-1]
        assert done["event"] == "done" and done["accuracy"] >= 0.9, done
        full = next(r for r in recs if r["event"] == "resume" and r["generation"] == sizes[-1][0])
        print(f"back at 3 workers {full['time'] - killed:.1f} s after the kill; accuracy {done['accuracy']:.4f}")


def _is_worker(pid):
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return EXAMPLE.encode() in cmdline and b"task.py" not in cmdline
