"""Where a rank's threads run, decided in one place: the background thread's core
(MLSL_TF_COMM_CORE), the rank's share of its machine's cores (MLSL_TF_BIND), and TensorFlow's
thread pools (MLSL_TF_INTER_OP_THREADS, MLSL_TF_THREAD_SPINNING). init() (mlsl_tf/basics.py)
applies all three; mlslrun's rank wrapper and --comm-core flag (runner/placement.py,
runner/rank_env.py) parse MLSL_TF_COMM_CORE here too.

Standard library only when imported: the rank wrapper imports this module before TensorFlow and
must load nothing else of the package (tests/unit/test_mlslrun.py, TASK_MODULES). So TensorFlow
and mlsl_tf._library (settings, the yes/no reader) are imported inside the functions init()
calls -- the one lazy package import the floor test allows here (tests/unit/test_floors.py,
LAZY_IMPORTS)."""

import logging
import os

_log = logging.getLogger("mlsl_tf")


def _lib():
    """mlsl_tf._library, imported on first use (see the module docstring)."""
    from mlsl_tf import _library
    return _library


# ----------------------------------------------------------------------------------------------
# MLSL_TF_COMM_CORE: the background thread's core
#
# Parsed in one place: which CPU core each local rank's background thread
# runs on. mlslrun's --comm-core flag (runner/rank_env.py) and per-rank wrapper (runner/task.py,
# which keeps the command's threads off those cores) and init() (mlsl_tf/basics.py, which hands
# the decided core to the library, and bind() below, which then leaves threads alone) all
# read the setting through `parse_comm_cores` and `comm_core_for`; the C++ runtime only pins where it is told.

COMM_CORE = "MLSL_TF_COMM_CORE"
COMM_CORE_ALLOWED = "empty, or a core number or a comma-separated list of them (e.g. 3 or 2,3)"


def parse_comm_cores(spec):
    """[] for "" (no pinning), [3] for "3", [2, 3] for "2,3" (spaces around entries allowed);
    raises ValueError naming the setting and the bad entry."""
    if not spec.strip():
        return []
    cores = []
    for item in spec.split(","):
        item = item.strip()
        if not (item.isascii() and item.isdigit()):  # str.isdigit alone takes '²' and '٣'
            raise ValueError(f"{COMM_CORE}={spec!r}: {item!r} is not a core number (expected {COMM_CORE_ALLOWED})")
        cores.append(int(item))
    return cores


def comm_core_for(cores, local_rank):
    """The core of local rank `local_rank`: the (local_rank mod n)-th entry of `cores` (None when
    there are none)."""
    return cores[local_rank % len(cores)] if cores else None


# ----------------------------------------------------------------------------------------------
# MLSL_TF_BIND: each rank on its own share of its machine's cores
#
# Unless the launcher already placed the rank.
#
# MPICH's mpiexec (hydra) starts every rank free to run on every core. With several ranks on a
# machine, each rank's TensorFlow then sizes its intra-op pool for the whole machine, the ranks'
# threads migrate between cores, and a gradient the background thread just received may land in
# another core's cache than the one that reads it next. init() therefore gives local rank i the
# i-th of local_size equal, contiguous blocks of the machine's physical cores (each core with its
# hardware threads), before TensorFlow builds its thread pools, which it sizes from the cores a
# thread may use -- as Open MPI and Intel MPI bind ranks by default.
#
# It leaves the threads where they are when:
#   - MLSL_TF_BIND=none (the default is auto);
#   - the launcher bound the rank (srun --cpu-bind, mpirun --bind-to, taskset, numactl): the
#     rank may not use every core its cgroup allows;
#   - MLSL_TF_COMM_CORE pins the background thread: the user places threads;
#   - the machine has fewer physical cores than ranks: every rank would get a share of one core.
#
# Pure functions (parse_cpu_list, physical_cores, share) hold the policy; bind() reads /proc and
# /sys and applies it to every thread of the process.

