"""mlslrun --comm-core: task.py keeps the command's threads off the communication core(s),
while mlsl_tf's background thread still pins itself there."""

import os
import subprocess
import sys

import pytest

from mlsl_tf import cpu_placement
from mlsl_tf.runner import placement, task

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ALLOWED = set(os.sched_getaffinity(0))


def test_parse_core_list():
    assert cpu_placement.parse_comm_cores("3") == [3]
    assert cpu_placement.parse_comm_cores("2,3") == [2, 3]
    assert cpu_placement.parse_comm_cores(" 2, 3 ") == [2, 3]
    assert cpu_placement.parse_comm_cores("") == [] and cpu_placement.parse_comm_cores("  ") == []
    with pytest.raises(ValueError, match="'x' is not a core number"):
        cpu_placement.parse_comm_cores("2,x")
    with pytest.raises(ValueError, match="MLSL_TF_COMM_CORE='1,,2'"):
        cpu_placement.parse_comm_cores("1,,2")
    for bad in ("1,", "-1", "+3", "3.0", "\u00b2", "\u0663"):  # not ASCII digits: "²", Arabic "3"
        with pytest.raises(ValueError, match="is not a core number"):
            cpu_placement.parse_comm_cores(bad)


def test_comm_core_for_follows_local_rank_mod_n():
    assert [cpu_placement.comm_core_for([2, 3], r) for r in range(4)] == [2, 3, 2, 3]
    assert cpu_placement.comm_core_for([5], 7) == 5
    assert cpu_placement.comm_core_for([], 0) is None


def test_mlslrun_and_the_rank_wrapper_use_the_one_parser():
    from mlsl_tf.runner import rank_env
    flag = next(f for f in rank_env.ENV_FLAGS if f.env_var == cpu_placement.COMM_CORE)
    assert flag.convert(" 2, 3") == "2,3"
    for bad in ("1,,2", "", "x"):
        with pytest.raises(ValueError):
            flag.convert(bad)
    assert placement.COMM_CORE_ENV == cpu_placement.COMM_CORE


def test_find_local_rank():
    assert placement.find_local_rank({"MPI_LOCALRANKID": "1"}) == 1
    assert placement.find_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2
    assert placement.find_local_rank({"SLURM_LOCALID": "3"}) == 3
    assert placement.find_local_rank({"PMI_RANK": "4"}) is None
    with pytest.raises(ValueError, match="MPI_LOCALRANKID='a'"):
        placement.find_local_rank({"MPI_LOCALRANKID": "a"})


def test_worker_cpus_leaves_out_every_listed_core_it_can():
    assert placement.worker_cpus({0, 1, 2, 3}, [3], 3) == ({0, 1, 2}, None)
    assert placement.worker_cpus({0, 1, 2, 3}, [2, 3], 2) == ({0, 1}, None)
    # every allowed core is some rank's comm core: leave out only this rank's
    assert placement.worker_cpus({0, 1}, [0, 1], 1) == ({0}, None)


def test_worker_cpus_never_leaves_the_command_without_a_core():
    cpus, why = placement.worker_cpus({1}, [1], 1)
    assert cpus is None and "only core 1 is available" in why
    cpus, why = placement.worker_cpus({0, 1}, [5], 5)
    assert cpus is None and "comm core 5 is not among this rank's cores 0,1" in why


def test_affinity_plan():
    assert placement.affinity_plan({}, {0, 1}) == (None, None)
    assert placement.affinity_plan({"MLSL_TF_COMM_CORE": "1", "MPI_LOCALRANKID": "0"}, {0, 1, 2}) == ({0, 2}, None)
    assert placement.affinity_plan({"MLSL_TF_COMM_CORE": "1,2", "MPI_LOCALRANKID": "1"}, {0, 1, 2}) == ({0}, None)
    cpus, why = placement.affinity_plan({"MLSL_TF_COMM_CORE": "1"}, {0, 1})
    assert cpus is None and "MPI_LOCALRANKID" in why
    cpus, why = placement.affinity_plan({"MLSL_TF_COMM_CORE": "one", "MPI_LOCALRANKID": "0"}, {0, 1})
    assert cpus is None and "'one' is not a core number" in why


