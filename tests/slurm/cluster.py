"""A real SLURM on emulated hosts: slurmctld and one slurmd per host of the ssh tests' namespaces, with munge.

The hosts h0, h1, ... are benchmarks/hosts.py's network namespaces (eth0 on a bridge, address
10.77.0.(i+1)), each with its own host name (a UTS namespace) and an /etc/hosts naming all of
them, as in tests/ssh/cluster.py; what a slurmd starts also has the host's own /dev/shm.  Debian's daemons run unchanged from their packages: one
munged (in this machine's namespaces; its socket is a file every host reaches), slurmctld on
h0 and a slurmd on every host, started with `-N hI` on the host's address.  Everything they
keep -- munge key and socket, slurm.conf, state, spool directories, logs, pid files -- is in a
temporary directory; client commands find the configuration through SLURM_CONF (env()), so
this machine's /etc/slurm and /etc/munge are neither read nor changed.  run() runs a command
on a host as a user logged in there would (h0 is the "login node").  Root only.  close()
(also on a failed start) stops the daemons and every process left in the namespaces, deletes
the namespaces, their /etc/netns entries and the temporary directory.
"""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import time



def _load_ssh_cluster():
    """tests/ssh/cluster.py (host names, /etc/hosts, benchmarks/hosts.py), under a name of its own:
    this file is `cluster` too."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ssh", "cluster.py")
    spec = importlib.util.spec_from_file_location("mlsl_ssh_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


emulated_ssh = _load_ssh_cluster()

ROOT = emulated_ssh.ROOT
hosts = emulated_ssh.hosts
host_name = emulated_ssh.host_name

SLURMCTLD, SLURMD, MUNGED, MUNGEKEY = "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/sbin/mungekey"
CLIENTS = ("sbatch", "salloc", "srun", "scancel", "scontrol", "sinfo", "squeue")
TOOLS = ("ip", "unshare") + CLIENTS
CTLD_PORT, SLURMD_PORT = 6817, 6818
CPUS_PER_HOST = 2
# Seconds without an answer from a slurmd before slurmctld sets its node DOWN (and fails the
# node's jobs); slurmctld pings every node about a third of that.
SLURMD_TIMEOUT_S = 6
# Seconds between a job's SIGTERM and SIGKILL (scancel, time limit, node failure).
KILL_WAIT_S = 5
START_TIMEOUT_S = 60.0

# A host's slurmd (and so every task it starts): its own host name and its own /dev/shm, as on
# separate machines -- MPICH names a node's shared-memory segment after the job, so the ranks of
# two hosts sharing one /dev/shm would open each other's.
_SLURMD_IN_HOST = 'hostname "$0" && mount -t tmpfs -o mode=1777,size=1g mlsl-shm /dev/shm && exec "$@"'


def missing_prerequisites():
    """What this machine lacks for the emulated SLURM cluster, as sentences (empty: nothing)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it must run as root (network namespaces, slurmd, munged)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    missing += [p for p in (SLURMCTLD, SLURMD, MUNGED, MUNGEKEY) if not os.access(p, os.X_OK)]
    if missing:
        problems.append(f"missing: {', '.join(missing)} (apt-get install -y slurm-wlm munge)")
    return problems


