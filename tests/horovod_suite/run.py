"""Runs Horovod 0.28.1's own TensorFlow and Keras test files against mlsl_tf and prints pass /
fail / skip per file, counted per test method: a method passes when a mode (graph, eager) passed
and none failed, on every rank; it fails when it failed on any rank.

    python tests/horovod_suite/run.py /path/to/horovod/test [--np 2,3] [--files a.py,b.py] [-- pytest args]

The path is the `test/` folder of a checkout of horovod/horovod at tag v0.28.1 (the PyPI sdist
has no tests). Each file runs whole, as one `mlslrun -np N` job of pytest on every rank, with
alias/ on PYTHONPATH so `import horovod.tensorflow as hvd` imports mlsl_tf. With
--horovod-python (an interpreter whose venv has Horovod 0.28.1, e.g. on TF 2.15) the same files
also run against Horovod itself (mpiexec next to that interpreter, no alias, no skip list), for
its figures on the same machine and rank counts. skips.py lists the
tests that cannot apply here, with reasons. A job that outlives --timeout is killed and reported
as a hang, with the methods it never finished. Writes the per-method outcomes as JSON lines to
--out (default build/horovod_suite/)."""

import argparse
import collections
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Every TensorFlow file of Horovod's test/parallel/. A "+tf_keras" suffix runs the file again under
# Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1), with no skip list.
FILES = ("test_tensorflow.py", "test_tensorflow2_keras.py", "test_tensorflow2_keras.py+tf_keras",
         "test_tensorflow_process_sets.py", "test_tensorflow_process_sets_dynamic.py",
         "test_tensorflow2_keras_process_sets.py", "test_tensorflow2_keras_process_sets.py+tf_keras",
         "test_adasum_tensorflow.py", "test_xla.py",
         "test_xla_process_sets.py")
FLAVOURS = {"": {}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1", "HVD_SUITE_NO_SKIPS": "1"}}
NEEDS = ("parameterized", "mock", "cloudpickle", "packaging")  # what the suite imports besides TF


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from skips import DIFFERENT, HOROVOD_FAILS_TOO, NUMPY2, SKIPS  # noqa: E402


def method_outcomes(prefix, np_):
    """method -> (outcome, message) over all ranks; outcome 'unfinished' where some rank has none."""
    per_rank = []
    order = {"failed": 2, "passed": 1, "skipped": 0}
    for rank in range(np_):
        records = collections.defaultdict(list)
        path = pathlib.Path(f"{prefix}.rank{rank}.jsonl")
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            records[r["method"]].append(r)
        outcomes = {}
        for method, rs in records.items():
            # TF runs each method in graph and in eager mode, as unittest subtests reported one by
            # one; a mode that skips does not stop the method, which then reports "passed" as a
            # whole. So where there are modes, they decide: failed if one failed (or the method
            # did), passed if one passed, else skipped.
            modes = [r for r in rs if r.get("mode")]
            judged = modes + [r for r in rs if not r.get("mode") and r["outcome"] == "failed"] if modes else rs
            best = max(judged, key=lambda r: order[r["outcome"]])
            outcomes[method] = (best["outcome"], best["message"])
        per_rank.append(outcomes)
    methods = sorted(set().union(*per_rank))
    result = {}
    for m in methods:
        seen = [o.get(m) for o in per_rank]
        failed = [(rank, s[1]) for rank, s in enumerate(seen) if s and s[0] == "failed"]
        if failed:
            result[m] = ("failed", f"rank {failed[0][0]}: {failed[0][1]}")
        elif any(s is None for s in seen):
            result[m] = ("unfinished", "no outcome on rank(s) %s" % [r for r, s in enumerate(seen) if s is None])
        elif all(s[0] == "skipped" for s in seen):
            if "Not a test" in seen[0][1]:
                continue  # tf.test.TestCase.test_session: a helper pytest collects, not one of the suite's tests
            result[m] = ("skipped", seen[0][1])
        else:
            result[m] = ("passed", "")
    return result


def split_entry(entry):
    """'test_x.py+tf_keras' -> ('test_x.py', 'tf_keras'); 'test_x.py' -> ('test_x.py', '')."""
    test_file, _, flavour = entry.partition("+")
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r} in {entry!r}; known: {sorted(f for f in FLAVOURS if f)}")
    return test_file, flavour


