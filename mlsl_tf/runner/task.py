"""Per-rank wrapper that mlslrun puts in front of the user's command.

Run by file path, ``python .../mlsl_tf/runner/task.py [options] -- cmd...``,
so it never imports TensorFlow: standard library only, plus mlsl_tf/cpu_placement.py (the one
parser of MLSL_TF_COMM_CORE, standard library only when imported; the package's __init__ imports nothing) and
the wrapper's own modules of runner/, each standard library only: placement.py (rank, CPUs),
rank_status.py (status files), output.py (output copies and tags), pmi_relay.py (the PMI
connection), child.py (the command's process), worker_env.py (HOROVOD_* variables).  This file
only puts them together.

On every rank it:
  * finds the rank from the launcher's environment (PMI_RANK, OMPI_COMM_WORLD_RANK,
    SLURM_PROCID, PMIX_RANK), and sets horovodrun's HOROVOD_RANK, HOROVOD_SIZE,
    HOROVOD_HOSTNAME, ... for the command;
  * under elastic mlslrun (MLSL_TF_ELASTIC_DRIVER), connects to the driver, says the rank
    started and, when the command ends, its exit code (the driver tells the survivors of a dead
    worker at once), and ignores hydra's SIGUSR1 (its notice of another rank's end);
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
  * refuses to start the command when srun gave it no PMI (pmi_relay.srun_without_pmi: srun
    --mpi=none), where its MPI would be a world of one rank;
  * with ``--status-dir`` and a PMI connection to the launcher (PMI_FD: MPICH's and Intel
    MPI's hydra, SLURM's pmi2), passes that connection through itself and reads the names
    of the commands the command sends on it, so the status says whether the command started
    MPI and whether it finalized it before it ended (``mpi``; see pmi_relay.py): mlslrun stops
    a job one of whose ranks exited without finalizing while the others still run, as hydra
    usually does (but not always);
  * with MLSL_TF_COMM_CORE set (mlslrun --comm-core), starts the command with a CPU
    affinity that leaves out the communication cores, so TensorFlow's thread pools (sized
    from the affinity mask, inherited by every thread) stay off them.  mlsl_tf's init()
    still pins the background thread to its core (the same rule, mlsl_tf/cpu_placement.py): Linux
    affinity is per thread and may name any core of the cgroup's cpuset, whatever mask the
    thread inherited.
"""

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Optional, Sequence

_STARTED_BY = os.getppid()  # as early as possible: the parent may die while this file loads

if not __package__:  # run by file path (every rank): the package's parent dir, for mlsl_tf.runner
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The wrapper's own modules, standard library only (placement also mlsl_tf.cpu_placement): see above.
from mlsl_tf.runner import child as child_process  # noqa: E402
from mlsl_tf.runner import output, placement, pmi_relay, rank_status, worker_env  # noqa: E402




def _horovod_env(rank: int, num_proc: int, host: str) -> dict:
    """HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_HOSTNAME, ... as horovodrun sets them: from the
    elastic driver's layout (the host as the discovery script named it, the slot's first rank),
    else this rank's number and this machine's name."""
    try:
        layout = worker_env.rank_layout(json.loads(os.environ[worker_env.LAYOUT_ENV]))[rank]
    except (KeyError, ValueError, IndexError, TypeError):
        return {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(num_proc), "HOROVOD_HOSTNAME": host}
    return worker_env.horovod_env(layout)


class _DriverLine:
    """Elastic mlslrun's connection from this wrapper: says the rank started, then how it ended
    (the driver tells the survivors of a dead worker at once).  None of it when not elastic."""

    def __init__(self, rank: int, host: str):
        self.sock = None
        address = os.environ.get(worker_env.DRIVER_ENV)
        if not address:
            return
        try:
            addr, port, token = address.rsplit(":", 2)
            self.sock = socket.create_connection((addr, int(port)), timeout=30)
            self._send({"type": "wrapper", "token": token, "rank": rank, "host": host, "pid": os.getpid(),
                        "generation": int(os.environ.get(worker_env.GENERATION_ENV, "0"))})
        except (OSError, ValueError) as e:
            _warn(f"rank {rank}: cannot reach the elastic driver at {address}: {e}")
            self.sock = None

    def _send(self, message: dict) -> None:
        if self.sock is not None:
            self.sock.sendall((json.dumps(message) + "\n").encode())

    def ended(self, code: int) -> None:
        try:
            self._send({"type": "end", "code": code})
        except OSError:
            pass


def _warn(message: str) -> None:
    print(f"mlslrun task: {message}", file=sys.stderr, flush=True)