def slurm_conf_text(tmp, count, cpus=CPUS_PER_HOST):
    """slurm.conf for hosts h0..h(count-1), controller on h0, all state under ``tmp``.

    No cgroups (the hosts are namespaces of one kernel, and containers seldom delegate cgroups):
    processes are tracked by their parent chain (proctrack/linuxproc) and not bound (task/none).
    config_overrides: each node has the CPUs written here, whatever this machine has."""
    nodes = [f"NodeName={host_name(i)} NodeAddr={hosts.address(i)} CPUs={cpus} State=UNKNOWN"
             for i in range(count)]
    names = ",".join(host_name(i) for i in range(count))
    return "\n".join([
        "ClusterName=mlsl",
        f"SlurmctldHost={host_name(0)}({hosts.address(0)})",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={tmp}/munge/munge.socket",
        f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
        f"StateSaveLocation={tmp}/ctld", f"SlurmdSpoolDir={tmp}/spool/%n",
        f"SlurmctldPidFile={tmp}/slurmctld.pid", f"SlurmdPidFile={tmp}/slurmd.%n.pid",
        f"SlurmctldLogFile={tmp}/slurmctld.log", f"SlurmdLogFile={tmp}/slurmd.%n.log",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        f"PlugStackConfig={tmp}/plugstack.conf",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none", "ReturnToService=2",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}", f"KillWait={KILL_WAIT_S}", "InactiveLimit=0",
        "MessageTimeout=10", "MinJobAge=600",
        *nodes,
        f"PartitionName=emu Nodes={names} Default=YES MaxTime=INFINITE State=UP",
        ""])


def cgroup_conf_text(tmp):
    """cgroup.conf (next to slurm.conf): slurmd loads a cgroup plugin whatever the other plugins
    are, and its automatic choice reads /sys/fs/cgroup, which `ip netns exec` hides (it mounts a
    sysfs of the namespace).  cgroup/v1 on an empty directory of its own loads, and with the
    plugins of slurm.conf nothing ever makes a cgroup there."""
    return f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={tmp}/cgroup\n"


