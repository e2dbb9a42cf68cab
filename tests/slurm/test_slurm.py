"""mlsl_tf under a real SLURM on emulated hosts (make test-slurm; root only).

Debian's slurmctld, slurmd and munged run a cluster of two nodes, h0 and h1 (cluster.py: the
network namespaces of the ssh tests, 2 CPUs per node).  From h0, as a user would: the batch
scripts of docs/slurm.md (mlslrun, and srun --mpi=pmi2 alone) train the digits example on 2
nodes x 1 and 2 x 2 tasks; salloc + mlslrun does too; a srun step without PMI is refused with
the reason; scancel ends every rank within seconds; a node whose slurmd is killed mid-job fails
the job, naming the node, and the ranks it leaves there end when its slurmd is back.

Where the cluster cannot be built (not root, no namespaces, the packages missing) the tests
fail with the reason; they never skip.
"""

import os
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as emulated  # noqa: E402

DOCS = os.path.join(emulated.ROOT, "docs", "slurm.md")
# As in the ssh tests: MPICH over libfabric's TCP on eth0 (the hosts share one kernel; left to
# itself MPICH would move the ranks' data through shared memory).  sbatch, salloc and srun pass
# the submitting shell's environment to the job, so these reach every rank.
TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}
# The digits CNN's gradients over 12 x 22 steps: over 30 MB cross h1's link (see tests/ssh).
MIN_LINK_BYTES = 10 * 2**20
JOB_TIMEOUT_S = 240  # a digits job on a loaded 2-core machine takes 30-60 s
RUNNING_TIMEOUT_S = 120  # until every rank of allreduce_loop.py has started (TensorFlow's import)
GONE_WITHIN_S = 10  # scancel: every rank's process gone within this
# slurmd killed: slurmctld sets the node DOWN SLURMD_TIMEOUT_S after its last answer (it pings
# every few seconds), then kills the job; KillWait and slack on a loaded machine on top.
NODE_FAIL_WITHIN_S = 4 * emulated.SLURMD_TIMEOUT_S + emulated.KILL_WAIT_S + 30
LOOP = "tests/slurm/allreduce_loop.py"


@pytest.fixture(scope="module")
def slurm():
    with emulated.SlurmCluster(count=2) as c:
        yield c


def job_env():
    env = dict(os.environ, **TCP)
    env.update(PYTHONPATH=emulated.ROOT, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # python, mlslrun
    return env


def batch_scripts():
    """The batch scripts of docs/slurm.md, in order: (mlslrun's, srun's)."""
    with open(DOCS) as f:
        scripts = re.findall(r"```bash\n(#!/bin/bash\n.*?)```", f.read(), re.S)
    assert len(scripts) == 2, f"{DOCS}: expected two batch scripts, found {len(scripts)}"
    assert "mlslrun" in scripts[0] and "srun --mpi=pmi2" in scripts[1], scripts
    return scripts


def write_script(c, name, text):
    path = c.path("jobs", name)
    with open(path, "w") as f:
        f.write(text)
    return path


def show(title, text):
    print(f"\n===== {title} =====\n{text}", flush=True)


def sbatch(c, script, *options):
    """Submits ``script`` from h0; (job id, its output file)."""
    output = c.path("jobs", f"{os.path.basename(script)}-{time.monotonic_ns()}.out")
    code, out, err, _ = c.run(["sbatch", "--parsable", f"--output={output}", *options, script],
                              env=job_env(), timeout=30)
    assert code == 0, out + err
    return out.strip().split(";")[0], output


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_for_text(path, text, timeout):
    deadline = time.monotonic() + timeout
    while text not in read(path):
        assert time.monotonic() < deadline, f"no {text!r} in {path} after {timeout} s:\n{read(path)[-3000:]}"
        time.sleep(0.2)


def launched_on(c, job_id):
    """The hosts whose slurmd launched tasks of the job's first step (from their logs)."""
    return [emulated.host_name(i) for i in range(c.count)
            if f"launch task StepId={job_id}.0 request" in read(c.path(f"slurmd.{emulated.host_name(i)}.log"))]


def accuracy(text, ranks):
    m = re.search(rf"test accuracy ([0-9.]+) on (\d+) images \({ranks} ranks", text)
    assert m, text[-3000:]
    return float(m.group(1)), int(m.group(2))


def run_batch_job(c, script, *options):
    job_id, output = sbatch(c, script, *options)
    fields = c.wait_job_end(job_id, JOB_TIMEOUT_S)
    text = read(output)
    show(f"job {job_id} ({' '.join(options)}): {fields['JobState']}, exit {fields['ExitCode']}", text)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", text[-3000:]
    return job_id, fields, text


def test_sbatch_mlslrun_two_nodes_one_task_each(slurm):
    rx_before = slurm.rx_bytes(1)
    script = write_script(slurm, "digits.sbatch", batch_scripts()[0])
    job_id, fields, text = run_batch_job(slurm, script)
    assert fields["NodeList"] == "h[0-1]" and fields["NumTasks"] == "2"
    assert launched_on(slurm, job_id) == ["h0", "h1"]
    acc, images = accuracy(text, 2)
    assert acc >= 0.9 and images == 450
    received = slurm.rx_bytes(1) - rx_before
    print(f"h1's eth0 received {received / 2**20:.1f} MiB during the job", flush=True)
    assert received > MIN_LINK_BYTES, received


def test_sbatch_srun_pmi2_without_mlslrun(slurm):
    script = write_script(slurm, "digits-srun.sbatch", batch_scripts()[1])
    job_id, fields, text = run_batch_job(slurm, script, "--nodes=2", "--ntasks-per-node=1")
    assert fields["NodeList"] == "h[0-1]" and fields["NumTasks"] == "2"
    assert launched_on(slurm, job_id) == ["h0", "h1"]
    acc, images = accuracy(text, 2)
    assert acc >= 0.9 and images == 450
    assert "[0]<stdout>" not in text  # no mlslrun here


def test_salloc_mlslrun_two_nodes_two_tasks_each(slurm):
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=2", "mlslrun", "--verbose", "-np", "4",
            "python", "examples/keras_digits.py"]
    code, out, err, seconds = slurm.run(argv, env=job_env(), timeout=JOB_TIMEOUT_S)
    show(f"{' '.join(argv)}: exit code {code}, {seconds:.0f} s", out + err)
    assert code == 0, out[-3000:] + err[-3000:]
    job_id = re.search(r"Granted job allocation (\d+)", err).group(1)
    assert re.search(r"^mlslrun: slurm launcher: \S*srun --ntasks=4 --kill-on-bad-exit=1 --mpi=pmi2 ", out, re.M), out
    assert slurm.job(job_id)["NumTasks"] == "4"  # 2 CPUs per node: two tasks on each
    assert launched_on(slurm, job_id) == ["h0", "h1"]
    acc, images = accuracy(out, 4)
    assert acc >= 0.9 and images == 450


