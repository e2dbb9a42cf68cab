"""What the ranks' status files say about a job (mlslrun reads them while it runs): which ranks
started, which failed first and whom to blame, which left early or without finalizing MPI, and
the exit code a rank's end gives. Pure but for reading the status directory."""

import json
import os
import re
from typing import Optional, Sequence

from mlsl_tf.runner import rank_status
from mlsl_tf.runner.pmi_relay import MPI_FINALIZED, MPI_NOT_FINALIZED, MPI_UNUSED
from mlsl_tf.runner.rank_status import RankStatus

LEAVER_GRACE_S = 3.0  # how long the launcher gets to end a job a rank left without finalizing MPI


def mpi_started_ranks(status_dir: str, num_proc: int) -> set[int]:
    """Ranks whose wrapper saw their command start MPI."""
    return {r for r in range(num_proc) if os.path.exists(rank_status.mpi_marker_path(status_dir, r))}


def stranding_leaver(statuses: Sequence[RankStatus], mpi_started: set[int], now: float,
                     grace: float = LEAVER_GRACE_S) -> tuple[Optional[RankStatus], list[int]]:
    """(the first rank that exited with code 0 without ever starting MPI at least ``grace`` s
    before ``now``, the ranks that started MPI and have not ended), when there are both, else
    (None, []) (pure). MPI_Init needs every rank of the job: those ranks wait for it for ever."""
    ended = {s.rank for s in statuses}
    waiting = sorted(r for r in mpi_started if r not in ended)
    left = [s for s in statuses if not s.failed and s.mpi == MPI_UNUSED and s.time + grace <= now]
    if not waiting or not left:
        return None, []
    return min(left, key=lambda s: (s.time, s.rank)), waiting


def started_ranks(status_dir: str, num_proc: int) -> set[int]:
    """Ranks whose start marker exists."""
    return {r for r in range(num_proc) if os.path.exists(rank_status.start_marker_path(status_dir, r))}


def rank_statuses(status_dir: str, num_proc: int) -> list[RankStatus]:
    """The status files written so far; a rank whose command recorded an uncaught exception
    but has no status yet (it is still exiting, or its wrapper was killed first) counts as
    failed from when it raised."""
    out = []
    for r in range(num_proc):
        s = rank_status.read_status(rank_status.status_path(status_dir, r))
        if s is None:
            failure = rank_status.read_failure(rank_status.failure_path(status_dir, r))
            if failure:
                start = _read_json(rank_status.start_marker_path(status_dir, r))
                pid = failure.pop("pid") or int(start.get("pid", 0))
                s = RankStatus(rank=r, host=str(start.get("host", "?")), pid=pid,
                               exitcode=1, signal=None, forwarded=None, time=failure["failed_at"], **failure)
        if s is not None:
            out.append(s)
    return out


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def first_failure(statuses: Sequence[RankStatus]) -> Optional[RankStatus]:
    """The failed rank that most likely caused the job to fail (pure).

    Failures of ranks the launcher was stopping (``forwarded`` set) come last,
    then those that only report another rank's end (``caused_by_peer``); among
    the rest the earliest (when the exception was raised, else when the rank
    exited), then the lowest rank, wins.
    """
    failed = [s for s in statuses if s.failed]
    if not failed:
        return None
    return min(failed, key=lambda s: (s.forwarded is not None, s.caused_by_peer,
                                      s.time if s.failed_at is None else s.failed_at, s.rank))


_SHUT_DOWN = re.compile(r"\branks? (\d+(?:, \d+)*) shut down\b")


def shut_down_peer(failure: RankStatus) -> Optional[int]:
    """The rank a failure only reports the end of (mlsl_tf's "rank N shut down, so collectives
    can no longer complete"; of "ranks N, M shut down" the first listed), or None (pure)."""
    m = _SHUT_DOWN.search(failure.error or "") if failure.caused_by_peer else None
    peers = [int(r) for r in m.group(1).split(", ")] if m else []
    return next((r for r in peers if r != failure.rank), None)


def blame(failure: RankStatus, status_dir: str) -> str:
    """The summary of the job's failure: the failed rank, or, when its failure only reports that
    another rank shut down first (it exited, even with code 0, or called shutdown() while the
    others still needed it), that rank, then the report."""
    peer = shut_down_peer(failure)
    if peer is None:
        return failure.describe()
    host = _read_json(rank_status.start_marker_path(status_dir, peer)).get("host", "?")
    return (f"rank {peer} (host {host}) left first: it shut mlsl_tf down (exit or shutdown()) while "
            f"the other ranks still needed it; {failure.describe()}")


def early_leaver(statuses: Sequence[RankStatus], num_proc: int) -> Optional[RankStatus]:
    """The rank that exited with code 0 first while some other rank still ran (no status yet,
    or one written later), or None (pure).  For a job whose launcher failed with no failed
    rank: MPI stops a job when a rank leaves without finalising.  A rank whose wrapper saw it
    finalize MPI, or never start it, left as it may: it is not the one."""
    left = sorted((s for s in statuses if not s.failed and s.mpi not in (MPI_FINALIZED, MPI_UNUSED)),
                  key=lambda s: (s.time, s.rank))
    if not left:
        return None
    first = left[0]
    still_running = num_proc > len(statuses) or any(s.time > first.time for s in statuses if s.rank != first.rank)
    return first if still_running else None


def left_before_the_stop(statuses: Sequence[RankStatus], num_proc: int) -> Optional[RankStatus]:
    """When every failed rank only failed because the launcher stopped it (its wrapper passed the
    launcher's signal on), the rank that exited with code 0 first while others still ran (as
    early_leaver), else None (pure).  Open MPI's mpirun stops a job so when a rank left without
    finalizing: that rank, not the ones it stopped, is the cause."""
    failed = [s for s in statuses if s.failed]
    if not failed or any(s.forwarded is None for s in failed):
        return None
    return early_leaver(statuses, num_proc)


def unfinalized_leaver(statuses: Sequence[RankStatus], num_proc: int, now: float,
                       grace: float = LEAVER_GRACE_S) -> Optional[RankStatus]:
    """The first rank that exited with code 0 without finalizing MPI at least ``grace`` seconds
    before ``now`` (wall clock) while some rank has not ended yet, or None (pure)."""
    if len({s.rank for s in statuses}) >= num_proc:
        return None  # every rank has ended
    left = [s for s in statuses if not s.failed and s.mpi == MPI_NOT_FINALIZED and s.time + grace <= now]
    return min(left, key=lambda s: (s.time, s.rank), default=None)


def still_running(statuses: Sequence[RankStatus], num_proc: int, leaver: RankStatus) -> list[int]:
    """The ranks that had not ended when ``leaver`` did: no status, or a later one (pure)."""
    ended = {s.rank for s in statuses}
    return sorted([s.rank for s in statuses if s.time > leaver.time] + [r for r in range(num_proc) if r not in ended])


def format_ranks(ranks: Sequence[int]) -> str:
    """``rank 3`` / ``ranks 1, 2`` (pure)."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def exit_code_of(returncode: int) -> int:
    """A Popen returncode as a shell-style exit status (128 + signal when killed)."""
    return 128 - returncode if returncode < 0 else returncode
