"""Per-rank wrapper that mlslrun puts in front of the user's command.

Run by file path, ``python .../mlsl_tf/runner/task.py [options] -- cmd...``,
so it never imports TensorFlow: standard library only, plus mlsl_tf/cores.py (the one parser
of MLSL_TF_COMM_CORE, itself standard library only; the package's __init__ imports nothing).
launch.py imports it as a module for the status-file names and readers.

On every rank it:
  * finds the rank from the launcher's environment (PMI_RANK, OMPI_COMM_WORLD_RANK,
    SLURM_PROCID, PMIX_RANK);
  * writes ``start.R.json`` into ``--status-dir`` before starting the command and
    ``status.R.json`` (exit code or signal) after it ends;
  * with ``--output-filename DIR`` copies the command's stdout and stderr to
    ``DIR/rank.R/stdout`` and ``DIR/rank.R/stderr`` as well as to the console,
    R zero-padded to the width of the largest rank as horovodrun does;
  * with ``--tag-output`` (mlslrun's default) reads the command's stdout and stderr
    through pipes and writes them on line by line, each line prefixed with
    ``[R]<stdout>:`` / ``[R]<stderr>:`` (Horovod's tags) in one write of at most
    PIPE_BUF bytes, so the launcher never gets half a line (lines longer than that
    may still be split); a last line without newline is written at exit, with one;
  * forwards SIGTERM and SIGINT to the command, which runs in its own process
    group (so a launcher signalling this process group does not signal it twice)
    and dies with this wrapper (PR_SET_PDEATHSIG) if the wrapper is killed;
  * stops the command when its own parent (the launcher's per-host proxy) is gone:
    SIGTERM at once (PR_SET_PDEATHSIG on this process, and a watcher thread that
    sees the parent pid change), SIGKILL LAUNCHER_GONE_GRACE_S later, so a job whose
    mlslrun or mpiexec was killed does not keep training;
  * when the command fails, prints one line naming rank, host and pid and exits
    non-zero (the command's code, or 128 + signal number);
  * with ``--status-dir`` and a PMI connection to the launcher (PMI_FD: MPICH's and Intel
    MPI's hydra, SLURM's pmi2), passes that connection through itself and reads the names
    of the commands the command sends on it, so the status says whether the command started
    MPI and whether it finalized it before it ended (``mpi``; see _PmiRelay): mlslrun stops
    a job one of whose ranks exited without finalizing while the others still run, as hydra
    usually does (but not always);
  * with MLSL_TF_COMM_CORE set (mlslrun --comm-core), starts the command with a CPU
    affinity that leaves out the communication cores, so TensorFlow's thread pools (sized
    from the affinity mask, inherited by every thread) stay off them.  mlsl_tf's init()
    still pins the background thread to its core (the same rule, mlsl_tf/cores.py): Linux
    affinity is per thread and may name any core of the cgroup's cpuset, whatever mask the
    thread inherited.
"""

import argparse
import ctypes
import dataclasses
import json
import os
import select as select_module
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Mapping, Optional, Sequence

if not __package__:  # run by file path (every rank): the package's parent dir, for mlsl_tf.cores
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from mlsl_tf import cores  # noqa: E402 - standard library only

_STARTED_BY = os.getppid()  # as early as possible: the parent may die while this file loads

RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMIX_RANK")
# MPICH/Intel MPI hydra, Open MPI, SLURM: this process's rank among the ranks of its host.
LOCAL_RANK_ENV_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
COMM_CORE_ENV = cores.SETTING
# Where the command's mlsl_tf records an uncaught exception (mlsl_tf/basics.py reads it).
FAILURE_FILE_ENV = "MLSL_TF_FAILURE_FILE"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1
_TEE_JOIN_S = 10.0  # how long to wait for output still buffered after the command exits
LAUNCHER_GONE_GRACE_S = 2.0  # after the parent vanished: SIGTERM, then SIGKILL this much later
_PARENT_POLL_S = 0.25
_LINE_WRITE_MAX = getattr(select_module, "PIPE_BUF", 4096)  # a pipe write this size is atomic
_LINE_MAX = 1 << 16  # a longer line without newline is written on in pieces of this size
# The process manager's PMI connection (MPICH's and Intel MPI's hydra, SLURM's pmi2): a socket
# the command's MPI_Init finds by this number.
PMI_FD_ENV = "PMI_FD"
# RankStatus.mpi: what the command did on that connection.
MPI_FINALIZED = "finalized"  # it started MPI and finalized it (PMI finalize) before it ended
MPI_NOT_FINALIZED = "not finalized"  # it started MPI and ended without finalizing it
MPI_UNUSED = "unused"  # it never started MPI (sent no PMI command)
_PMI_PENDING_MAX = 1 << 20  # more bytes than this without a whole PMI command: stop reading names
_PMI_END_WAIT_S = 1.0  # after the command exited, how long its PMI connection may take to close


@dataclasses.dataclass(frozen=True)
class RankStatus:
    """How one rank's command ended.  Exactly one of exitcode/signal is set.

    ``forwarded`` is the signal the wrapper received and passed on to the
    command (the launcher was stopping the job), or None: a failure with
    ``forwarded`` set is a consequence, not the cause.  ``failed_at``,
    ``error`` and ``caused_by_peer`` come from the record mlsl_tf writes when
    an exception ends the command (FAILURE_FILE_ENV): when the exception was
    raised, its first line, and whether it only reports that another rank
    ended first.  ``mpi`` is what the command did with the launcher's PMI
    connection (_PmiRelay), None where the wrapper could not see it.
    """

    rank: int
    host: str
    pid: int
    exitcode: Optional[int]
    signal: Optional[int]
    forwarded: Optional[int]
    time: float
    failed_at: Optional[float] = None
    error: Optional[str] = None
    caused_by_peer: bool = False
    mpi: Optional[str] = None  # MPI_FINALIZED, MPI_NOT_FINALIZED, MPI_UNUSED, or None: not seen

    @property
    def failed(self) -> bool:
        return self.exitcode != 0

    @property
    def wrapper_exit_code(self) -> int:
        """What the wrapper exits with: the command's code, or 128 + signal."""
        return self.exitcode if self.exitcode is not None else 128 + (self.signal or 0)

    def describe(self) -> str:
        """``rank 1 (host h, pid 7) exited with code 3`` / ``was killed by signal SIGKILL``."""
        who = f"rank {self.rank} (host {self.host}, pid {self.pid})"
        if self.signal is not None:
            what = f"was killed by signal {signal_name(self.signal)}"
        else:
            what = f"exited with code {self.exitcode}"
        if self.forwarded is not None and self.forwarded == self.signal:
            what += " (sent by the launcher)"
        elif self.forwarded is not None:
            what += f" after the launcher sent it {signal_name(self.forwarded)}"
        if self.error:
            what += f": {self.error}"
        return f"{who} {what}"


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def find_rank(environ: Mapping[str, str]) -> int:
    """This process's rank from the first of RANK_ENV_VARS that is set.

    Raises ValueError when none is set or the value is not an integer.
    """
    for name in RANK_ENV_VARS:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not a rank number") from None
    raise ValueError("cannot find this process's rank: none of "
                     f"{', '.join(RANK_ENV_VARS)} is set (run it under mlslrun)")


def find_local_rank(environ: Mapping[str, str]) -> Optional[int]:
    """This process's rank on its host from the first of LOCAL_RANK_ENV_VARS that is set, or
    None.  Raises ValueError when the value is not an integer."""
    for name in LOCAL_RANK_ENV_VARS:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not a local rank number") from None
    return None


