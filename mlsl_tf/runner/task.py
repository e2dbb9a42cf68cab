"""Per-rank wrapper that mlslrun puts in front of the user's command.

Run by file path, ``python .../mlsl_tf/runner/task.py [options] -- cmd...``,
so it never imports the mlsl_tf package (and TensorFlow); standard library only.
launch.py imports it as a module for the status-file names and readers.

On every rank it:
  * finds the rank from the launcher's environment (PMI_RANK, OMPI_COMM_WORLD_RANK,
    SLURM_PROCID, PMIX_RANK);
  * writes ``start.R.json`` into ``--status-dir`` before starting the command and
    ``status.R.json`` (exit code or signal) after it ends;
  * with ``--output-filename DIR`` copies the command's stdout and stderr to
    ``DIR/rank.R/stdout`` and ``DIR/rank.R/stderr`` as well as to the console,
    R zero-padded to the width of the largest rank as horovodrun does;
  * forwards SIGTERM and SIGINT to the command, which runs in its own process
    group (so a launcher signalling this process group does not signal it twice)
    and dies with this wrapper (PR_SET_PDEATHSIG) if the wrapper is killed;
  * when the command fails, prints one line naming rank, host and pid and exits
    non-zero (the command's code, or 128 + signal number);
  * with MLSL_TF_COMM_CORE set (mlslrun --comm-core), starts the command with a CPU
    affinity that leaves out the communication cores, so TensorFlow's thread pools (sized
    from the affinity mask, inherited by every thread) stay off them.  mlsl_tf's background
    thread still pins itself to its core: Linux affinity is per thread and may name any
    core of the cgroup's cpuset, whatever mask the thread inherited.
"""

import argparse
import ctypes
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Mapping, Optional, Sequence

RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMIX_RANK")
# MPICH/Intel MPI hydra, Open MPI, SLURM: this process's rank among the ranks of its host.
LOCAL_RANK_ENV_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
COMM_CORE_ENV = "MLSL_TF_COMM_CORE"
# Where the command's mlsl_tf records an uncaught exception (mlsl_tf/basics.py reads it).
FAILURE_FILE_ENV = "MLSL_TF_FAILURE_FILE"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1
_TEE_JOIN_S = 10.0  # how long to wait for output still buffered after the command exits


@dataclasses.dataclass(frozen=True)
class RankStatus:
    """How one rank's command ended.  Exactly one of exitcode/signal is set.

    ``forwarded`` is the signal the wrapper received and passed on to the
    command (the launcher was stopping the job), or None: a failure with
    ``forwarded`` set is a consequence, not the cause.  ``failed_at``,
    ``error`` and ``caused_by_peer`` come from the record mlsl_tf writes when
    an exception ends the command (FAILURE_FILE_ENV): when the exception was
    raised, its first line, and whether it only reports that another rank
    ended first.
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


def parse_core_list(spec: str) -> list[int]:
    """[3] for "3", [2, 3] for "2,3"; raises ValueError naming the bad entry."""
    cores = []
    for item in spec.split(","):
        item = item.strip()
        if not item.isdigit():
            raise ValueError(f"{COMM_CORE_ENV}={spec!r}: {item!r} is not a core number")
        cores.append(int(item))
    return cores


def comm_core_for(cores: Sequence[int], local_rank: int) -> int:
    """The core of local rank ``local_rank``: the (local_rank mod n)-th entry, the rule the
    core's runtime applies when it pins its background thread (ops/core/runtime.cc)."""
    return cores[local_rank % len(cores)]


