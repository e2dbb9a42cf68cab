"""guard.py, the launcher's keeper: no process of a launch outlives it -- not those the launcher
left in sessions of their own (as hydra's proxies and the rank wrappers are), not those a
launcher still starts when mlslrun dies -- and it ends as the launcher did."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

from mlsl_tf.runner import launch

TIMEOUT_S = 60


def _marked(marker):
    """Live processes whose environment holds MLSL_GUARD_TEST=marker."""
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"MLSL_GUARD_TEST={marker}".encode() in (d / "environ").read_bytes().split(b"\0"):
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _launcher(source):
    return [sys.executable, "-c", textwrap.dedent(source)]


def _env(marker):
    return {**os.environ, "MLSL_GUARD_TEST": marker}


# A launcher like hydra: each "proxy" in a session of its own, started one after another.
SPAWNER = """
    import subprocess, sys, time
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    i = 0
    while n == 0 or i < n:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        i += 1
        time.sleep(0.02)
    print("started", flush=True)
    sys.exit(3)
"""


def _wait_gone(marker, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _marked(marker):
        time.sleep(0.1)
    return _marked(marker)


def _cleanup(marker):
    for pid in _marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_what_the_launcher_left_is_killed_and_its_code_kept():
    marker = f"left-{os.getpid()}"
    try:
        proc = subprocess.run([sys.executable, "-S", launch.GUARD_PY, *_launcher(SPAWNER), "5"],
                              env=_env(marker), capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 3 and "started" in proc.stdout
        assert _wait_gone(marker, 2) == [], "processes the launcher left in their own sessions survived"
    finally:
        _cleanup(marker)


def test_mlslrun_killed_while_the_launcher_still_starts_processes():
    """mlslrun (here a Python parent) is SIGKILLed while the launcher keeps starting processes in
    sessions of their own: every one of them, and the launcher, ends within seconds."""
    marker = f"forking-{os.getpid()}"
    parent_src = f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-S", {launch.GUARD_PY!r}, sys.executable, "-c", {textwrap.dedent(SPAWNER)!r}])
        time.sleep(120)
    """
    parent = subprocess.Popen(_launcher(parent_src), env=_env(marker))
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(_marked(marker)) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_marked(marker)) >= 8, "the launcher did not start"
        parent.kill()
        parent.wait(10)
        assert _wait_gone(marker) == [], "processes of the launch outlived mlslrun"
    finally:
        if parent.poll() is None:
            parent.kill()
        _cleanup(marker)


def test_kill_request_and_forwarded_signals():
    marker = f"signals-{os.getpid()}"
    try:
        # SIGUSR1 (mlslrun's kill): everything below the guard, the guard ending by SIGKILL
        guard = subprocess.Popen([sys.executable, "-S", launch.GUARD_PY, *_launcher(SPAWNER)], env=_env(marker),
                                 start_new_session=True)
        deadline = time.monotonic() + TIMEOUT_S
        while len(_marked(marker)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        guard.send_signal(launch.GUARD_KILL)
        assert guard.wait(TIMEOUT_S) == -signal.SIGKILL
        assert _wait_gone(marker, 2) == []
        # SIGTERM goes to the launcher, which ends as it chooses
        ready = f"/tmp/guard-ready-{os.getpid()}"
        src = f"""
            import signal, sys, time
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
            open({ready!r}, "w").close()
            time.sleep(120)
        """
        guard = subprocess.Popen([sys.executable, "-S", launch.GUARD_PY, *_launcher(src)], env=_env(marker))
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(TIMEOUT_S) == 7
        os.unlink(ready)
    finally:
        _cleanup(marker)
