"""CPU seconds of a process's threads (by thread name, or by a label given to the threads a
library started) and of the kernel's softirq work (machine-wide, from /proc), so the benchmarks
can say what moving gradients costs in CPU.

What each measure captures (Linux, tick-based accounting unless CONFIG_IRQ_TIME_ACCOUNTING):
  thread utime + stime  everything the thread ran, its syscalls included (a send's copy into the
                        socket, TCP's transmit path, and any softirq -- e.g. veth delivery and the
                        peer's receive path -- that ran on top of the thread)
  ksoftirqd/N           softirq work deferred to the kernel's per-CPU threads: not in any of our
                        threads, so it adds to them
  /proc/stat softirq    all softirq time of the machine, whichever task it interrupted: it overlaps
                        the two above (softirq on top of our threads is in their stime too) and
                        includes other processes' network and timer work; reported, never summed
What none of them captures: hard-irq time (0 here: veth has no device interrupts) and work of
other processes of the machine that the job causes indirectly.
"""

import os

TICK = os.sysconf("SC_CLK_TCK")


def _stat_seconds(stat):
    """(name, utime + stime seconds) of one /proc/.../stat line."""
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / TICK


def thread_times(pid="self"):
    """{tid: (name, CPU seconds so far)} of every thread of a process."""
    out = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                out[int(tid)] = _stat_seconds(f.read())
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return out


def thread_cpu(labels=None):
    """CPU seconds so far of this process's threads, summed by name, or by labels[tid] for the
    threads given one (so threads that share a name -- Horovod's background thread is called
    'python' like the main thread -- can be told apart)."""
    labels = labels or {}
    out = {}
    for tid, (name, seconds) in thread_times().items():
        key = labels.get(tid, name)
        out[key] = out.get(key, 0.0) + seconds
    return out


def label_new_threads(before, prefix):
    """{tid: prefix + name} of the threads of this process not in `before` (a thread_times())."""
    return {tid: prefix + name for tid, (name, _) in thread_times().items() if tid not in before}


def per_step(after, before, steps):
    """{key: (after - before) / steps} of two thread_cpu()-like dicts, keys that used none left out."""
    out = {k: round((v - before.get(k, 0.0)) / steps, 4) for k, v in sorted(after.items())}
    return {k: v for k, v in out.items() if v > 0}


def kernel_cpu():
    """Machine-wide kernel softirq CPU seconds so far: {'softirq_s': the softirq column of
    /proc/stat's cpu line, 'ksoftirqd_s': the ksoftirqd/N threads' CPU}."""
    with open("/proc/stat") as f:
        cpu = f.readline().split()  # cpu user nice system idle iowait irq softirq ...
    ksoftirqd = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, seconds = _stat_seconds(f.read())
        except (OSError, ValueError):
            continue
        if name.startswith("ksoftirqd/"):
            ksoftirqd += seconds
    return {"softirq_s": int(cpu[7]) / TICK, "ksoftirqd_s": ksoftirqd}


# The threads that do a library's communication, by impl: labels given at init time ('comm:'),
# or thread-name prefixes (TensorFlow's gRPC and collective threads for MWMS).
COMM_PREFIXES = {
    "mlsl_tf": ("comm:",),           # threads born in hvd.init(): mlsl_tf_comm
    "horovod": ("comm:",),           # threads born in hvd.init(): Horovod's background thread
    # MWMS: the ring's collective executor, gRPC's event engine and its other pools
    "mwms": ("collective_ops", "event_engine", "grpc", "default-execut", "resolver-execut"),
}


def comm_cpu(impl, cpu_by_name):
    """Sum of the communication threads' values in a {thread name or label: seconds} dict."""
    prefixes = COMM_PREFIXES.get(impl, ())
    return sum(v for k, v in cpu_by_name.items() if k.startswith(prefixes))


def machine(cpuinfo=None, environ=None):
    """Which machine a figure comes from: {'cpu': the model name, 'cores', 'avx512': whether the CPU
    has AVX-512 (TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX-512-class
    features; without them it runs Eigen's, several times slower on convolutions here),
    'tf_enable_onednn_opts': TF_ENABLE_ONEDNN_OPTS as set, or None (TensorFlow's default)}.
    cpuinfo: /proc/cpuinfo's text (read when None)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    env = os.environ if environ is None else environ
    return {"cpu": fields.get("model name", "unknown"), "cores": os.cpu_count(),
            "avx512": "avx512f" in fields.get("flags", "").split(),
            "tf_enable_onednn_opts": env.get("TF_ENABLE_ONEDNN_OPTS")}