def worker_cpus(allowed: set[int], comm_cores: Sequence[int], mine: int) -> tuple[Optional[set[int]], Optional[str]]:
    """(CPUs for the command, None) or (None, why the affinity is left alone).

    Leaves out every listed communication core it can (other local ranks' background threads
    run there too), else only this rank's; never leaves the command without a core."""
    if mine not in allowed:
        return None, (f"comm core {mine} is not among this rank's cores {_cpu_list(allowed)}; "
                      "the affinity is left as it is")
    rest = allowed - set(comm_cores)
    if not rest:
        rest = allowed - {mine}
    if not rest:
        return None, (f"only core {mine} is available, which is also the comm core; "
                      "TensorFlow's threads will share it with the background thread")
    return rest, None


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def affinity_plan(environ: Mapping[str, str], allowed: set[int]) -> tuple[Optional[set[int]], Optional[str]]:
    """What to do for MLSL_TF_COMM_CORE in ``environ``: (CPUs for the command or None, a
    warning or None).  No setting: (None, None)."""
    try:
        comm_cores = cores.parse(environ.get(COMM_CORE_ENV, ""))
        if not comm_cores:
            return None, None
        local_rank = find_local_rank(environ)
    except ValueError as e:
        return None, f"{e}; the affinity is left as it is"
    if not allowed:
        return None, "this platform does not report a CPU affinity; the affinity is left as it is"
    if local_rank is None:
        return None, (f"{COMM_CORE_ENV} is set but none of {', '.join(LOCAL_RANK_ENV_VARS)} is, so this "
                      "rank's comm core is unknown; the affinity is left as it is")
    return worker_cpus(allowed, comm_cores, cores.core_for(comm_cores, local_rank))


def rank_dir_name(rank: int, num_proc: Optional[int]) -> str:
    """``rank.R`` with R zero-padded to the digits of num_proc - 1 (horovodrun's layout)."""
    width = len(str(num_proc - 1)) if num_proc and num_proc > 1 else 1
    return f"rank.{rank:0{width}d}"


def start_marker_path(status_dir: str, rank: int) -> str:
    return os.path.join(status_dir, f"start.{rank}.json")


def status_path(status_dir: str, rank: int) -> str:
    return os.path.join(status_dir, f"status.{rank}.json")


def failure_path(status_dir: str, rank: int) -> str:
    return os.path.join(status_dir, f"failure.{rank}.json")


