"""An emulated cluster for the ssh tests: hosts h0, h1, ... each running an sshd, on a shared file system.

Each host is a network namespace of benchmarks/hosts.py (its own eth0 on a bridge, address
10.77.0.(i+1)) plus, for everything started in it, a host name of its own (a UTS namespace),
an /etc/hosts naming every host (ip netns's /etc/netns/<namespace>/hosts) and an sshd on
PORT.  The sshd host keys, the login key, a second key no host accepts, known_hosts and the
ssh client configuration are made for the run in a temporary directory; the client
configuration reaches the processes through an `ssh` placed first on PATH (env()), so
nothing of this machine's own ssh setup is read or changed.  Hosts listed in hide_python_on
lose the ranks' interpreter: their sshd runs in a mount namespace where the interpreter's
directory is an empty tmpfs.  UNREACHABLE is a name every host resolves to an address nobody
has.  Root only.  close() (also on a failed start) stops every process left in the
namespaces, deletes the namespaces, their /etc/netns entries and the temporary directory.
"""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import hosts  # noqa: E402  (benchmarks/hosts.py: the namespaces)

PORT = 2222
SSHD = "/usr/sbin/sshd"
UNREACHABLE = "h9"
UNREACHABLE_ADDRESS = hosts.address(9)  # inside the subnet, on no host
TOOLS = ("ip", "unshare", "mount", "ssh", "ssh-keygen")
START_TIMEOUT_S = 15.0


def host_name(i):
    return f"h{i}"


def missing_prerequisites():
    """What this machine lacks for the emulated cluster, as sentences (empty: nothing)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it must run as root (network namespaces, mounts, sshd)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        problems.append(f"missing commands: {', '.join(missing)}")
    if not os.access(SSHD, os.X_OK):
        problems.append(f"no {SSHD}: install openssh-server (apt-get install -y openssh-server)")
    return problems


def etc_hosts_text(count):
    lines = ["127.0.0.1 localhost"] + [f"{hosts.address(i)} {host_name(i)}" for i in range(count)]
    return "\n".join(lines + [f"{UNREACHABLE_ADDRESS} {UNREACHABLE}"]) + "\n"


def sshd_config_text(address, port, host_key, authorized_keys):
    return "\n".join([
        f"ListenAddress {address}:{port}", f"HostKey {host_key}", f"AuthorizedKeysFile {authorized_keys}",
        "PidFile none", "StrictModes no",  # the key files sit in a temporary directory
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "PermitRootLogin prohibit-password", "X11Forwarding no", "AllowTcpForwarding no",
        "LogLevel INFO", ""])


def ssh_config_text(known_hosts):
    return "\n".join([f"UserKnownHostsFile {known_hosts}", "GlobalKnownHostsFile /dev/null",
                      "StrictHostKeyChecking yes", "IdentitiesOnly yes", "IdentityAgent none", ""])


def known_hosts_line(i, port, public_key):
    return f"[{host_name(i)}]:{port},[{hosts.address(i)}]:{port} {public_key.strip()}\n"


# Run in a host: its own host name (and, for sshd where asked, the interpreter's directory hidden).
_IN_HOST = 'hostname "$0" && exec "$@"'
_IN_HOST_HIDING = 'hostname "$0" && mount -t tmpfs -o size=64k,mode=755 mlsl-hidden "$1" && shift && exec "$@"'


class EmulatedHosts:
    """``count`` emulated hosts (namespaces, host names, /etc/hosts) and a temporary directory,
    for a ``with`` block: what the ssh and the SLURM clusters share. A subclass says what it
    lacks (``problems``), starts its daemons (``_start``, after ``_make_hosts``) and stops them
    in ``close`` before ``_close_hosts``."""

    WHAT = "emulated"  # named in the error when the hosts cannot start

    def __init__(self, count):
        self.count = count
        self.tmp = None
        self.net = None
        self.etc_dirs = []

    def problems(self):
        return missing_prerequisites()

    def __enter__(self):
        problems = self.problems()
        if problems:
            raise RuntimeError(f"the {self.WHAT} cluster cannot start here: " + "; ".join(problems))
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _make_hosts(self, prefix):
        """The temporary directory, the namespaces and each host's /etc/hosts."""
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.net = hosts.Hosts(self.count, None)
        try:
            self.net.__enter__()
        except RuntimeError as e:
            self.net = None
            raise RuntimeError(f"cannot make the hosts' network namespaces (root and network namespaces "
                               f"needed): {e}") from None
        for i in range(self.count):
            d = os.path.join("/etc/netns", self.namespace(i))
            os.makedirs(d)
            self.etc_dirs.append(d)
            self._write(os.path.join(d, "hosts"), etc_hosts_text(self.count))

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    @staticmethod
    def _write(path, text):
        with open(path, "w") as f:
            f.write(text)

    def namespace(self, i):
        return hosts.host_namespace(self.net.prefix, i)

    def pids(self, i):
        """The processes running in host ``i``'s namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.namespace(i)], capture_output=True, text=True,
                             check=False, timeout=30).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    # -------------------------------------------------------------- use

    def env(self, base=None):
        return dict(os.environ if base is None else base)

    @staticmethod
    def in_host(host, argv):
        """``argv`` run in host ``host``: its namespace and host name."""
        return ["unshare", "--uts", "sh", "-c", _IN_HOST, host_name(host)] + list(argv)

    def run(self, argv, host=0, env=None, timeout=300, cwd=ROOT):
        """Run ``argv`` on host ``host`` (its namespace and host name); (returncode, stdout,
        stderr, seconds).  Past ``timeout`` the process group is killed and AssertionError raised."""
        full = ["ip", "netns", "exec", self.namespace(host)] + self.in_host(host, argv)
        start = time.monotonic()
        proc = subprocess.Popen(full, env=self.env(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = self._stop(proc)
            raise AssertionError(f"{shlex.join(argv)} on {host_name(host)} still ran after {timeout} s:\n"
                                 f"{out[-3000:]}\n{err[-3000:]}") from None
        except BaseException:  # interrupted (SIGTERM, Ctrl-C): stop it, so it cleans up after itself
            self._stop(proc)
            raise
        return proc.returncode, out, err, time.monotonic() - start

    def start(self, argv, host=0, env=None, cwd=ROOT, output=None):
        """Start ``argv`` on host ``host`` without waiting: the Popen (its own process group),
        stdout and stderr into the file ``output`` (default: discarded)."""
        full = ["ip", "netns", "exec", self.namespace(host)] + self.in_host(host, argv)
        out = open(output, "w") if output else subprocess.DEVNULL
        try:
            return subprocess.Popen(full, env=self.env(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if output:
                out.close()

    @staticmethod
    def _stop(proc, grace_s=15):
        """SIGTERM to the process group (mlslrun then stops its job and removes its files), SIGKILL
        after ``grace_s``; the output it had written."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                return proc.communicate(timeout=grace_s)
            except subprocess.TimeoutExpired:
                continue
        return proc.communicate()

    def rx_bytes(self, i):
        """Bytes host ``i`` has received on its eth0."""
        out = subprocess.run(["ip", "netns", "exec", self.namespace(i), "cat",
                              f"/sys/class/net/{hosts.IFACE}/statistics/rx_bytes"],
                             capture_output=True, text=True, check=True, timeout=30)
        return int(out.stdout)

    # -------------------------------------------------------------- teardown

    def _close_hosts(self):
        """Kills whatever is left in the hosts (only this run's processes live in these
        namespaces) and deletes the namespaces."""
        if self.net is not None:
            for i in range(self.count):
                for pid in self.pids(i):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self.net.close()
            self.net = None

    def _remove_files(self):
        """The hosts' /etc/netns entries and the temporary directory."""
        for d in self.etc_dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.etc_dirs = []
        try:
            os.rmdir("/etc/netns")  # only when no other namespace has files there
        except OSError:
            pass
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def close(self):
        self._close_hosts()
        self._remove_files()


