"""The rank's PMI connection relayed through the wrapper, which sees whether the rank finalized MPI.

PMI_FD: MPICH's and Intel MPI's hydra, SLURM's pmi2.  The bytes pass unchanged; the wrapper only reads
the names of the commands the rank sends (init ... finalize).  Standard library only: the rank
wrapper (task.py) loads it."""

import os
import select
import socket
import threading
from typing import Mapping, Optional

# The process manager's PMI connection: a socket the command's MPI_Init finds by this number.
PMI_FD_ENV = "PMI_FD"
# PmiRelay.state(), RankStatus.mpi: what the command did on that connection.
MPI_FINALIZED = "finalized"  # it started MPI and finalized it (PMI finalize) before it ended
MPI_NOT_FINALIZED = "not finalized"  # it started MPI and ended without finalizing it
MPI_UNUSED = "unused"  # it never started MPI (sent no PMI command)
_PENDING_MAX = 1 << 20  # more bytes than this without a whole PMI command: stop reading names
END_WAIT_S = 1.0  # after the command exited, how long its PMI connection may take to close


def pmi_commands(data: bytes) -> tuple[list[str], bytes]:
    """(names of the whole PMI commands at the start of ``data``, the bytes after them) (pure).

    A PMI client sends its process manager commands in one of three forms: PMI-1
    ``cmd=NAME k=v ...`` up to a newline, PMI-1 ``mcmd=NAME`` lines up to ``endcmd``
    (spawn), and PMI-2, a 6-character decimal length and then ``cmd=NAME;k=v;...``.
    Raises ValueError for bytes in none of these forms.
    """
    names: list[str] = []
    while len(data) >= 6:  # the shortest command, and PMI-2's length field
        if data.startswith(b"cmd="):
            end = data.find(b"\n")
            if end < 0:
                break
            name, data = data[4:end].split(b" ", 1)[0], data[end + 1:]
        elif data.startswith(b"mcmd="):
            end = data.find(b"endcmd\n")
            if end < 0:
                break
            name, data = data[5:end].split(b"\n", 1)[0], data[end + len(b"endcmd\n"):]
        else:
            try:
                length = int(data[:6])
            except ValueError:
                raise ValueError(f"not a PMI command: {data[:40]!r}") from None
            if length < 0 or (len(data) >= 6 + length and not data[6:].startswith(b"cmd=")):
                raise ValueError(f"not a PMI-2 command: {data[:40]!r}")
            if len(data) < 6 + length:
                break
            name, data = data[10:6 + length].split(b";", 1)[0], data[6 + length:]
        names.append(name.strip().decode("ascii", "replace"))
    return names, data


