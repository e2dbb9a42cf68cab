"""The launcher's keeper: runs mpiexec (or srun) and leaves no process of the launch behind.

Run by file path, ``python .../mlsl_tf/runner/guard.py LAUNCHER ARGS...``, standard library only.
MPICH's hydra puts its proxies and the rank wrappers in sessions of their own, so no process
group holds a launch, and a proxy still starting ranks when mpiexec dies goes on starting them.
This process is a child subreaper (Linux): whatever of the launch loses its parent becomes its
child, so when the launcher ends -- or mlslrun asks, or mlslrun dies -- it kills every process
below it, and the ones they were still starting, before it exits.

  * SIGINT / SIGTERM from mlslrun go to the launcher (mlslrun forwards a user's first Ctrl-C);
  * SIGUSR1 from mlslrun: kill the launch now (SIGKILL to every process below this one);
  * mlslrun gone (SIGUSR2, this process's death signal, or its parent changed): the same;
  * the launcher ended: what is left below is killed, and this process ends as the launcher did
    (its exit code, or the same signal).
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_NOW = signal.SIGUSR1  # mlslrun: kill the launch
PARENT_GONE = signal.SIGUSR2  # the death signal: mlslrun died
SWEEP_S = 10.0  # the longest a sweep keeps finding new processes (a proxy forking) before it gives up


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (from /proc), parents before their children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def reap() -> None:
    """Collect every child that has ended (orphans of the launch are this process's children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep() -> None:
    """SIGKILL every process below this one until none is left: a process started in between
    becomes this subreaper's child (its parent killed) and the next round finds it. The launcher
    must have been waited for: reap() collects any child."""
    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        left = descendants(os.getpid())
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: guard.py LAUNCHER [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop = {"kill": False}

    def kill_now(_signum, _frame):
        stop["kill"] = True

    signal.signal(KILL_NOW, kill_now)
    signal.signal(PARENT_GONE, kill_now)
    _prctl(PR_SET_PDEATHSIG, int(PARENT_GONE))
    if os.getppid() != parent:  # mlslrun died before the death signal was set
        return 1
    try:
        proc = subprocess.Popen(argv, start_new_session=True)
    except OSError as e:
        print(f"mlslrun: error: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 127

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    code = None
    while code is None:
        if stop["kill"] or os.getppid() != parent:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = proc.wait()
            break
        try:
            code = proc.wait(0.1)
        except subprocess.TimeoutExpired:
            pass
    sweep()
    reap()
    if code < 0:  # end as the launcher did: by the same signal
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