def worker_cpus(allowed: set[int], cores: Sequence[int], mine: int) -> tuple[Optional[set[int]], Optional[str]]:
    """(CPUs for the command, None) or (None, why the affinity is left alone).

    Leaves out every listed communication core it can (other local ranks' background threads
    run there too), else only this rank's; never leaves the command without a core."""
    if mine not in allowed:
        return None, (f"comm core {mine} is not among this rank's cores {_cpu_list(allowed)}; "
                      "the affinity is left as it is")
    rest = allowed - set(cores)
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
    spec = environ.get(COMM_CORE_ENV, "")
    if not spec:
        return None, None
    try:
        cores = parse_core_list(spec)
        local_rank = find_local_rank(environ)
    except ValueError as e:
        return None, f"{e}; the affinity is left as it is"
    if not allowed:
        return None, "this platform does not report a CPU affinity; the affinity is left as it is"
    if local_rank is None:
        return None, (f"{COMM_CORE_ENV} is set but none of {', '.join(LOCAL_RANK_ENV_VARS)} is, so this "
                      "rank's comm core is unknown; the affinity is left as it is")
    return worker_cpus(allowed, cores, comm_core_for(cores, local_rank))


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


def _tee(src_fd: int, file: BinaryIO, console: BinaryIO) -> None:
    """Copy bytes from src_fd to file and console until EOF."""
    try:
        while True:
            data = os.read(src_fd, 65536)
            if not data:
                return
            for dst in (file, console):
                try:
                    dst.write(data)
                    dst.flush()
                except (OSError, ValueError):
                    pass  # a closed console must not stop the file copy
    finally:
        os.close(src_fd)


class _Child:
    """The user's command as a child process, its output copiers and signal forwarding."""

    def __init__(self, command: Sequence[str], output_dir: Optional[str], cpus: Optional[set[int]] = None):
        self.forwarded: Optional[int] = None
        self._threads: list[threading.Thread] = []
        self._files: list[BinaryIO] = []
        pipe = subprocess.PIPE if output_dir is not None else None
        # close_fds=False: the process manager's PMI connection (hydra's PMI_FD)
        # is an inherited descriptor the command's MPI_Init must still find.
        self.proc = subprocess.Popen(list(command), stdout=pipe, stderr=pipe,
                                     close_fds=False, process_group=0,
                                     preexec_fn=_preexec_fn(cpus))
        if output_dir is not None:
            for name, stream, console in (("stdout", self.proc.stdout, sys.stdout.buffer),
                                          ("stderr", self.proc.stderr, sys.stderr.buffer)):
                f = open(os.path.join(output_dir, name), "wb")
                self._files.append(f)
                fd = os.dup(stream.fileno())
                stream.close()
                t = threading.Thread(target=_tee, args=(fd, f, console), daemon=True)
                t.start()
                self._threads.append(t)

    def forward(self, signum: int, _frame=None) -> None:
        """Signal handler: pass signum on to the command."""
        self.forwarded = signum
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
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


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mlslrun-task", allow_abbrev=False,
                                description="mlslrun's per-rank wrapper")
    p.add_argument("--num-proc", type=int, help="world size, for rank.R padding")
    p.add_argument("--output-filename", help="write output to DIR/rank.R/{stdout,stderr}")
    p.add_argument("--status-dir", help="where to write start.R.json and status.R.json")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]
    if not ns.command:
        p.error("missing the command to run after --")
    return ns


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command for this rank; returns the wrapper's exit code."""
    ns = _parse_args(sys.argv[1:] if argv is None else argv)
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
    try:
        child = _Child(ns.command, output_dir, cpus)
    except OSError as e:
        print(f"mlslrun: rank {rank} (host {host}) could not start {ns.command[0]!r}: {e}",
              file=sys.stderr, flush=True)
        if ns.status_dir is not None:
            _write_status(ns.status_dir, RankStatus(rank, host, os.getpid(), 127, None,
                                                    None, time.time()))
        return 127
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, child.forward)
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
                        forwarded=forwarded,
                        time=time.time(), **failure)
    if ns.status_dir is not None:
        _write_status(ns.status_dir, status)
    if status.failed:
        print(f"mlslrun: {status.describe()}", file=sys.stderr, flush=True)
    return status.wrapper_exit_code


if __name__ == "__main__":
    sys.exit(main())
