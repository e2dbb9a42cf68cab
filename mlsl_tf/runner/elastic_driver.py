"""Elastic mlslrun: runs the job as generations of workers over the hosts a discovery script finds.

A generation is one ordinary launch (launch.py starts it: mpiexec with hydra's auto-cleanup off, so
survivors outlive a dead peer) on the hosts available then.  Every rank's wrapper (task.py) and
every worker's mlsl_tf (elastic_link.py) connect to a TCP server here.  From them the driver learns
at once when a worker dies (its wrapper reports the exit code; a host that vanished drops the
connection) and tells the survivors (peer_lost): they write the last commit and leave with
elastic_link.RESET_EXIT_CODE.  The failed worker's host is blacklisted (for good, or for the
cooldown), and the next generation starts on the hosts left, rank 0 on a host that holds the
commit.  Hosts that the discovery script adds or drops are announced to the workers
(hosts_updated); they leave at their next commit and the next generation has the new hosts.
The job ends when a generation's workers all exit 0; it fails when too few hosts are left for
--min-np within --elastic-timeout, or after --reset-limit resets.

Why restart workers instead of shrinking MPI in place: docs/design.md (Elastic training)."""

import dataclasses
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional, Sequence

from mlsl_tf.runner import elastic_hosts as eh
from mlsl_tf.runner.config import EnvSpec, HostSlots, RunConfig, UsageError
from mlsl_tf.runner.hosts import format_hosts
from mlsl_tf.runner.worker_env import LAYOUT_ENV, RESET_EXIT_CODE

DISCOVER_HOSTS_FREQUENCY_S = 1.0   # how often the discovery script runs (Horovod's default)
DISCOVERY_TIMEOUT_S = 30.0         # a discovery script that takes longer has failed
SURVIVOR_GRACE_S = 30.0            # after peer_lost: how long survivors get to leave before a stop
POLL_S = 0.05
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class HostsUnreachable(RuntimeError):
    """The launch of a generation found hosts it cannot reach (the ssh check): they are
    blacklisted as failed hosts and the generation is planned again."""

    def __init__(self, hosts: Sequence[str], report: str):
        super().__init__(report)
        self.hosts = list(hosts)


