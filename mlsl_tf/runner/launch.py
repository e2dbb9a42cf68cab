"""mlslrun: find the MPI, build its command line (argv.py, launchers.py) and run it.

The I/O half of the launcher.  main() parses the command line, finds
mpiexec (the one MLSL_TF_MPIEXEC names, else next to this Python, then on PATH) or srun, asks
``mpiexec --version`` which MPI it is, runs the launcher without a shell,
forwards SIGINT/SIGTERM to it and returns its exit status.  The launcher runs
under guard.py, a child subreaper that kills every process of the launch
left when the launcher ends, when mlslrun asks, and when mlslrun dies, even
by SIGKILL (its PR_SET_PDEATHSIG): hydra's proxies and the rank wrappers run
in sessions of their own, and a proxy still starting ranks goes on starting
them after mpiexec is gone.  Every rank's wrapper also stops its rank when
its parent goes (task.py).

While the job runs, mlslrun watches a status directory it creates in the
local temp dir, where every rank's wrapper (task.py) writes a start marker
and, at the end, how it ended.  From it mlslrun
  * stops the whole job as soon as one rank fails (hydra keeps the other
    ranks running when a non-MPI process exits non-zero) and reports that
    rank as the cause;
  * enforces --start-timeout;
  * stops the job when a rank exited with code 0 without finalizing MPI (its
    wrapper saw it start MPI and end without MPI_Finalize, e.g. by os._exit(0))
    while another rank still runs, and the launcher has not ended the job
    LEAVER_GRACE_S later: hydra usually aborts such a job itself, but not always.
    A rank that finalized MPI (or never started it) may end before the others;
  * when no rank failed but the launcher did (MPI aborts a job one of whose
    ranks exited 0 without finalising), or mlslrun stopped the job for such a
    rank, names the rank that exited first while the others still ran.
Both only see ranks on hosts that share this path (this machine, or a shared
file system at the same path); on other hosts the ranks still run, but
--start-timeout would count them as not started, so use it only there
(and task.py creates the same temp path on such hosts, unused).
"""

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Optional, Sequence

from mlsl_tf.runner import child, elastic_driver, rank_status, ssh_check
from mlsl_tf.runner.argv import build_parser, parse_args
from mlsl_tf.runner.config import HostSlots, RunConfig, UsageError
from mlsl_tf.runner.hosts import parse_hostfile
from mlsl_tf.runner.launchers import (Flavour, build_launch_argv, choose_launcher, detect_flavour,
                                      make_plan, needs_ssh_exec, program_name, rank_command,
                                      ssh_options)
from mlsl_tf.runner.pmi_relay import MPI_FINALIZED, MPI_NOT_FINALIZED, MPI_UNUSED
from mlsl_tf.runner.rank_env import format_seconds, missing_env
from mlsl_tf.runner.rank_status import RankStatus

POLL_S = 0.1
PEER_GRACE_S = 3.0  # how long a failure that only reports another rank's end waits for its cause
LEAVER_GRACE_S = 3.0  # how long the launcher gets to end a job a rank left without finalizing MPI
OVERSUBSCRIBE_PER_CORE = 4  # more ranks per core on one host need --oversubscribe
STOP_GRACE_S = 10.0  # after SIGTERM, how long the launcher gets before SIGKILL
VERSION_TIMEOUT_S = 60.0
EXIT_USAGE = 2
EXIT_FAILURE = 1
TASK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "task.py")
GUARD_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py")
GUARD_KILL = signal.SIGUSR1  # guard.py: kill every process of the launch now
GUARD_GRACE_S = 15.0  # guard.py's sweep takes at most 10 s; then the guard itself gets SIGKILL