def test_srun_without_pmi_is_refused_with_the_reason(slurm):
    """--mpi=none: every rank would be a world of one; mlslrun's rank wrapper says so, starts nothing."""
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", "mlslrun", "--mpi-args=--mpi=none", "-np", "2",
            "python", LOOP]
    code, out, err, seconds = slurm.run(argv, env=job_env(), timeout=60)
    show(f"{' '.join(argv)}: exit code {code}, {seconds:.0f} s", out + err)
    assert code != 0
    # The first rank to refuse ends the step (--kill-on-bad-exit), often before the other has said so.
    refused = re.findall(r"^mlslrun task: rank (\d) \(host (h\d)\): srun started this task with no PMI", err, re.M)
    assert refused and all(host == f"h{rank}" for rank, host in refused), err
    assert "instead of as one of 2 ranks" in err and "srun --mpi=pmi2" in err
    assert "the ranks are running" not in out


def test_scancel_ends_every_rank_within_seconds(slurm):
    script = write_script(slurm, "loop.sbatch", batch_scripts()[0].replace("examples/keras_digits.py", LOOP))
    job_id, output = sbatch(slurm, script)
    wait_for_text(output, "step 20:", RUNNING_TIMEOUT_S)
    for i in range(2):
        assert slurm.processes_with(i, LOOP), f"no rank on {emulated.host_name(i)}"
    code, out, err, _ = slurm.run(["scancel", job_id], timeout=30)
    assert code == 0, out + err
    start = time.monotonic()
    left = {}
    while time.monotonic() - start < GONE_WITHIN_S:
        left = {i: slurm.processes_with(i, LOOP) for i in range(2)}
        if not any(left.values()):
            break
        time.sleep(0.1)
    gone_s = time.monotonic() - start
    fields = slurm.wait_job_end(job_id, 30)
    show(f"scancel {job_id}: ranks gone after {gone_s:.1f} s, job {fields['JobState']}", read(output))
    assert not any(left.values()), f"still running {GONE_WITHIN_S} s after scancel: {left}"
    assert fields["JobState"] == "CANCELLED"
    assert f"JOB {job_id} ON h0 CANCELLED AT" in read(output)


def test_node_whose_slurmd_dies_fails_the_job_naming_it(slurm):
    """slurmd on h1 killed mid-job: its tasks live on, but slurmctld sets h1 DOWN when it stops
    answering and ends the job (NODE_FAIL; no requeue); srun names h1.  The ranks left on h1
    end as soon as its slurmd is back (SLURM kills the steps of jobs that are over)."""
    script = write_script(slurm, "loop.sbatch", batch_scripts()[0].replace("examples/keras_digits.py", LOOP))
    job_id, output = sbatch(slurm, script, "--no-requeue")
    try:
        wait_for_text(output, "step 20:", RUNNING_TIMEOUT_S)
        slurm.kill_slurmd(1)
        killed = time.monotonic()
        fields = slurm.wait_job_end(job_id, NODE_FAIL_WITHIN_S)
        ended_s = time.monotonic() - killed
        text = read(output)
        show(f"slurmd of h1 killed: job {job_id} {fields['JobState']} ({fields['Reason']}) "
             f"{ended_s:.0f} s later", text)
        assert fields["JobState"] == "NODE_FAIL" and fields["Reason"] == "NodeDown", fields
        assert "srun: error: Node failure on h1" in text, text[-3000:]
        assert f"JOB {job_id} ON h0 CANCELLED AT" in text and "DUE TO NODE FAILURE" in text
        assert "step 40:" in text  # the job ran on after slurmd died...
        assert slurm.node_states().get("h1", "").startswith("down")
        assert "Killing JobId=%s on failed node h1" % job_id in read(slurm.path("slurmctld.log"))
        wait_gone(slurm, 0, 10)  # ...and its ranks on h0 ended with it
        print(f"left on h1 while its slurmd is down: {slurm.processes_with(1, LOOP)}", flush=True)
    finally:
        if slurm.slurmd[1].poll() is not None:
            slurm.start_slurmd(1)  # h1 idle again
    wait_gone(slurm, 1, 15)  # the orphans on h1


def wait_gone(c, i, timeout):
    deadline = time.monotonic() + timeout
    while c.processes_with(i, LOOP):
        assert time.monotonic() < deadline, f"ranks left on {emulated.host_name(i)}: {c.processes_with(i, LOOP)}"
        time.sleep(0.2)