class PmiRelay:
    """Passes the command's PMI connection to the launcher through this wrapper, reading the
    names of the commands it sends: whether it started MPI (any command) and whether it
    finalized it (``finalize``: MPI_Finalize) before it ended.

    The command gets one end of a new socket pair as its PMI_FD; a thread copies bytes both
    ways between the other end and the launcher's socket, unchanged.  When the launcher closes
    its end, the command's end is shut for writing, so the command reads the end too.  The
    launcher's socket stays open until this wrapper exits, as it did when the wrapper only
    inherited it: hydra kills every rank (this wrapper too) when it closes after MPI started
    and before it finalized, and the wrapper must write the rank's status first.
    """

    def __init__(self, upstream_fd: int, on_start=None):
        # A copy: the socket object closes it when it is collected (main() returning), but
        # upstream_fd itself is never closed here, so the launcher sees its end close only when
        # this process exits (hydra SIGKILLs every rank when a rank's closes earlier).
        copy = os.dup(upstream_fd)  # OSError when it is not open
        self._mine, self._theirs = socket.socketpair()
        try:
            self._up = socket.socket(fileno=copy)  # OSError when it is no socket
        except OSError:
            os.close(copy)
            self._mine.close()
            self._theirs.close()
            raise
        self._up.set_inheritable(False)  # the command talks through the pair only
        os.set_inheritable(upstream_fd, False)
        self._theirs.set_inheritable(True)
        self.child_fd = self._theirs.fileno()
        self._names: set[str] = set()
        self._pending = b""
        self._readable = True  # False once the command sent bytes that are no PMI command
        self._done = threading.Event()
        self._on_start = on_start  # called once, from the copying thread, at the first PMI command

    def start(self) -> None:
        """The command has started with child_fd: close this process's copy, start copying."""
        self._theirs.close()
        threading.Thread(target=self._run, daemon=True).start()

    def state(self, wait_s: float = END_WAIT_S) -> Optional[str]:
        """MPI_FINALIZED / MPI_NOT_FINALIZED / MPI_UNUSED once the command's end closed (waiting
        up to wait_s for it), else None: another process still holds it, or the bytes were
        not PMI commands."""
        if not self._done.wait(wait_s) or not self._readable:
            return None
        if "finalize" in self._names:
            return MPI_FINALIZED
        return MPI_NOT_FINALIZED if self._names else MPI_UNUSED

    def _note(self, data: bytes) -> None:
        if not self._readable:
            return
        try:
            names, self._pending = pmi_commands(self._pending + data)
        except ValueError:
            self._readable = False
            return
        if names and not self._names and self._on_start is not None:
            self._on_start()
        self._names.update(names)
        if len(self._pending) > _PENDING_MAX:
            self._readable = False

    def _run(self) -> None:
        up_open = True
        try:
            while True:
                ready, _, _ = select.select([self._mine, self._up] if up_open else [self._mine], [], [])
                if self._mine in ready:
                    data = self._mine.recv(65536)
                    if not data:
                        return  # the command's end closed
                    self._note(data)
                    if up_open:
                        self._up.sendall(data)
                if up_open and self._up in ready:
                    data = self._up.recv(65536)
                    if data:
                        self._mine.sendall(data)
                    else:
                        up_open = False
                        self._mine.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the command's end failed (it died) or the launcher's did
        finally:
            self._mine.close()
            self._done.set()


def from_environ(environ: Mapping[str, str], on_start=None) -> Optional[PmiRelay]:
    """A relay for the launcher's PMI_FD socket, or None when there is none (Open MPI, whose
    ranks reach their PMIx server by address, or no launcher); ``on_start`` is called when the
    command starts MPI."""
    text = environ.get(PMI_FD_ENV, "")
    if not text.isdigit():
        return None
    try:
        return PmiRelay(int(text), on_start)
    except OSError:
        return None


# What a process manager gives a rank so that its MPI finds the other ranks: a PMI-1/PMI-2 socket
# (hydra, SLURM's pmi2), hydra's PMI server address, a PMIx server (Open MPI, SLURM's pmix).
PMI_ENV_VARS = (PMI_FD_ENV, "PMI_PORT", "PMIX_NAMESPACE")


def srun_without_pmi(environ: Mapping[str, str], num_proc: Optional[int]) -> Optional[str]:
    """Why this task, one of ``num_proc`` that srun started (its rank only in SLURM_PROCID), would
    start MPI as a world of one, or None (pure).  That is srun --mpi=none (or a cluster's
    MpiDefault=none): no PMI_ENV_VARS reach the task, and MPI_Init then makes a world of one."""
    if not num_proc or num_proc < 2 or "SLURM_PROCID" not in environ:
        return None
    if any(name in environ for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", *PMI_ENV_VARS)):
        return None
    return (f"srun started this task with no PMI (none of {', '.join(PMI_ENV_VARS)} is set: srun --mpi=none?), "
            f"so its MPI would run it alone instead of as one of {num_proc} ranks; launch it with "
            f"srun --mpi=pmi2 (what mlslrun passes unless --mpi-args or SLURM_MPI_TYPE name another)")