def _err(message: str) -> None:
    print(f"mlslrun: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Finding the launcher.


# Names the MPI launcher to use (a path, or a name looked up on PATH), e.g. mpirun.openmpi beside
# a venv whose mpiexec is PyPI's MPICH; mlslrun asks it which MPI it is and runs it as given.
MPIEXEC_ENV = "MLSL_TF_MPIEXEC"


def chosen_mpiexec(environ: Mapping[str, str], path: Optional[str] = None) -> Optional[str]:
    """The launcher MLSL_TF_MPIEXEC names (resolved on ``path``), None when it is unset;
    raises RuntimeError when it names no executable."""
    chosen = environ.get(MPIEXEC_ENV, "")
    if not chosen:
        return None
    found = shutil.which(chosen, path=path)
    if found is None:
        raise RuntimeError(f"{MPIEXEC_ENV}={chosen}: no such executable"
                           + ("" if os.sep in chosen else " on PATH"))
    return found


# Written by `pip install` (setup.py): the MPI the installed library was built against.
BUILD_INFO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build.json")


def _built_mpiexec(build_info: str = BUILD_INFO) -> Optional[str]:
    try:
        with open(build_info) as f:
            return json.load(f).get("mpiexec")
    except (OSError, ValueError, AttributeError):
        return None


def find_mpiexec(python: str = sys.executable, path: Optional[str] = None,
                 build_info: str = BUILD_INFO) -> Optional[str]:
    """mpiexec next to ``python`` (a venv's bin) if there, else the one of the MPI an installed
    package was built against (a venv that sees another environment's MPI), else the first on PATH."""
    for candidate in (os.path.join(os.path.dirname(python), "mpiexec"), _built_mpiexec(build_info)):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("mpiexec", path=path)


def flavour_program(flavour: Flavour, mpiexec: str) -> str:
    """The flavour's own launcher beside mpiexec (mpirun, mpiexec.hydra) or mpiexec."""
    sibling = os.path.join(os.path.dirname(mpiexec), program_name(flavour))
    return sibling if os.access(sibling, os.X_OK) else mpiexec


def mpi_version_text(mpiexec: str) -> str:
    """stdout + stderr of ``mpiexec --version``; raises OSError/TimeoutExpired."""
    out = subprocess.run([mpiexec, "--version"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", timeout=VERSION_TIMEOUT_S, check=False)
    return out.stdout


# ---------------------------------------------------------------------------
# --check-build.


def _op_library_status() -> tuple[bool, str]:
    """(loaded, reason): whether mlsl_tf's TensorFlow op library loads."""
    try:
        from mlsl_tf import _library  # written by the core; may be absent
        _library.load_ops()
    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def _version() -> str:
    try:
        from importlib import metadata
        return metadata.version("mlsl_tf")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        import mlsl_tf
        return str(getattr(mlsl_tf, "__version__", "unknown"))


def check_build_text(tf_loaded: bool, tf_reason: str, mpi_found: bool,
                     version: str) -> str:
    """horovodrun --check-build's report for mlsl_tf (pure)."""
    def mark(on: bool) -> str:
        return "[X]" if on else "[ ]"

    tf_line = f"    {mark(tf_loaded)} TensorFlow"
    if not tf_loaded:
        tf_line += f"  ({tf_reason})"
    lines = [f"mlsl_tf v{version}:", "", "Available Frameworks:", tf_line,
             "    [ ] PyTorch", "    [ ] MXNet", "",
             "Available Controllers:", f"    {mark(mpi_found)} MPI", "    [ ] Gloo", "",
             "Available Tensor Operations:", "    [ ] NCCL", "    [ ] DDL", "    [ ] CCL",
             f"    {mark(tf_loaded)} MPI", "    [ ] Gloo"]
    return "\n".join(lines) + "\n"


def check_build() -> int:
    loaded, reason = _op_library_status()
    sys.stdout.write(check_build_text(loaded, reason, find_mpiexec() is not None, _version()))
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------
# Watching the job.


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


class _Job:
    """The running launcher, under guard.py, and how it is stopped.

    The guard runs in its own session, so a terminal's Ctrl-C reaches only mlslrun, which forwards
    it once; a second Ctrl-C/SIGTERM, or a stop() not obeyed within STOP_GRACE_S, has the guard
    kill every process of the launch.  The guard kills them too when mlslrun dies.
    """

    def __init__(self, argv: Sequence[str]):
        self.proc = subprocess.Popen([sys.executable, "-S", GUARD_PY, *argv], start_new_session=True)
        self.signals_received = 0
        self.first_signal: Optional[int] = None
        self._kill_at: Optional[float] = None
        self._guard_kill_at: Optional[float] = None

    def on_signal(self, signum: int, _frame=None) -> None:
        self.signals_received += 1
        if self.signals_received == 1:
            self.first_signal = signum
            self._send(signum)
        else:
            self.kill()

    def stop(self) -> None:
        """Ask the launcher to stop the job; kill it if it has not after STOP_GRACE_S."""
        if self._kill_at is None:
            self._send(signal.SIGTERM)
            self._kill_at = time.monotonic() + STOP_GRACE_S

    def kill(self) -> None:
        """The guard kills every process of the launch (itself too, if it does not)."""
        if self._guard_kill_at is None:
            self._send(GUARD_KILL)
            self._guard_kill_at = time.monotonic() + GUARD_GRACE_S
        elif time.monotonic() > self._guard_kill_at:
            self._send(signal.SIGKILL)

    def poll(self) -> Optional[int]:
        """The returncode once exited, else None; escalates an overdue stop() or kill()."""
        code = self.proc.poll()
        if code is None and self._kill_at is not None and time.monotonic() > self._kill_at:
            self.kill()
        return code

    def _send(self, signum: int) -> None:
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a watched job ended: the launcher's returncode, why mlslrun stopped the job (None: it
    did not), and the rank that left without finalizing MPI when that was why."""

    code: int
    reason: Optional[str] = None
    leaver: Optional[RankStatus] = None


def _stop_reason(statuses: Sequence[RankStatus], status_dir: str,
                 num_proc: int) -> tuple[Optional[str], Optional[RankStatus]]:
    """(why to stop the job now, the rank that left without finalizing MPI if that is why), or
    (None, None) while nothing calls for it."""
    failure = first_failure(statuses)
    if failure is not None and failure.caused_by_peer and shut_down_peer(failure) is None \
            and time.time() < (failure.failed_at or failure.time) + PEER_GRACE_S:
        failure = None  # the rank whose end it reports may still record why it ended
    if failure is not None and failure.forwarded is not None:
        failure = None  # the launcher is stopping the job already; run_job tells why when it ended
    if failure is not None:
        return f"{blame(failure, status_dir)}; stopping the other ranks", None
    stranding, waiting = stranding_leaver(statuses, mpi_started_ranks(status_dir, num_proc), time.time())
    if stranding is not None:
        return (f"{stranding.describe()} without starting MPI (before init()), while {format_ranks(waiting)} "
                "started it and wait in MPI_Init, which needs every rank of the job; stopping the job"), None
    leaver = unfinalized_leaver(statuses, num_proc, time.time(), LEAVER_GRACE_S)
    if leaver is not None:
        return (f"{leaver.describe()} without finalizing MPI while "
                f"{format_ranks(still_running(statuses, num_proc, leaver))} still ran, and the launcher "
                f"has not ended the job {format_seconds(LEAVER_GRACE_S)} s later; stopping it"), leaver
    return None, None


def _watch(job: _Job, status_dir: str, num_proc: int, start_timeout: Optional[float]) -> Outcome:
    """Wait for the launcher; stop it on a failed rank, a rank that left without finalizing MPI
    while others ran, or a start timeout."""
    deadline = None if start_timeout is None else time.monotonic() + start_timeout
    reason, leaver = None, None
    while True:
        code = job.poll()
        if code is not None:
            return Outcome(code, reason, leaver)
        if reason is None:
            reason, leaver = _stop_reason(rank_statuses(status_dir, num_proc), status_dir, num_proc)
            if reason is None and deadline is not None and time.monotonic() > deadline:
                missing = sorted(set(range(num_proc)) - started_ranks(status_dir, num_proc))
                if missing:
                    reason = (f"{format_ranks(missing)} did not start within "
                              f"{format_seconds(start_timeout)} s (--start-timeout); "
                              "stopping the job")
                deadline = None
            if reason is not None:
                if not job.signals_received:  # else the failure is mlslrun's signal's doing
                    _err(reason)
                job.stop()
        time.sleep(POLL_S)


def _report_leaver(leaver: RankStatus, statuses: Sequence[RankStatus], num_proc: int,
                   then: str) -> None:
    how = ("without finalizing MPI (os._exit, or an exit before MPI_Finalize?)" if leaver.mpi == MPI_NOT_FINALIZED
           else "without finishing the job (os._exit, or an exit before mlsl_tf's shutdown?)")
    _err(f"job failed: {leaver.describe()} while {format_ranks(still_running(statuses, num_proc, leaver))} "
         f"still ran: it left {how}; {then}")


def _left_early(code: int, status_dir: str, num_proc: int) -> Optional[RankStatus]:
    """After a job in which no rank failed: when the launcher failed, or a rank that started
    never recorded its end (the launcher killed it with its wrapper), print which rank left
    first while others still ran and return it; else None."""
    statuses = rank_statuses(status_dir, num_proc)
    vanished = sorted(started_ranks(status_dir, num_proc) - {s.rank for s in statuses})
    if code == 0 and not vanished:
        return None
    leaver = early_leaver(statuses, num_proc)
    if leaver is None:
        return None
    _report_leaver(leaver, statuses, num_proc,
                   f"then the launcher ended {format_ranks(vanished)}" if vanished
                   else f"the launcher exited with code {exit_code_of(code)}")
    return leaver


def run_job(argv: Sequence[str], status_dir: str, num_proc: int,
            start_timeout: Optional[float]) -> int:
    """Run the launcher argv, forwarding SIGINT/SIGTERM; returns mlslrun's exit code.

    The code is 128 + the signal when mlslrun was sent SIGINT/SIGTERM, the
    failing rank's (its exit code or 128 + signal) when a rank failed, 1 when
    mlslrun stopped the job for --start-timeout or for a rank that left without
    finalizing MPI, otherwise the launcher's own.
    """
    job = _Job(argv)
    previous = {s: signal.signal(s, job.on_signal) for s in child.FORWARDED_SIGNALS}
    try:
        outcome = _watch(job, status_dir, num_proc, start_timeout)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if job.first_signal is not None:
        _err(f"job stopped: mlslrun received {rank_status.signal_name(job.first_signal)}")
        return 128 + job.first_signal
    statuses = rank_statuses(status_dir, num_proc)
    if outcome.leaver is not None:  # the other ranks' ends are mlslrun's doing
        _report_leaver(outcome.leaver, statuses, num_proc, "then mlslrun stopped the job")
        return EXIT_FAILURE
    leaver = None if outcome.reason is not None else left_before_the_stop(statuses, num_proc)
    if leaver is not None:
        stopped = [s.rank for s in statuses if s.failed]
        _report_leaver(leaver, statuses, num_proc, f"then the launcher stopped {format_ranks(stopped)}")
        return exit_code_of(outcome.code) or EXIT_FAILURE
    failure = first_failure(statuses)
    if failure is not None:
        if outcome.reason is None:
            _err(f"job failed: {blame(failure, status_dir)}")
        return failure.wrapper_exit_code
    if outcome.reason is not None or _left_early(outcome.code, status_dir, num_proc) is not None:
        return exit_code_of(outcome.code) or EXIT_FAILURE
    return exit_code_of(outcome.code)


# ---------------------------------------------------------------------------
# main.


def _not_a_directory(path: str) -> Optional[str]:
    """The part of `path` that exists here and is not a directory (so no rank could make its
    output directory under it), or None."""
    at = path
    while at and not os.path.lexists(at):
        parent = os.path.dirname(at)
        if parent == at:
            return None
        at = parent
    return None if not at or os.path.isdir(at) else at


def _read_hosts(cfg: RunConfig) -> Optional[tuple[HostSlots, ...]]:
    if cfg.hostfile is None:
        return cfg.hosts
    try:
        with open(cfg.hostfile, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"--hostfile {cfg.hostfile}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"--hostfile {cfg.hostfile}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    return parse_hostfile(text, source=cfg.hostfile)


def _launcher(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[Flavour, str]:
    """(flavour, program) to run; raises RuntimeError when none is usable."""
    srun = shutil.which("srun")
    kind = choose_launcher(cfg.launcher, "SLURM_JOB_ID" in environ, srun is not None)
    if kind == "srun":
        if srun is None:
            raise RuntimeError("--launcher srun: srun is not on PATH")
        return "slurm", srun
    chosen = chosen_mpiexec(environ, environ.get("PATH"))
    mpiexec = chosen or find_mpiexec()
    if mpiexec is None:
        raise RuntimeError(f"no mpiexec next to {sys.executable} or on PATH; install MPI "
                           f"(e.g. pip install mpich), set {MPIEXEC_ENV} or use --launcher srun")
    try:
        flavour = detect_flavour(mpi_version_text(mpiexec))
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise RuntimeError(f"{mpiexec}: {e}") from None
    # A launcher named by MLSL_TF_MPIEXEC runs as given: its directory may hold another MPI's
    # mpirun (Debian's /usr/bin/mpirun is whichever MPI the alternatives system chose).
    return flavour, chosen or flavour_program(flavour, mpiexec)


def plan_argv(cfg: RunConfig, environ: Mapping[str, str],
              status_dir: str) -> tuple[Flavour, list[str]]:
    """Everything before the launch: hosts, launcher, argv, and the ssh check of the remote
    hosts.  Raises UsageError for bad input, RuntimeError when no launcher is usable or
    some host fails the ssh check (the message lists each one and why)."""
    hosts = _read_hosts(cfg)
    flavour, program = _launcher(cfg, environ)
    rank_cmd = rank_command(sys.executable, TASK_PY, cfg, status_dir)
    ssh = ssh_options(cfg)
    ssh_check.check_identity_file(ssh)
    ssh_exec = ssh_check.write_launcher_exec(status_dir, ssh) if needs_ssh_exec(flavour, cfg) else None
    plan = make_plan(cfg, program, hosts, environ, rank_cmd, ssh_exec)
    if flavour != "slurm":  # SLURM places the ranks in its allocation
        check_ranks_here(cfg, plan.hosts)
    argv = build_launch_argv(flavour, plan)
    if plan.hosts is not None and flavour != "slurm" and cfg.ssh_check:
        ssh_check.preflight([h.host for h in plan.hosts], ssh, sys.executable, TASK_PY)
    return flavour, argv


def check_ranks_here(cfg: RunConfig, hosts: Optional[Sequence[HostSlots]],
                     cores: Optional[int] = None) -> None:
    """Raise UsageError when the ranks placed on this machine (all of them without -H /
    --hostfile) are more than OVERSUBSCRIBE_PER_CORE per core and --oversubscribe was not given:
    such a job only thrashes (a mistyped -np starts thousands of processes)."""
    if cfg.oversubscribe:
        return
    here = cfg.num_proc if hosts is None else sum(h.slots for h in hosts if ssh_check.is_local(h.host))
    cores = cores or len(os.sched_getaffinity(0))
    limit = OVERSUBSCRIBE_PER_CORE * cores
    if here > limit:
        raise UsageError(f"-np {cfg.num_proc} puts {here} ranks on this host, which has {cores} core"
                         f"{'s' if cores != 1 else ''}: more than {limit} ({OVERSUBSCRIBE_PER_CORE} per core) "
                         f"needs --oversubscribe")


def _start_generation(cfg: RunConfig, status_dir: str) -> _Job:
    """Elastic mlslrun's launch of one generation (elastic_driver.py): the plan of a fixed job,
    with MPICH's hydra told to keep the survivors of a dead worker (-disable-auto-cleanup).  The
    remote hosts ssh cannot reach are reported as elastic_driver.HostsUnreachable."""
    if cfg.ssh_check:
        remote = ssh_check.remote_hosts([h.host for h in cfg.hosts or ()])
        failures = ssh_check.check_hosts(remote, ssh_options(cfg), sys.executable, TASK_PY)
        if failures:
            raise elastic_driver.HostsUnreachable([f.split(":", 1)[0] for f in failures], "; ".join(failures))
    flavour, argv = plan_argv(dataclasses.replace(cfg, ssh_check=False), os.environ, status_dir)
    if flavour == "mpich":
        argv = [argv[0], "-disable-auto-cleanup", *argv[1:]]
    if cfg.verbose:
        print(f"mlslrun: {flavour} launcher: {shlex.join(argv)}", flush=True)
    return _Job(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """mlslrun's entry point; returns the process exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = parse_args(args)
    except UsageError as e:
        print(build_parser().format_usage(), end="", file=sys.stderr)
        _err(f"error: {e}")
        return EXIT_USAGE
    if cfg.show_help:
        sys.stdout.write(build_parser().format_help())
        return 0
    if cfg.check_build:
        return check_build()
    if cfg.output_filename is not None:
        cfg = dataclasses.replace(cfg, output_filename=os.path.abspath(cfg.output_filename))
        blocked = _not_a_directory(cfg.output_filename)
        if blocked:
            _err(f"error: --output-filename {cfg.output_filename}: {blocked} is not a directory")
            return EXIT_USAGE
    for name in missing_env(cfg, os.environ):
        _err(f"warning: -x {name}: {name} is not set here, so it is not passed")
    if cfg.elastic is not None:
        try:
            return elastic_driver.run(cfg, _start_generation)
        except UsageError as e:
            _err(f"error: {e}")
            return EXIT_USAGE
    status_dir = tempfile.mkdtemp(prefix="mlslrun-status-")
    try:
        try:
            flavour, launch_argv = plan_argv(cfg, os.environ, status_dir)
        except UsageError as e:
            _err(f"error: {e}")
            return EXIT_USAGE
        except RuntimeError as e:
            _err(f"error: {e}")
            return EXIT_FAILURE
        if cfg.verbose:
            print(f"mlslrun: {flavour} launcher: {shlex.join(launch_argv)}", flush=True)
        try:
            return run_job(launch_argv, status_dir, cfg.num_proc, cfg.start_timeout)
        except OSError as e:
            _err(f"error: cannot run {launch_argv[0]}: {e}")
            return EXIT_FAILURE
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
