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
import os
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
from mlsl_tf.runner.installed import (MPIEXEC_ENV, check_build, chosen_mpiexec, find_mpiexec, flavour_program,
                                      mpi_version_text)
from mlsl_tf.runner.job_verdicts import (LEAVER_GRACE_S, blame, early_leaver, exit_code_of, first_failure,
                                         format_ranks, left_before_the_stop, mpi_started_ranks, rank_statuses,
                                         shut_down_peer, started_ranks, still_running, stranding_leaver,
                                         unfinalized_leaver)
from mlsl_tf.runner.launchers import (Flavour, build_launch_argv, choose_launcher, detect_flavour,
                                      make_plan, needs_ssh_exec, rank_command,
                                      ssh_options)
from mlsl_tf.runner.pmi_relay import MPI_NOT_FINALIZED
from mlsl_tf.runner.rank_env import format_seconds, missing_env
from mlsl_tf.runner.rank_status import RankStatus

POLL_S = 0.1
PEER_GRACE_S = 3.0  # how long a failure that only reports another rank's end waits for its cause
OVERSUBSCRIBE_PER_CORE = 4  # more ranks per core on one host need --oversubscribe
STOP_GRACE_S = 10.0  # after SIGTERM, how long the launcher gets before SIGKILL
EXIT_USAGE = 2
EXIT_FAILURE = 1
TASK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "task.py")
GUARD_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py")
GUARD_KILL = signal.SIGUSR1  # guard.py: kill every process of the launch now
GUARD_GRACE_S = 15.0  # guard.py's sweep takes at most 10 s; then the guard itself gets SIGKILL


def _err(message: str) -> None:
    print(f"mlslrun: {message}", file=sys.stderr, flush=True)


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
