"""A worker's line to elastic mlslrun: host updates and lost peers in, reset notices out.

Standard library only.  Under `mlslrun --min-np/--max-np/--host-discovery-script` every worker gets
MLSL_TF_ELASTIC_DRIVER (host:port:token) and init() connects here.  One daemon thread reads the
driver's messages, one JSON object a line:

- {"type": "hosts_updated", "timestamp": T, "result": R}: handed to every registered listener's
  on_hosts_updated(T, R) (elastic state objects; commit() raises HostsUpdatedInterrupt on it);
- {"type": "peer_lost", "reason": "..."}: a worker of this generation died; the reset handler
  (elastic.run's: write the last commit, then leave) runs on this thread.  Without one the worker
  leaves at once with RESET_EXIT_CODE.

A worker leaving for a reset says so first ({"type": "reset", "saved": path or null}), so the
driver tells a reset from a failure, and which file holds the last commit."""

import json
import os
import socket
import threading

DRIVER_ENV = "MLSL_TF_ELASTIC_DRIVER"          # host:port:token of the driver
GENERATION_ENV = "MLSL_TF_ELASTIC_GENERATION"  # 1 for the first set of workers, then 2, 3, ...
STATE_DIR_ENV = "MLSL_TF_ELASTIC_STATE_DIR"    # where a leaving worker writes the last commit
RESUME_ENV = "MLSL_TF_ELASTIC_RESUME"          # the commit file the new rank 0 starts from
RESET_EXIT_CODE = 75  # a worker that leaves for a reset (the driver starts the next generation)

_link = None
_lock = threading.Lock()


class Link:
    """The connection and its reader thread (one per process, made by connect())."""

    def __init__(self, address, rank, generation):
        host, port, token = address.rsplit(":", 2)
        self.generation = generation
        self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        self._listeners = []
        self._updates = []  # every hosts_updated received: a listener added later gets them too
        self.reset_handler = None
        self.lost = None  # the reason of the first peer_lost received
        self.send({"type": "worker", "token": token, "generation": generation, "rank": rank, "pid": os.getpid()})
        threading.Thread(target=self._read, name="mlsl_tf-elastic-link", daemon=True).start()

    def send(self, message):
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError:
                pass  # the driver is gone: the launcher stops this worker

    def add_listener(self, listener):
        with self._send_lock:
            if listener in self._listeners:
                return
            self._listeners.append(listener)
            missed = list(self._updates)
        for timestamp, result in missed:
            listener.on_hosts_updated(timestamp, result)

    def remove_listener(self, listener):
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _read(self):
        buffer = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    self._handle(json.loads(line))
                except ValueError:
                    continue

    def _handle(self, message):
        kind = message.get("type")
        if kind == "hosts_updated":
            update = (message.get("timestamp", 0), message.get("result", 0))
            with self._send_lock:
                self._updates.append(update)
                listeners = list(self._listeners)
            for listener in listeners:
                listener.on_hosts_updated(*update)
        elif kind == "peer_lost" and self.lost is None:
            self.lost = str(message.get("reason", "a worker was lost"))
            handler = self.reset_handler
            if handler is not None:
                handler(self.lost)
            else:
                self.send({"type": "reset", "saved": None})
                os._exit(RESET_EXIT_CODE)


def connect(rank):
    """Connects to the driver named by DRIVER_ENV (once per process); the Link, or None when this
    worker was not started by elastic mlslrun.  Raises OSError when the driver cannot be reached."""
    global _link
    address = os.environ.get(DRIVER_ENV)
    if not address:
        return None
    with _lock:
        if _link is None:
            _link = Link(address, rank, generation())
    return _link


def current():
    """The Link of this process, or None (not elastic, or init() not called yet)."""
    return _link


def generation():
    """Which generation of workers this process belongs to (0: not started by elastic mlslrun)."""
    try:
        return int(os.environ.get(GENERATION_ENV, "0"))
    except ValueError:
        return 0


def resume_path():
    """The commit file this generation starts from, or None."""
    return os.environ.get(RESUME_ENV) or None


def state_path(rank):
    """Where this worker writes the last commit when it leaves for a reset (None: nowhere set)."""
    directory = os.environ.get(STATE_DIR_ENV)
    if not directory:
        return None
    return os.path.join(directory, f"commit.g{generation()}.r{rank}.pkl")