class SshCluster(EmulatedHosts):
    """``count`` emulated hosts with an sshd each, for a ``with`` block."""

    WHAT = "emulated ssh"

    def __init__(self, count=3, hide_python_on=(), python=sys.executable):
        super().__init__(count)
        self.hide_python_on, self.python = tuple(hide_python_on), python
        self.sshd = {}

    # -------------------------------------------------------------- setup

    def _start(self):
        self._make_hosts("mlsl-ssh-")
        self.key = self._keygen("id_ed25519")
        self.wrong_key = self._keygen("wrong_key")
        shutil.copy(self.key + ".pub", self.path("authorized_keys"))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        known = ""
        for i in range(self.count):
            host_key = self._keygen(f"host_key_{host_name(i)}")
            with open(host_key + ".pub") as f:
                known += known_hosts_line(i, PORT, f.read())
            config = self.path(f"sshd_{host_name(i)}.conf")
            self._write(config, sshd_config_text(hosts.address(i), PORT, host_key, self.path("authorized_keys")))
            self._start_sshd(i, config)
        self._write(self.path("known_hosts"), known)
        self._write(self.path("ssh_config"), ssh_config_text(self.path("known_hosts")))
        os.mkdir(self.path("bin"))
        shim = self.path("bin", "ssh")
        self._write(shim, f"#!/bin/sh\nexec {shlex.quote(shutil.which('ssh'))} -F "
                          f"{shlex.quote(self.path('ssh_config'))} \"$@\"\n")
        os.chmod(shim, 0o755)
        for i in range(self.count):
            self._wait_listening(i)

    def _keygen(self, name):
        path = self.path(name)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"mlsl-test-{name}", "-f", path],
                       check=True, capture_output=True)
        return path

    def _start_sshd(self, i, config):
        sshd = [SSHD, "-D", "-e", "-f", config]
        if i in self.hide_python_on:
            hidden = os.path.realpath(os.path.dirname(self.python))
            argv = ["unshare", "--uts", "--mount", "sh", "-c", _IN_HOST_HIDING, host_name(i), hidden] + sshd
        else:
            argv = self.in_host(i, sshd)
        log = open(self.path(f"sshd_{host_name(i)}.log"), "w")
        with log:
            self.sshd[i] = subprocess.Popen(["ip", "netns", "exec", self.namespace(i)] + argv,
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def _wait_listening(self, i):
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Server listening on" not in self.sshd_log(i):
            if self.sshd[i].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd of {host_name(i)} did not start: {self.sshd_log(i).strip()}")
            time.sleep(0.05)

    def stop_sshd(self, i):
        """Stops host ``i``'s sshd (the host can no longer be reached through ssh)."""
        proc = self.sshd[i]
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def start_sshd(self, i):
        """Starts host ``i``'s sshd again, with the configuration it had."""
        self._start_sshd(i, self.path(f"sshd_{host_name(i)}.conf"))
        self._wait_listening(i)

    # -------------------------------------------------------------- use

    def sshd_log(self, i):
        with open(self.path(f"sshd_{host_name(i)}.log")) as f:
            return f.read()

    def env(self, base=None):
        """An environment whose ssh uses this cluster's known_hosts and configuration."""
        env = super().env(base)
        env["PATH"] = self.path("bin") + os.pathsep + env.get("PATH", "")
        return env

    # -------------------------------------------------------------- teardown

    def close(self):
        for proc in self.sshd.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        super().close()