def read_failure(path: str) -> dict:
    """The fields mlsl_tf's failure record adds to a RankStatus, and its "pid" ({} when there
    is no readable record)."""
    try:
        with open(path) as f:
            record = json.load(f)
        return {"failed_at": float(record["time"]), "error": str(record.get("error") or "") or None,
                "caused_by_peer": bool(record.get("caused_by_peer")), "pid": int(record.get("pid") or 0)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def _write_json_atomically(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_status(path: str) -> Optional[RankStatus]:
    """The RankStatus in a status file, or None if absent or unreadable."""
    try:
        with open(path) as f:
            return RankStatus(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _warn(message: str) -> None:
    print(f"mlslrun task: {message}", file=sys.stderr, flush=True)


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: no affinity to restrict
        return set()


def _write_start_marker(status_dir: str, rank: int, host: str) -> None:
    try:
        os.makedirs(status_dir, exist_ok=True)
        _write_json_atomically(start_marker_path(status_dir, rank),
                               {"rank": rank, "host": host, "pid": os.getpid(),
                                "time": time.time()})
    except OSError as e:
        _warn(f"cannot write the start marker in {status_dir}: {e}")


def _write_status(status_dir: str, status: RankStatus) -> None:
    try:
        _write_json_atomically(status_path(status_dir, status.rank), dataclasses.asdict(status))
    except OSError as e:
        _warn(f"cannot write the status file in {status_dir}: {e}")


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
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the wrapper died before prctl took effect
                os.kill(os.getpid(), signal.SIGKILL)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return preexec


def output_tag(rank: int, stream: str) -> bytes:
    """Horovod's prefix of a rank's output line: ``[1]<stdout>:``."""
    return f"[{rank}]<{stream}>:".encode()


def tag_lines(pending: bytes, data: bytes, tag: bytes, final: bool = False) -> tuple[list[bytes], bytes]:
    """(tagged complete lines, bytes still waiting for their newline) after ``data`` arrived
    behind ``pending`` (pure).  ``final``: the stream ended, so a last partial line is
    tagged too and given its newline.  A line longer than _LINE_MAX without newline
    is passed on in _LINE_MAX pieces, each a tagged line of its own."""
    buf = pending + data
    lines = buf.split(b"\n")
    rest = lines.pop()
    out = [tag + line + b"\n" for line in lines]
    while len(rest) >= _LINE_MAX:
        out.append(tag + rest[:_LINE_MAX] + b"\n")
        rest = rest[_LINE_MAX:]
    if final and rest:
        out.append(tag + rest + b"\n")
        rest = b""
    return out, rest


def batch_lines(lines: Sequence[bytes], limit: int = _LINE_WRITE_MAX) -> list[bytes]:
    """Whole lines joined into writes of at most ``limit`` bytes (a longer line alone) (pure)."""
    writes: list[bytes] = []
    for line in lines:
        if writes and len(writes[-1]) + len(line) <= limit:
            writes[-1] += line
        else:
            writes.append(line)
    return writes


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class _Pump:
    """Copies the command's stdout or stderr (a pipe) to a file, raw, and to the console, tagged
    line by line or raw, until EOF."""

    def __init__(self, src_fd: int, console_fd: int, file: Optional[BinaryIO], tag: Optional[bytes]):
        self.src_fd, self.console_fd, self.file, self.tag = src_fd, console_fd, file, tag
        self.console_ok = True

    def run(self) -> None:
        pending = b""
        try:
            while True:
                data = os.read(self.src_fd, 65536)
                if self.file is not None and data:
                    try:
                        self.file.write(data)
                        self.file.flush()
                    except (OSError, ValueError):
                        pass
                if self.tag is None:
                    self._console([data] if data else [])
                else:
                    lines, pending = tag_lines(pending, data, self.tag, final=not data)
                    self._console(batch_lines(lines))
                if not data:
                    return
        finally:
            os.close(self.src_fd)

    def _console(self, writes: Sequence[bytes]) -> None:
        for chunk in writes:
            if not self.console_ok:
                return
            try:
                _write_all(self.console_fd, chunk)
            except OSError:
                self.console_ok = False  # a closed console must not stop the file copy


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


class _PmiRelay:
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

    def __init__(self, upstream_fd: int):
        self._mine, self._theirs = socket.socketpair()
        try:
            self._up = socket.socket(fileno=upstream_fd)  # OSError when it is no socket
        except OSError:
            self._mine.close()
            self._theirs.close()
            raise
        self._up.set_inheritable(False)  # the command talks through the pair only
        self._theirs.set_inheritable(True)
        self.child_fd = self._theirs.fileno()
        self._names: set[str] = set()
        self._pending = b""
        self._readable = True  # False once the command sent bytes that are no PMI command
        self._done = threading.Event()

    def start(self) -> None:
        """The command has started with child_fd: close this process's copy, start copying."""
        self._theirs.close()
        threading.Thread(target=self._run, daemon=True).start()

    def state(self, wait_s: float = _PMI_END_WAIT_S) -> Optional[str]:
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
        self._names.update(names)
        if len(self._pending) > _PMI_PENDING_MAX:
            self._readable = False

    def _run(self) -> None:
        up_open = True
        try:
            while True:
                ready, _, _ = select_module.select([self._mine, self._up] if up_open else [self._mine], [], [])
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


def _pmi_relay(environ: Mapping[str, str]) -> Optional[_PmiRelay]:
    """A relay for the launcher's PMI_FD socket, or None when there is none (Open MPI, whose
    ranks reach their PMIx server by address, or no launcher)."""
    text = environ.get(PMI_FD_ENV, "")
    if not text.isdigit():
        return None
    try:
        return _PmiRelay(int(text))
    except OSError:
        return None


class _Child:
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
                tag = None if tag_rank is None else output_tag(tag_rank, name)
                t = threading.Thread(target=_Pump(fd, console.fileno(), f, tag).run, daemon=True)
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
            if _pid_gone(self.proc.pid):
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


def _pid_gone(pid: int) -> bool:
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


def _die_with_parent(parent: int) -> bool:
    """Ask Linux for SIGTERM when the parent that started this wrapper exits (PR_SET_PDEATHSIG;
    skipped where prctl is missing); False when that parent is gone already."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent


def _watch_parent(parent: int, child: "_Child") -> None:
    """Thread: stop the command once the wrapper's parent has changed (it died)."""
    while os.getppid() == parent:
        if _pid_gone(child.proc.pid):
            return
        time.sleep(_PARENT_POLL_S)
    _warn("the launcher is gone; stopping the command")
    child.stop_orphaned()


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mlslrun-task", allow_abbrev=False,
                                description="mlslrun's per-rank wrapper")
    p.add_argument("--num-proc", type=int, help="world size, for rank.R padding")
    p.add_argument("--output-filename", help="write output to DIR/rank.R/{stdout,stderr}")
    p.add_argument("--status-dir", help="where to write start.R.json and status.R.json")
    p.add_argument("--tag-output", action="store_true",
                   help="prefix each output line with [RANK]<stdout>: / [RANK]<stderr>:")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]
    if not ns.command:
        p.error("missing the command to run after --")
    return ns


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command for this rank; returns the wrapper's exit code."""
    parent = _STARTED_BY if argv is None else os.getppid()
    ns = _parse_args(sys.argv[1:] if argv is None else argv)
    if not _die_with_parent(parent):
        _warn("the launcher is gone; not starting the command")
        return 128 + signal.SIGTERM
    try:
        rank = find_rank(os.environ)
    except ValueError as e:
        _warn(str(e))
        return 2
    host = socket.gethostname()
    output_dir = None
    if ns.output_filename is not None:
        output_dir = os.path.join(ns.output_filename, rank_dir_name(rank, ns.num_proc))
        os.makedirs(output_dir, exist_ok=True)
    if ns.status_dir is not None:
        _write_start_marker(ns.status_dir, rank, host)
        os.environ[FAILURE_FILE_ENV] = failure_path(ns.status_dir, rank)
    cpus, warning = affinity_plan(os.environ, _allowed_cpus())
    if warning:
        _warn(f"rank {rank}: {warning}")
    relay = _pmi_relay(os.environ) if ns.status_dir is not None else None
    if relay is not None:
        os.environ[PMI_FD_ENV] = str(relay.child_fd)
    try:
        child = _Child(ns.command, output_dir, cpus, rank if ns.tag_output else None)
    except OSError as e:
        print(f"mlslrun: rank {rank} (host {host}) could not start {ns.command[0]!r}: {e}",
              file=sys.stderr, flush=True)
        if ns.status_dir is not None:
            _write_status(ns.status_dir, RankStatus(rank, host, os.getpid(), 127, None,
                                                    None, time.time()))
        return 127
    if relay is not None:
        relay.start()
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, child.forward)
    threading.Thread(target=_watch_parent, args=(parent, child), daemon=True).start()
    code = child.wait()
    failure = read_failure(failure_path(ns.status_dir, rank)) if ns.status_dir is not None and code != 0 else {}
    failure.pop("pid", None)  # the child's own pid is known here
    forwarded = child.forwarded
    if failure and code < 0 and forwarded is not None:
        # It had raised and was exiting (code 1) when the launcher, stopping the job because of
        # that very exception, signalled it: the exception is what ended it.
        code, forwarded = 1, None
    status = RankStatus(rank=rank, host=host, pid=child.proc.pid,
                        exitcode=code if code >= 0 else None,
                        signal=-code if code < 0 else None,
                        forwarded=forwarded, time=time.time(),
                        mpi=None if relay is None else relay.state(), **failure)
    if ns.status_dir is not None:
        _write_status(ns.status_dir, status)
    if status.failed:
        print(f"mlslrun: {status.describe()}", file=sys.stderr, flush=True)
    return status.wrapper_exit_code


if __name__ == "__main__":
    sys.exit(main())