def _err(message: str) -> None:
    print(f"mlslrun: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class RankEnd:
    """What one rank of a generation did: ``code`` from its wrapper (None: not known), whether it
    left for a reset, and the commit file it wrote."""

    host: str
    code: Optional[int] = None
    reset: bool = False
    saved: Optional[str] = None
    lost_connection: bool = False


class Server:
    """The TCP server the wrappers and workers connect to; one thread per connection.  Events
    (generation, rank, kind, data) go to ``events``; ``broadcast`` writes to every worker of a
    generation."""

    def __init__(self, bind: str = "0.0.0.0"):
        self.token = secrets.token_hex(8)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind, 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self._guard = threading.Lock()
        self._workers: dict = {}   # (generation, rank) -> socket
        self._announced: dict = {}  # generation -> what was broadcast (replayed to workers connecting later)
        self.events: list = []
        self._wake = threading.Condition(self._guard)
        self._closed = False
        threading.Thread(target=self._accept, name="elastic-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        who = None
        buffer = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue
                    if who is None:
                        if message.get("token") != self.token:
                            return
                        who = (message.get("type"), int(message["generation"]), int(message["rank"]))
                        if who[0] == "worker":
                            with self._guard:
                                self._workers[who[1:]] = conn
                                late = list(self._announced.get(who[1], ()))
                            for data in late:
                                conn.sendall(data)
                        continue
                    self._post(who[1], who[2], message.get("type"), message)
        except (OSError, ValueError, KeyError):
            pass
        finally:
            if who is not None:
                if who[0] == "worker":
                    with self._guard:
                        self._workers.pop(who[1:], None)
                self._post(who[1], who[2], f"{who[0]}_closed", {})
            conn.close()

    def _post(self, generation: int, rank: int, kind: str, data: dict) -> None:
        with self._guard:
            self.events.append((generation, rank, kind, data))
            self._wake.notify_all()

    def take_events(self, timeout: float) -> list:
        with self._guard:
            if not self.events:
                self._wake.wait(timeout)
            out, self.events = self.events, []
        return out

    def broadcast(self, generation: int, message: dict, skip: Sequence[int] = ()) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._guard:
            self._announced.setdefault(generation, []).append(data)
            targets = [s for (g, r), s in self._workers.items() if g == generation and r not in skip]
        for s in targets:
            try:
                s.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass


def interface_address(name: str) -> Optional[str]:
    """The IPv4 address of this machine's interface ``name``; None when it has none (or no such
    interface)."""
    siocgifaddr = 0x8915
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(packed[20:24])


def driver_address(hosts: Sequence[str], interfaces: Optional[Sequence[str]] = None) -> str:
    """The address the workers reach this machine by: that of the first of ``interfaces`` with
    an IPv4 address (--network-interface; RuntimeError when none has one); else 127.0.0.1 when
    every host is this machine, else the local address of the route to the first other host."""
    if interfaces:
        for name in interfaces:
            address = interface_address(name)
            if address:
                return address
        raise RuntimeError(f"--network-interface {','.join(interfaces)}: no IPv4 address on this machine")
    mine = {socket.gethostname(), socket.getfqdn(), *LOCAL_NAMES}
    for host in hosts:
        if host in mine:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((socket.gethostbyname(host), 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


def run_discovery(script: str) -> str:
    """The discovery script's output; raises RuntimeError when it fails."""
    try:
        out = subprocess.run([script], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             errors="replace", timeout=DISCOVERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"--host-discovery-script {script}: {e}") from None
    if out.returncode != 0:
        raise RuntimeError(f"--host-discovery-script {script} exited with code {out.returncode}: "
                           f"{out.stderr.strip()[-500:]}")
    return out.stdout


class Driver:
    """One elastic job: the loop over generations.  ``start(cfg, status_dir)`` launches one
    generation and returns its job (launch._Job: poll, stop, kill)."""

    def __init__(self, cfg: RunConfig, start: Callable, now: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.el = cfg.elastic
        self.start = start
        self.now = now
        self.blacklist = eh.Blacklist(self.el.cooldown_range)
        self.identity = eh.SlotIdentity()
        self.server = Server()
        self.state_dir = tempfile.mkdtemp(prefix="mlslrun-elastic-")
        self.resets = 0
        self.stopping: Optional[int] = None  # the signal mlslrun received
        self._rng = random.Random()
        self._last_discovery = -1e9  # when discovery last ran

    # -- hosts ---------------------------------------------------------------------------------
    def discover(self) -> tuple[HostSlots, ...]:
        if self.el.discovery_script is None:
            return tuple(self.cfg.hosts or (HostSlots("localhost", self.cfg.num_proc),))
        return eh.parse_discovery(run_discovery(self.el.discovery_script), self.el.slots_per_host)

    def usable_hosts(self) -> tuple[HostSlots, ...]:
        return self.blacklist.filter(self.discover(), time.time())

    def wait_for_hosts(self, previous: Sequence[str]) -> tuple[HostSlots, ...]:
        """The next generation's hosts once at least --min-np slots are usable; raises RuntimeError
        after --elastic-timeout."""
        deadline = self.now() + self.el.elastic_timeout
        while True:
            hosts = eh.plan_generation(eh.order_hosts(self.usable_hosts(), previous), self.el.max_np)
            if eh.world_size(hosts) >= self.el.min_np:
                return hosts
            self.blacklist.start_cooldowns(time.time())  # no training without them: their time runs
            if self.stopping is not None:
                raise RuntimeError("stopped")
            discovered = self.discover()
            if self.blacklist.all_out_for_good(discovered) or (not discovered and self.el.discovery_script is None):
                raise RuntimeError("one or more processes exited with non-zero status, and every host is "
                                   "blacklisted: no hosts are left to continue on")
            if self.now() > deadline:
                raise RuntimeError(f"timed out after {self.el.elastic_timeout:g} s (--elastic-timeout) waiting "
                                   f"for {self.el.min_np} slots (--min-np); usable now: "
                                   f"{eh.world_size(hosts)} ({','.join(f'{h.host}:{h.slots}' for h in hosts)})")
            time.sleep(min(DISCOVER_HOSTS_FREQUENCY_S, 0.5))

    # -- one generation ------------------------------------------------------------------------
    def generation_config(self, generation: int, hosts: Sequence[HostSlots], resume: Optional[str],
                          address: str) -> RunConfig:
        layout = self.identity.ranks(hosts)
        env = {
            "MLSL_TF_ELASTIC_DRIVER": f"{address}:{self.server.port}:{self.server.token}",
            "MLSL_TF_ELASTIC_GENERATION": str(generation),
            "MLSL_TF_ELASTIC_STATE_DIR": self.state_dir,
            "MLSL_TF_ELASTIC_RESUME": resume or "",
            LAYOUT_ENV: json.dumps(layout, separators=(",", ":")),
        }
        return dataclasses.replace(
            self.cfg, num_proc=eh.world_size(hosts), hosts=tuple(hosts), hostfile=None,
            env=tuple(self.cfg.env) + tuple(EnvSpec(k, v) for k, v in env.items()))

    def watch(self, generation: int, job, hosts: Sequence[HostSlots]) -> dict:
        """Runs a generation to its end; returns {rank: RankEnd}."""
        hosts_of = [h.host for h in hosts for _ in range(h.slots)]
        ends = {r: RankEnd(host) for r, host in enumerate(hosts_of)}
        lost_at = ended_at = None
        notified = None
        while True:
            for g, rank, kind, data in self.server.take_events(POLL_S):
                if g != generation or rank not in ends:
                    continue
                end = ends[rank]
                if kind == "end":
                    end.code = int(data.get("code", 1))
                elif kind == "reset":
                    end.reset, end.saved = True, data.get("saved")
                elif kind == "training":
                    self.blacklist.start_cooldowns(time.time())
                elif kind == "wrapper_closed" and end.code is None:
                    end.lost_connection = True
                if ended_at is None and (end.code not in (None, 0) or end.lost_connection):
                    ended_at = self.now()  # a worker failed or left for a reset: the rest must follow
                if lost_at is None and self._is_loss(end):
                    lost_at = self.now()
                    why = self._describe(rank, end)
                    _err(f"elastic: {why}; resetting the other workers")
                    self.server.broadcast(generation, {"type": "peer_lost", "reason": why}, skip=(rank,))
            code = job.poll()
            if code is not None:
                self.blacklist.start_cooldowns(time.time())  # no word that it trained: from now
                return ends
            if self.stopping is not None:
                job.stop()
            elif ended_at is not None and self.now() > ended_at + SURVIVOR_GRACE_S:
                left = sorted(r for r, e in ends.items() if e.code is None)
                _err(f"elastic: ranks {left} did not leave within {SURVIVOR_GRACE_S:g} s of the reset; stopping them")
                ended_at = float("inf")
                job.stop()
            elif lost_at is None and ended_at is None:
                notified = self._check_hosts(generation, hosts, notified)

    @staticmethod
    def _is_loss(end: RankEnd) -> bool:
        if end.reset:
            return False
        return end.lost_connection or (end.code is not None and end.code not in (0, RESET_EXIT_CODE))

    @staticmethod
    def _describe(rank: int, end: RankEnd) -> str:
        if end.code is None:
            return f"the connection to rank {rank} (host {end.host}) was lost"
        if end.code > 128:
            try:
                name = signal.Signals(end.code - 128).name
            except ValueError:
                name = f"signal {end.code - 128}"
            return f"rank {rank} (host {end.host}) was killed by {name}"
        return f"rank {rank} (host {end.host}) exited with code {end.code}"

    def _check_hosts(self, generation: int, hosts: Sequence[HostSlots], notified):
        """Polls discovery (every DISCOVER_HOSTS_FREQUENCY_S); tells the workers when the next
        generation would differ from this one.  Returns the host set last announced."""
        t = self.now()
        if t - self._last_discovery < DISCOVER_HOSTS_FREQUENCY_S:
            return notified
        self._last_discovery = t
        try:
            usable = self.usable_hosts()
        except (RuntimeError, UsageError) as e:
            _err(f"warning: {e}")
            return notified
        proposed = eh.plan_generation(eh.order_hosts(usable, [h.host for h in hosts]), self.el.max_np)
        kind = eh.update_kind(hosts, proposed)
        if kind == eh.NO_UPDATE or eh.world_size(proposed) < self.el.min_np or proposed == notified:
            return notified
        if self.cfg.verbose:
            _err(f"elastic: hosts changed: {format_hosts(proposed)}; the workers reset at their next commit")
        self.server.broadcast(generation, {"type": "hosts_updated", "timestamp": time.time(), "result": kind})
        return proposed

    # -- the job -------------------------------------------------------------------------------
    def run(self) -> int:
        generation, resume, previous = 0, None, []
        try:
            while True:
                try:
                    hosts = self.wait_for_hosts(previous)
                except RuntimeError as e:
                    if self.stopping is not None:
                        return 128 + self.stopping
                    _err(f"job failed: {e}")
                    return 1
                generation += 1
                try:
                    address = driver_address([h.host for h in hosts], self.cfg.elastic.network_interfaces)
                except RuntimeError as e:
                    _err(f"job failed: {e}")
                    return 1
                cfg = self.generation_config(generation, hosts, resume, address)
                if self.cfg.verbose or generation > 1:
                    _err(f"elastic: generation {generation} on {format_hosts(hosts)} ({eh.world_size(hosts)} workers)")
                status_dir = tempfile.mkdtemp(prefix="mlslrun-status-")
                try:
                    job = self.start(cfg, status_dir)
                    ends = self.watch(generation, job, hosts)
                except HostsUnreachable as e:
                    _err(f"elastic: {e}")
                    for host in e.hosts:
                        seconds = self.blacklist.fail(host, self._rng.random())
                        _err(f"elastic: host {host} blacklisted" + ("" if seconds == float("inf") else
                             f" for {seconds:.1f} s of training") + " (unreachable)")
                    generation -= 1
                    continue
                finally:
                    shutil.rmtree(status_dir, ignore_errors=True)
                if self.stopping is not None:
                    _err(f"job stopped: mlslrun received {signal.Signals(self.stopping).name}")
                    return 128 + self.stopping
                code, resume, previous = self._after_generation(generation, ends, resume)
                if code is not None:
                    return code
        finally:
            self.server.close()
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _after_generation(self, generation: int, ends: dict, resume):
        """After generation `generation` ended (`ends`: rank -> how it ended): (the job's exit code,
        or None to start the next generation; the commit to resume from; the hosts to start it
        on first). Blacklists the hosts that failed."""
        if all(e.code == 0 for e in ends.values()):
            return 0, resume, []
        failed = sorted({e.host for e in ends.values() if self._is_loss(e) or e.code is None and not e.reset})
        if all(self._is_loss(e) or e.code is None and not e.reset for e in ends.values()):
            first = min(ends.items(), key=lambda item: item[0])
            _err(f"job failed: one or more processes exited with non-zero status: every worker of "
                 f"generation {generation} failed, none is left to carry the job on "
                 f"({self._describe(*first)})")
            return 1, resume, []
        for host in failed:
            seconds = self.blacklist.fail(host, self._rng.random())
            _err(f"elastic: host {host} blacklisted" + ("" if seconds == float("inf") else
                 f" for {seconds:.1f} s of training"))
        saved = [(r, e) for r, e in sorted(ends.items()) if e.reset and e.saved]
        if saved:
            resume = saved[0][1].saved
        previous = [e.host for r, e in sorted(ends.items()) if e.reset and e.host not in failed]
        if saved:  # rank 0 of the next generation on the host of the commit file
            previous = [saved[0][1].host] + [h for h in previous if h != saved[0][1].host]
        self.resets += 1
        if self.el.reset_limit is not None and self.resets > self.el.reset_limit:
            _err(f"job failed: the job has been reset {self.resets} times, more than --reset-limit "
                 f"{self.el.reset_limit}")
            return 1, resume, previous
        return None, resume, previous

    def on_signal(self, signum: int, _frame=None) -> None:
        if self.stopping is None:
            self.stopping = signum


def run(cfg: RunConfig, start: Callable) -> int:
    """Elastic mlslrun's main loop (launch.main calls it); returns mlslrun's exit code."""
    driver = Driver(cfg, start)
    previous = {s: signal.signal(s, driver.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return driver.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
