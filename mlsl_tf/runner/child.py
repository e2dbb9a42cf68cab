"""The rank's command as a child process: start it, forward signals to it, stop it when the launcher is gone.

Its own process group, a CPU affinity, a death signal, output through output.Pump.  Standard library
only: the rank wrapper (task.py) loads it before every rank's command."""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Optional, Sequence

from mlsl_tf.runner import output

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1
_TEE_JOIN_S = 10.0  # how long to wait for output still buffered after the command exits
LAUNCHER_GONE_GRACE_S = 2.0  # after the parent vanished: SIGTERM, then SIGKILL this much later
_PARENT_POLL_S = 0.25


def _preexec_fn(cpus: Optional[set[int]] = None) -> Optional[Callable[[], None]]:
    """A preexec_fn that makes the child get SIGKILL when the wrapper dies and, with
    ``cpus``, restricts it to those CPUs before it execs.

    The death signal is Linux only (prctl PR_SET_PDEATHSIG), skipped where prctl is
    unavailable.  Looked up before fork so the child only makes the calls.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    if prctl is None and cpus is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the wrapper died before prctl took effect
                os.kill(os.getpid(), signal.SIGKILL)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return preexec


class Child:
    """The user's command as a child process, its output copiers and signal forwarding."""

    def __init__(self, command: Sequence[str], output_dir: Optional[str], cpus: Optional[set[int]] = None,
                 tag_rank: Optional[int] = None):
        self.forwarded: Optional[int] = None
        self._threads: list[threading.Thread] = []
        self._files: list[BinaryIO] = []
        pipe = subprocess.PIPE if output_dir is not None or tag_rank is not None else None
        # close_fds=False: the process manager's PMI connection (hydra's PMI_FD)
        # is an inherited descriptor the command's MPI_Init must still find.
        self.proc = subprocess.Popen(list(command), stdout=pipe, stderr=pipe,
                                     close_fds=False, process_group=0,
                                     preexec_fn=_preexec_fn(cpus))
        if pipe is not None:
            for name, stream, console in (("stdout", self.proc.stdout, sys.stdout),
                                          ("stderr", self.proc.stderr, sys.stderr)):
                f = None
                if output_dir is not None:
                    f = open(os.path.join(output_dir, name), "wb")
                    self._files.append(f)
                fd = os.dup(stream.fileno())
                stream.close()
                console.flush()
                tag = None if tag_rank is None else output.output_tag(tag_rank, name)
                t = threading.Thread(target=output.Pump(fd, console.fileno(), f, tag).run, daemon=True)
                t.start()
                self._threads.append(t)

    def forward(self, signum: int, _frame=None) -> None:
        """Signal handler: pass signum on to the command."""
        self.forwarded = signum
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def stop_orphaned(self) -> None:
        """The wrapper's parent is gone: SIGTERM the command now, SIGKILL its process group
        LAUNCHER_GONE_GRACE_S later if it is still there."""
        if self.forwarded is None:
            self.forward(signal.SIGTERM)
        deadline = time.monotonic() + LAUNCHER_GONE_GRACE_S
        while time.monotonic() < deadline:
            if pid_gone(self.proc.pid):
                return
            time.sleep(0.05)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int:
        """Wait for the command and its output; returns Popen's returncode."""
        while True:
            try:
                code = self.proc.wait()
                break
            except InterruptedError:
                continue
        for t in self._threads:
            t.join(_TEE_JOIN_S)
        for f in self._files:
            f.close()
        return code


def pid_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts as gone); never reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


def die_with_parent(parent: int) -> bool:
    """Ask Linux for SIGTERM when the parent that started this wrapper exits (PR_SET_PDEATHSIG;
    skipped where prctl is missing); False when that parent is gone already."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent


def watch_parent(parent: int, child: Child, warn: Callable[[str], None]) -> None:
    """Thread: stop the command once the wrapper's parent has changed (it died)."""
    while os.getppid() == parent:
        if pid_gone(child.proc.pid):
            return
        time.sleep(_PARENT_POLL_S)
    warn("the launcher is gone; stopping the command")
    child.stop_orphaned()
