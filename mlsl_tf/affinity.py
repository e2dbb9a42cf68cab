"""Each rank on its own share of its machine's cores, unless the launcher already placed it.

MPICH's mpiexec (hydra) starts every rank free to run on every core. With several ranks on a
machine, each rank's TensorFlow then sizes its intra-op pool for the whole machine, the ranks'
threads migrate between cores, and a gradient the background thread just received may land in
another core's cache than the one that reads it next. init() therefore gives local rank i the
i-th of local_size equal, contiguous blocks of the machine's physical cores (each core with its
hardware threads), before TensorFlow builds its thread pools, which it sizes from the cores a
thread may use -- as Open MPI and Intel MPI bind ranks by default.

It leaves the threads where they are when:
  - MLSL_TF_BIND=none (the default is auto);
  - the launcher bound the rank (srun --cpu-bind, mpirun --bind-to, taskset, numactl): the
    rank may not use every core its cgroup allows;
  - MLSL_TF_COMM_CORE pins the background thread: the user places threads;
  - the machine has fewer physical cores than ranks: every rank would get a share of one core.

Pure functions (parse_cpu_list, physical_cores, share) hold the policy; bind() reads /proc and
/sys and applies it to every thread of the process.
"""

import logging
import os

SETTING = "MLSL_TF_BIND"
_log = logging.getLogger("mlsl_tf")


def parse_cpu_list(text):
    """The set of CPUs in a kernel CPU list such as '0-3,8,10-11' (empty text: empty set)."""
    cpus = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def physical_cores(cpus, topology):
    """`cpus` grouped into physical cores: a list of sorted lists of CPU numbers, ordered by
    (package, core). topology(cpu) -> (package, core id), or None when unknown (then the CPU
    counts as a core of its own); core_of reads it from /sys."""
    groups = {}
    for cpu in sorted(cpus):
        key = topology(cpu)
        groups.setdefault(("cpu", cpu) if key is None else ("core",) + tuple(key), []).append(cpu)
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0] == "cpu",) + k[1:])]


def share(cores, local_rank, local_size):
    """The CPUs of local rank `local_rank`'s block when `cores` (from physical_cores) are split
    into local_size contiguous blocks as equal as they can be (the first blocks get one core
    more), or None when there are fewer cores than ranks."""
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} of {local_size} ranks")
    if len(cores) < local_size:
        return None
    base, extra = divmod(len(cores), local_size)
    start = local_rank * base + min(local_rank, extra)
    block = cores[start:start + base + (1 if local_rank < extra else 0)]
    return {cpu for core in block for cpu in core}


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def allowed_cpus():
    """The CPUs this process's cgroup lets it use (cgroup v2 or v1 cpuset), else every online CPU."""
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            text = _read(f"/sys/fs/cgroup{path.rstrip('/')}/cpuset.cpus.effective")
        elif "cpuset" in controllers.split(","):
            text = _read(f"/sys/fs/cgroup/cpuset{path.rstrip('/')}/cpuset.effective_cpus")
        else:
            continue
        if text and text.strip():
            return parse_cpu_list(text)
    return parse_cpu_list(_read("/sys/devices/system/cpu/online") or "") or set(os.sched_getaffinity(0))


def core_of(cpu):
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    package, core = _read(base + "physical_package_id"), _read(base + "core_id")
    if package is None or core is None:
        return None
    return int(package), int(core)


def plan(setting, local_rank, local_size, comm_cores, current, allowed, topology):
    """(cpus or None, why): the CPUs this rank should run on, or None and the reason to leave it
    (comm_cores: MLSL_TF_COMM_CORE as mlsl_tf.cores.parse gives it; topology as for
    physical_cores)."""
    if setting.strip().lower() == "none":
        return None, f"{SETTING}={setting}"
    if comm_cores:
        return None, "MLSL_TF_COMM_CORE places the background thread"
    if local_size < 2:
        return None, "one rank on this machine"
    if set(current) != set(allowed):
        return None, "the launcher bound this rank already"
    cores = physical_cores(allowed, topology)
    cpus = share(cores, local_rank, local_size)
    if cpus is None:
        return None, f"{local_size} ranks on {len(cores)} physical cores"
    return cpus, f"local rank {local_rank} of {local_size} on {len(cores)} physical cores"


_bound = None  # the CPUs an earlier init() of this process bound it to


def bind(local_rank, local_size, setting, comm_cores):
    """Applies plan() to every thread of this process. Returns the CPUs bound to, or None."""
    global _bound
    if _bound is not None and set(os.sched_getaffinity(0)) == _bound:
        return _bound  # init() again: the mask is our own, not a launcher's
    cpus, why = plan(setting, local_rank, local_size, comm_cores, os.sched_getaffinity(0), allowed_cpus(), core_of)
    if cpus is None:
        _log.info("mlsl_tf: threads not bound (%s)", why)
        return None
    done = set()
    for _ in range(3):  # again for threads started meanwhile by a thread not yet bound
        tids = set(os.listdir("/proc/self/task")) - done
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except ProcessLookupError:
                pass  # the thread has ended
            except OSError as e:
                _log.warning("mlsl_tf: could not bind thread %s to CPUs %s: %s", tid, sorted(cpus), e)
        done |= tids
    _log.info("mlsl_tf: threads bound to CPUs %s (%s)", sorted(cpus), why)
    _bound = cpus
    return cpus