class SlurmCluster(emulated_ssh.EmulatedHosts):
    """``count`` emulated hosts running a SLURM cluster, for a ``with`` block."""

    WHAT = "emulated SLURM"

    def __init__(self, count=2):
        super().__init__(count)
        self.munged = None
        self.slurmctld = None
        self.slurmd = {}

    def problems(self):
        return missing_prerequisites()

    # -------------------------------------------------------------- setup

    def _start(self):
        self._make_hosts("mlsl-slurm-")
        os.chmod(self.tmp, 0o755)  # munged checks the directories above its files
        for d in ("munge", "ctld", "spool", "jobs"):
            os.mkdir(self.path(d), 0o700 if d == "munge" else 0o755)
        self._start_munged()
        with open(self.path("plugstack.conf"), "w"):
            pass  # no SPANK plugins (this machine's /etc/slurm/plugstack.conf is not read)
        self._write(self.path("slurm.conf"), slurm_conf_text(self.tmp, self.count))
        self._write(self.path("cgroup.conf"), cgroup_conf_text(self.tmp))
        os.mkdir(self.path("cgroup"))
        self.slurmctld = self._daemon(0, "slurmctld", [SLURMCTLD, "-D", "-i"])
        for i in range(self.count):
            self.start_slurmd(i, wait=False)
        self.wait_idle(range(self.count))

    def _start_munged(self):
        key = self.path("munge", "munge.key")
        subprocess.run([MUNGEKEY, "--create", "--keyfile", key], check=True, capture_output=True, timeout=30)
        os.chmod(key, 0o400)
        log = open(self.path("munged.out"), "w")
        with log:
            self.munged = subprocess.Popen(
                [MUNGED, "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                 f"--pid-file={self.path('munge', 'munged.pid')}", f"--log-file={self.path('munged.log')}",
                 f"--seed-file={self.path('munge', 'munged.seed')}", "--num-threads=2"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(self.munge_socket):
            if self.munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._read('munged.out')}{self._read('munged.log')}")
            time.sleep(0.05)

    @property
    def munge_socket(self):
        return self.path("munge", "munge.socket")

    def _daemon(self, i, name, argv, own_shm=False):
        """``argv`` started in host ``i`` (its namespace and host name; with ``own_shm`` its own
        /dev/shm); output to tmp/<name>.out."""
        in_host = (["unshare", "--uts", "--mount", "sh", "-c", _SLURMD_IN_HOST, host_name(i)] + argv if own_shm
                   else self.in_host(i, argv))
        full = ["ip", "netns", "exec", self.namespace(i)] + in_host
        log = open(self.path(f"{name}.out"), "a")
        with log:
            return subprocess.Popen(full, env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_slurmd(self, i, wait=True):
        """Starts host ``i``'s slurmd (again); with ``wait``, until its node is idle."""
        os.makedirs(self.path("spool", host_name(i)), exist_ok=True)
        self.slurmd[i] = self._daemon(i, f"slurmd.{host_name(i)}", [SLURMD, "-D", "-N", host_name(i)],
                                      own_shm=True)
        if wait:
            self.wait_idle([i])

    def kill_slurmd(self, i):
        """SIGKILL to host ``i``'s slurmd (its job steps' slurmstepd and tasks live on)."""
        proc = self.slurmd[i]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def node_states(self):
        """{node: state} as sinfo reports them (e.g. idle, alloc, down*)."""
        code, out, err, _ = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
        if code != 0:
            return {}
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, which, timeout=START_TIMEOUT_S):
        """Until the nodes of hosts ``which`` are idle; RuntimeError with the logs past ``timeout``."""
        names = [host_name(i) for i in which]
        deadline = time.monotonic() + timeout
        states = {}
        while True:
            for proc, what in [(self.slurmctld, "slurmctld")] + [(self.slurmd[i], f"slurmd.{host_name(i)}")
                                                                  for i in which]:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what} exited with code {proc.returncode}: {self.logs(what)}")
            states = self.node_states()
            if all(states.get(n) == "idle" for n in names):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {names} not idle after {timeout:.0f} s (sinfo: {states}):\n"
                                   + "\n".join(self.logs(w) for w in ["slurmctld"] + [f"slurmd.{n}" for n in names]))
            time.sleep(0.25)

    def _read(self, name):
        try:
            with open(self.path(name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def logs(self, daemon):
        """The daemon's log and console output (daemon: slurmctld, slurmd.h0, ...)."""
        return f"--- {daemon}.log\n{self._read(daemon + '.log')[-4000:]}--- {daemon}.out\n" \
               f"{self._read(daemon + '.out')[-2000:]}"

    # -------------------------------------------------------------- use

    def env(self, base=None):
        """An environment whose SLURM commands talk to this cluster."""
        env = super().env(base)
        env["SLURM_CONF"] = self.path("slurm.conf")
        for name in [n for n in env if n.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))]:
            if name != "SLURM_CONF":  # an outer job's settings would leak into this cluster's jobs
                del env[name]
        return env

    def scontrol(self, *args, timeout=30):
        code, out, err, _ = self.run(["scontrol", *args], timeout=timeout)
        if code != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {err.strip() or out.strip()}")
        return out

    def job(self, job_id):
        """The job's fields as `scontrol show job` gives them ({'JobState': 'COMPLETED', ...})."""
        text = self.scontrol("show", "job", "-o", str(job_id))
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))

    def wait_job_end(self, job_id, timeout):
        """The job's fields once it is no longer PENDING, RUNNING, CONFIGURING or COMPLETING;
        AssertionError past ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {fields.get('JobState')} after {timeout} s: {fields}")
            time.sleep(0.25)

    def processes_with(self, i, marker):
        """{pid: command line} of host ``i``'s processes whose command line contains ``marker``."""
        found = {}
        for pid in self.pids(i):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if marker in cmdline:
                found[pid] = cmdline
        return found

    # -------------------------------------------------------------- teardown

    def close(self):
        daemons = [p for p in [*self.slurmd.values(), self.slurmctld] if p is not None]
        for proc in daemons:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in daemons:  # their state is thrown away: a short grace
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._close_hosts()  # slurmstepd, job scripts, ranks left in the hosts
        if self.munged is not None:
            if self.munged.poll() is None:
                self.munged.terminate()
            try:
                self.munged.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.munged.kill()
                self.munged.wait()
            self.munged = None
        self._remove_files()