def run_task(env_extra, code):
    env = {k: v for k, v in os.environ.items() if k not in placement.RANK_ENV_VARS + placement.LOCAL_RANK_ENV_VARS}
    env.update({"PMI_RANK": "0"}, **env_extra)
    return subprocess.run([sys.executable, task.__file__, "--", sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


PRINT_AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


def test_task_sets_the_command_affinity():
    comm = max(ALLOWED)
    r = run_task({"MLSL_TF_COMM_CORE": str(comm), "MPI_LOCALRANKID": "0"}, PRINT_AFFINITY)
    assert r.returncode == 0, r.stderr
    if len(ALLOWED) == 1:  # nothing to spare: warned about and left as it was
        assert r.stdout.strip() == str(sorted(ALLOWED)) and "only core" in r.stderr
    else:
        assert r.stdout.strip() == str(sorted(ALLOWED - {comm})) and r.stderr == ""


def test_task_without_comm_core_leaves_affinity():
    r = run_task({}, PRINT_AFFINITY)
    assert r.returncode == 0 and r.stdout.strip() == str(sorted(ALLOWED)) and r.stderr == ""


def test_task_warns_about_an_unusable_core():
    r = run_task({"MLSL_TF_COMM_CORE": str(max(ALLOWED) + 1000), "MPI_LOCALRANKID": "0"}, PRINT_AFFINITY)
    assert r.returncode == 0 and r.stdout.strip() == str(sorted(ALLOWED))
    assert "is not among this rank's cores" in r.stderr


# Under mlslrun: the main thread avoids the comm core, the background thread runs on it.
THREAD_AFFINITIES = """
import os, sys, time
sys.path.insert(0, {root!r})
import mlsl_tf as hvd
hvd.init()
def masks():
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{{tid}}/status") as f:
            out += [l.split(":")[1].strip() for l in f if l.startswith("Cpus_allowed_list")]
    return out
# the background thread pins itself when it starts running, which init() does not wait for
deadline = time.time() + 10
while {comm!r} not in masks() and time.time() < deadline:
    time.sleep(0.01)
print("main", sorted(os.sched_getaffinity(0)))
print("threads", sorted(set(masks())))
hvd.shutdown()
"""


@pytest.mark.timeout(240)
def test_mlslrun_comm_core_end_to_end():
    if not os.path.exists(os.path.join(ROOT, "mlsl_tf", "_mlsl_tf.so")):
        pytest.fail("the ops library is not built (make lib)")
    comm = max(ALLOWED)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-m", "mlsl_tf.runner", "-np", "1", "--no-tag-output", "--comm-core", str(comm),
                        sys.executable, "-c", THREAD_AFFINITIES.format(root=ROOT, comm=str(comm))],
                       env=env, capture_output=True, text=True, timeout=220, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("main ", "threads ")))
    if len(ALLOWED) == 1:
        assert lines["main"] == str(sorted(ALLOWED)) and "only core" in r.stderr
        return
    assert lines["main"] == str(sorted(ALLOWED - {comm}))
    assert repr(str(comm)) in lines["threads"], r.stdout  # the background thread, pinned


def test_the_librarys_table_documents_what_the_one_parser_allows():
    """The library's table keeps MLSL_TF_COMM_CORE for mlsl_tf.settings() and the README, but
    only mlsl_tf/cpu_placement.py parses it: the words the table shows must be the parser's."""
    from mlsl_tf import _library
    setting = _library.settings()[cpu_placement.COMM_CORE]
    assert setting.allowed == cpu_placement.COMM_CORE_ALLOWED
    assert cpu_placement.parse_comm_cores(setting.default) == []


BAD_COMM_CORE = """
import sys
import mlsl_tf as hvd
try:
    hvd.init()
except RuntimeError as e:
    sys.stdout.write("INIT-ERROR " + str(e).replace(chr(10), " ") + chr(10))  # one write per rank
    sys.stdout.flush()
    sys.exit(0)  # not an error exit: mpiexec would stop the other rank before it reports
print("NO-ERROR", flush=True)
"""


@pytest.mark.timeout(240)
def test_a_bad_comm_core_is_an_init_error_on_every_rank():
    """Python is the one parser, and init() refuses a bad value before the library starts MPI:
    every rank fails, naming the variable, the value and what is allowed."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLSL_TF_")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", MLSL_TF_COMM_CORE="1,one")
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", BAD_COMM_CORE], env=env, capture_output=True,
                       text=True, timeout=220, stdin=subprocess.DEVNULL)
    lines = [line for line in r.stdout.splitlines() if "ERROR" in line]
    expected = f"INIT-ERROR mlsl_tf.init() failed: MLSL_TF_COMM_CORE=1,one is not valid: expected {cpu_placement.COMM_CORE_ALLOWED}"
    assert lines == [expected, expected], r.stdout + r.stderr