def _write_start_marker(status_dir: str, rank: int, host: str) -> None:
    try:
        rank_status.write_start_marker(status_dir, rank, host)
    except OSError as e:
        _warn(f"cannot write the start marker in {status_dir}: {e}")


def _write_status(status_dir: str, status: rank_status.RankStatus) -> None:
    try:
        rank_status.write_status(status_dir, status)
    except OSError as e:
        _warn(f"cannot write the status file in {status_dir}: {e}")


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
    if not child_process.die_with_parent(parent):
        _warn("the launcher is gone; not starting the command")
        return 128 + signal.SIGTERM
    try:
        rank = placement.find_rank(os.environ)
    except ValueError as e:
        _warn(str(e))
        return 2
    host = socket.gethostname()
    lone = pmi_relay.srun_without_pmi(os.environ, ns.num_proc)
    if lone is not None:
        _warn(f"rank {rank} (host {host}): {lone}")
        return 2
    output_dir = _output_dir(ns, rank)
    if output_dir is False:
        return 2
    if ns.status_dir is not None:
        _write_start_marker(ns.status_dir, rank, host)
        os.environ[rank_status.FAILURE_FILE_ENV] = rank_status.failure_path(ns.status_dir, rank)
    for name, value in _horovod_env(rank, ns.num_proc, host).items():
        os.environ[name] = value
    driver = _DriverLine(rank, host)
    if driver.sock is not None:
        # hydra without auto-cleanup (elastic) tells the other ranks of a rank's end by SIGUSR1,
        # whose default action would end this wrapper and the command with it
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cpus, warning = placement.affinity_plan(os.environ, placement.allowed_cpus())
    if warning:
        _warn(f"rank {rank}: {warning}")
    relay = None
    if ns.status_dir is not None:
        relay = pmi_relay.from_environ(os.environ, lambda: rank_status.write_mpi_marker(ns.status_dir, rank))
    if relay is not None:
        os.environ[pmi_relay.PMI_FD_ENV] = str(relay.child_fd)
    try:
        child = child_process.Child(ns.command, output_dir, cpus, rank if ns.tag_output else None)
    except OSError as e:
        print(f"mlslrun: rank {rank} (host {host}) could not start {ns.command[0]!r}: {e}",
              file=sys.stderr, flush=True)
        if ns.status_dir is not None:
            _write_status(ns.status_dir, rank_status.RankStatus(rank, host, os.getpid(), 127, None,
                                                                None, time.time()))
        driver.ended(127)
        return 127
    if relay is not None:
        relay.start()
    for sig in child_process.FORWARDED_SIGNALS:
        signal.signal(sig, child.forward)
    threading.Thread(target=child_process.watch_parent, args=(parent, child, _warn), daemon=True).start()
    status = _final_status(ns, rank, host, child, child.wait(), relay)
    if ns.status_dir is not None:
        _write_status(ns.status_dir, status)
    driver.ended(status.wrapper_exit_code)
    if status.failed and not (driver.sock is not None and status.exitcode == worker_env.RESET_EXIT_CODE):
        print(f"mlslrun: {status.describe()}", file=sys.stderr, flush=True)
    return status.wrapper_exit_code


def _output_dir(ns, rank: int):
    """This rank's --output-filename directory, made (None without the option), or False when it
    cannot be made (said on stderr)."""
    if ns.output_filename is None:
        return None
    output_dir = os.path.join(ns.output_filename, output.rank_dir_name(rank, ns.num_proc))
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:  # e.g. a regular file on the path, on this host
        _warn(f"--output-filename: cannot make {output_dir} on {socket.gethostname()}: {e.strerror}")
        return False
    return output_dir


def _final_status(ns, rank: int, host: str, child, code: int, relay) -> rank_status.RankStatus:
    """How the command ended (exit code `code`), with the failure it reported, if any."""
    failure = {}
    if ns.status_dir is not None and code != 0:
        failure = rank_status.read_failure(rank_status.failure_path(ns.status_dir, rank))
    failure.pop("pid", None)  # the child's own pid is known here
    forwarded = child.forwarded
    if failure and code < 0 and forwarded is not None:
        # It had raised and was exiting (code 1) when the launcher, stopping the job because of
        # that very exception, signalled it: the exception is what ended it.
        code, forwarded = 1, None
    return rank_status.RankStatus(rank=rank, host=host, pid=child.proc.pid,
                                  exitcode=code if code >= 0 else None,
                                  signal=-code if code < 0 else None,
                                  forwarded=forwarded, time=time.time(),
                                  mpi=None if relay is None else relay.state(), **failure)


if __name__ == "__main__":
    sys.exit(main())