BIND = "MLSL_TF_BIND"


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
    (comm_cores: MLSL_TF_COMM_CORE as parse_comm_cores gives it; topology as for
    physical_cores)."""
    if setting.strip().lower() == "none":
        return None, f"{BIND}={setting}"
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


# ----------------------------------------------------------------------------------------------
# MLSL_TF_INTER_OP_THREADS, MLSL_TF_THREAD_SPINNING: TensorFlow's pools
#
# The inter-op thread pool sized for several ranks per machine.
#
# TensorFlow gives every process one inter-op thread per core of the machine; with several ranks
# on a machine those pools oversubscribe the cores many times over. One thread is too few: the
# executor runs one chain of ops inline and queues every side branch (in backprop, each weight's
# gradient) behind it, so no gradient is reduced before the whole backward pass has run. init()
# therefore sets 2 inter-op threads per rank (intra-op parallelism inside kernels is left alone)
# unless the user chose already. The collective kernels themselves run inline on the thread that
# produced their input (ops/tf/kernels.cc), so a reduction starts as soon as its gradient exists.
#
# init() also stops TensorFlow's pools from spinning (MLSL_TF_THREAD_SPINNING=0, the default).
# A pool thread that runs out of work keeps a core busy for a while in case more arrives; in a
# process with a background thread that must answer MPI within microseconds, and on a machine
# shared by several ranks, that core is the one the background thread or another rank needed.
# Measured on 2 ranks sharing 2 cores (benchmarks/allreduce.py, fresh inputs): a 4 KiB allreduce
# chain took 80-145 us per collective with spinning and 21-23 us without; ResNet-50 compute alone
# was unchanged and the overlapped training step 7% faster.

INTER_OP_THREADS = "MLSL_TF_INTER_OP_THREADS"
SPINNING = "MLSL_TF_THREAD_SPINNING"


def inter_op_threads(spec):
    """The inter-op pool size for setting value `spec` ('auto', 'tf' or a number), or None to
    leave TensorFlow's default."""
    spec = (spec or "auto").strip().lower()
    if spec == "tf":
        return None
    if spec == "auto":
        return 2
    try:
        n = int(spec)
    except ValueError:
        raise ValueError(f"{INTER_OP_THREADS}={spec!r}: expected 'auto', 'tf' or a positive number of threads") from None
    if n < 1:
        raise ValueError(f"{INTER_OP_THREADS}={spec!r}: expected 'auto', 'tf' or a positive number of threads")
    return n


def spinning(spec):
    """Whether TensorFlow's pools may spin, for setting value `spec` ('1'/'0', on/off, ...)."""
    return _lib().yes_no(SPINNING, spec or "0", yes="TensorFlow's spinning pools", no="pools that sleep")


def configure_threads():
    """Applies the thread settings before TensorFlow starts its runtime. Returns the inter-op
    pool size set, or None when it left that alone (user's choice, 'tf', or a runtime already
    running)."""
    configure_spinning()
    n = inter_op_threads(_lib().settings()[INTER_OP_THREADS][2])
    if n is None or os.environ.get("TF_NUM_INTEROP_THREADS"):
        return None
    import tensorflow as tf
    if tf.config.threading.get_inter_op_parallelism_threads() != 0:
        return None  # set by the user
    try:
        tf.config.threading.set_inter_op_parallelism_threads(n)
    except RuntimeError:
        return None  # TensorFlow already ran an op: its pools exist and cannot be resized
    return n


def configure_spinning():
    """Turns spinning off in the eager context's configuration (from which TensorFlow builds its
    inter-op and intra-op pools) unless MLSL_TF_THREAD_SPINNING=1. Returns True when it did,
    False when spinning stays (the setting, or a runtime whose pools already exist)."""
    if spinning(_lib().settings()[SPINNING][2]):
        return False
    from tensorflow.python.eager import context  # TensorFlow has no public switch for this field
    ctx = context.context()
    if getattr(ctx, "_context_handle", None) is not None or not hasattr(ctx, "_config"):
        return False  # the pools exist (or an unknown TensorFlow): they keep their behaviour
    from tensorflow.core.protobuf import config_pb2
    config = config_pb2.ConfigProto()
    if ctx._config is not None:
        config.CopyFrom(ctx._config)
    config.experimental.disable_thread_spinning = True
    ctx._config = config
    return True
