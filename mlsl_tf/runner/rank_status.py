"""A rank's status files (start marker, RankStatus, mlsl_tf's failure record): names, writers, readers.

The rank wrapper (task.py) writes them into mlslrun's status dir; launch.py reads them.  Standard
library only."""

import dataclasses
import json
import os
import signal
import time
from typing import Optional

# Where the command's mlsl_tf records an uncaught exception (mlsl_tf/basics.py reads it).
FAILURE_FILE_ENV = "MLSL_TF_FAILURE_FILE"


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
    connection (pmi_relay.PmiRelay), None where the wrapper could not see it.
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
    mpi: Optional[str] = None  # pmi_relay.MPI_FINALIZED, MPI_NOT_FINALIZED, MPI_UNUSED; None: not seen

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


def read_status(path: str) -> Optional[RankStatus]:
    """The RankStatus in a status file, or None if absent or unreadable."""
    try:
        with open(path) as f:
            return RankStatus(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _write_json_atomically(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def write_start_marker(status_dir: str, rank: int, host: str) -> None:
    """``start.R.json`` (rank, host, this process's pid, time), creating status_dir; OSError if not."""
    os.makedirs(status_dir, exist_ok=True)
    _write_json_atomically(start_marker_path(status_dir, rank),
                           {"rank": rank, "host": host, "pid": os.getpid(), "time": time.time()})


def mpi_marker_path(status_dir: str, rank: int) -> str:
    return os.path.join(status_dir, f"mpi.{rank}")


def write_mpi_marker(status_dir: str, rank: int) -> None:
    """``mpi.R``: the rank's command started MPI (its first PMI command); best effort."""
    try:
        with open(mpi_marker_path(status_dir, rank), "w"):
            pass
    except OSError:
        pass


def write_status(status_dir: str, status: RankStatus) -> None:
    """``status.R.json``, whole or not at all (written aside, then renamed); OSError if not."""
    _write_json_atomically(status_path(status_dir, status.rank), dataclasses.asdict(status))