def run_file(test_dir, entry, np_, out_dir, timeout, extra, horovod_python=None):
    test_file, flavour = split_entry(entry)
    tag = f".{flavour}" if flavour else ""
    prefix = out_dir / f"{pathlib.Path(test_file).stem}{tag}.np{np_}{'.horovod' if horovod_python else ''}"
    for old in out_dir.glob(f"{prefix.name}.rank*.jsonl"):
        old.unlink()
    env = dict(os.environ)
    paths = [str(test_dir / "utils"), str(HERE)] if horovod_python else [str(HERE / "alias"), str(test_dir / "utils"),
                                                                          str(HERE)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("HOROVOD_TEST_GPU", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(FLAVOURS[flavour])
    if horovod_python:
        env["HVD_SUITE_NO_SKIPS"] = "1"
        mpiexec = pathlib.Path(horovod_python).parent / "mpiexec"
        cmd = [str(mpiexec), "-n", str(np_), horovod_python, str(HERE / "rank_pytest.py"), test_file, str(prefix),
               *extra]
    else:
        cmd = [sys.executable, "-m", "mlsl_tf.runner", "-np", str(np_), sys.executable,
               str(HERE / "rank_pytest.py"), test_file, str(prefix), *extra]
    log = open(f"{prefix}.log", "w")
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=test_dir / "parallel", env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, 9)
        proc.wait()
    seconds = time.time() - start
    outcomes = method_outcomes(prefix, np_)
    for m, (outcome, message) in list(outcomes.items()):
        if outcome == "failed" and (test_file, m) in NUMPY2 and "np.float16(0.0) not less than 1e-08" in message:
            outcomes[m] = ("numpy2", f"{NUMPY2[(test_file, m)]} ({message})")
        elif outcome == "failed" and (test_file, m) in DIFFERENT and not horovod_python and not flavour:
            outcomes[m] = ("different", f"deliberate difference: {DIFFERENT[(test_file, m)]} ({message})")
        elif outcome == "failed" and (test_file, m, np_) in HOROVOD_FAILS_TOO and not horovod_python:
            outcomes[m] = ("horovod_fails_too", f"{HOROVOD_FAILS_TOO[(test_file, m, np_)]} ({message})")
    with open(f"{prefix}.jsonl", "w") as f:
        for m, (outcome, message) in outcomes.items():
            f.write(json.dumps({"file": entry, "np": np_, "method": m, "outcome": outcome,
                                "message": message}) + "\n")
    return outcomes, seconds, hung, proc.returncode


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("test_dir", type=pathlib.Path, help="Horovod 0.28.1's test/ folder")
    p.add_argument("--np", default="2,3", help="rank counts, comma-separated (default 2,3)")
    p.add_argument("--files", default=",".join(FILES))
    p.add_argument("--timeout", type=float, default=1800, help="seconds per file and rank count")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "horovod_suite")
    p.add_argument("--verbose", action="store_true", help="list every failed or unfinished method")
    p.add_argument("--horovod-python", help="also run the files against Horovod itself, with this interpreter")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: pytest's own arguments (-k ...)
    args = p.parse_args(argv[:cut])
    args.pytest_args = argv[cut + 1:]
    test_dir = args.test_dir.resolve()
    if not (test_dir / "parallel" / "test_tensorflow.py").exists():
        p.error(f"{test_dir} is not Horovod's test/ folder (no parallel/test_tensorflow.py)")
    missing = [m for m in NEEDS if not shutil.which(sys.executable) or
               subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True).returncode]
    if missing:
        p.error(f"the suite needs {', '.join(missing)}: pip install -r {HERE / 'requirements.txt'}")
    args.out = args.out.resolve()  # the ranks run in Horovod's test folder
    args.out.mkdir(parents=True, exist_ok=True)
    totals_ok = True
    libraries = [None] + ([args.horovod_python] if args.horovod_python else [])
    for np_, test_file, horovod_python in itertools.product([int(n) for n in args.np.split(",")],
                                                            args.files.split(","), libraries):
        outcomes, seconds, hung, rc = run_file(test_dir, test_file, np_, args.out, args.timeout, args.pytest_args,
                                               horovod_python)
        counts = collections.Counter(o for o, _ in outcomes.values())
        listed = 0 if horovod_python or "+" in test_file else sum(
            1 for (f, m) in SKIPS if f == test_file and outcomes.get(m, ("",))[0] == "skipped")
        line = {"library": "horovod" if horovod_python else "mlsl_tf", "file": test_file, "np": np_,
                "methods": len(outcomes), "passed": counts["passed"],
                "failed": counts["failed"], "different": counts["different"],
                "horovod_fails_too": counts["horovod_fails_too"], "numpy2": counts["numpy2"],
                "skipped": counts["skipped"],
                "skipped_by_list": listed, "unfinished": counts["unfinished"], "hung": hung,
                "seconds": round(seconds, 1)}
        print(json.dumps(line), flush=True)
        if not horovod_python:
            totals_ok &= not (hung or counts["failed"] or counts["unfinished"] or not outcomes)
        for m, (outcome, message) in outcomes.items():
            if outcome in ("failed", "unfinished", "different", "horovod_fails_too", "numpy2") and (args.verbose or counts[outcome] <= 40):
                print(f"  {outcome:10s} {m}: {message}", flush=True)
    return 0 if totals_ok else 1


if __name__ == "__main__":
    sys.exit(main())
