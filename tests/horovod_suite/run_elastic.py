"""Runs Horovod 0.28.1's elastic integration tests (test/integration/test_elastic_tensorflow2.py and
test_elastic_tensorflow_keras.py, with their data/ scripts) against elastic mlslrun, and prints one
JSON line per file and flavour with the per-test outcomes.

    python tests/horovod_suite/run_elastic.py /path/to/horovod/test [--files a,b]

Each file runs as one pytest process (the tests launch their jobs themselves, through horovodrun's
parse_args / _run_elastic, which alias/horovod/runner/launch.py maps to mlslrun), in a copy of the
test folder.  Flavours:
  (none)   the data scripts as Horovod ships them, under Keras 2 (TF_USE_LEGACY_KERAS=1): Horovod
           0.28.1 ran them on TensorFlow 2.15, whose tf.keras was Keras 2;
  +keras3  the data scripts ported to Keras 3 (PORTS: TF1's ConfigProto session set-up dropped,
           `optimizer.lr` spelled `learning_rate`), under TensorFlow 2.21's Keras 3;
  +keras2_ported  the same ported scripts under Keras 2 (tf_keras): the Keras elastic callbacks
           and KerasState on the Keras that Horovod's script was written for.
Explained failures (EXPLAINED) are reported as such, not as passes."""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
FILES = ("test_elastic_tensorflow2.py", "test_elastic_tensorflow2.py+keras3",
         "test_elastic_tensorflow_keras.py", "test_elastic_tensorflow_keras.py+keras3",
         "test_elastic_tensorflow_keras.py+keras2_ported")
# flavour -> (environment, whether the data scripts are ported)
FLAVOURS = {"": ({"TF_USE_LEGACY_KERAS": "1"}, False), "keras3": ({}, True),
            "keras2_ported": ({"TF_USE_LEGACY_KERAS": "1"}, True)}
# data script -> (pattern, replacement) applied for the keras3 flavour
PORTS = {
    "elastic_tensorflow2_main.py": [(r"optimizer\.lr\.assign\(", "optimizer.learning_rate.assign(")],
    "elastic_tensorflow_keras_main.py": [
        (r"config = tf\.ConfigProto\(\)\n", ""),
        (r"config\.gpu_options\.[^\n]*\n", ""),
        (r"tf\.keras\.backend\.set_session\([^\n]*\n", ""),
        (r"tf\.keras\.backend\.set_value\(model\.optimizer\.lr, ([^\n]*)\)\n",
         r"model.optimizer.learning_rate.assign(\1)\n"),
    ],
}
# (file, flavour, test or None for every test) -> why it fails here, explained
_RESURRECT = ("a timing assumption: the test needs the blacklisted host (cooldown 1-2 s) to stay out for the two "
              "epochs after the reset (about 0.3 s each for Horovod, whose survivors go on in-process with their "
              "step function traced). mlslrun restarts the workers and counts the cooldown from when training "
              "goes on, but the new generation's first epoch traces the step function again in fresh processes "
              "(about a second on 2 cores), so the host is back within epoch 1 (logged at size 4, epochs 3-4 at "
              "size 2 after the second failure). The back-off itself (doubling per failure) is tested in "
              "tests/unit/test_elastic_hosts.py; the Keras file's port passes this test")
EXPLAINED = {
    ("test_elastic_tensorflow_keras.py", "", None): "the data script calls tf.ConfigProto, which TensorFlow 2 "
    "no longer has: every worker fails at its start (Horovod 0.28.1 on TF 2.15: the same 5 failures)",
    ("test_elastic_tensorflow2.py", "", "test_resurrecting_blacklisted_hosts_exponential_backoff"): _RESURRECT,
    ("test_elastic_tensorflow2.py", "keras3", "test_resurrecting_blacklisted_hosts_exponential_backoff"): _RESURRECT,
    ("test_elastic_tensorflow_keras.py", "keras3", "test_resurrecting_blacklisted_hosts_exponential_backoff"):
    _RESURRECT,
    ("test_elastic_tensorflow_keras.py", "keras2_ported", "test_resurrecting_blacklisted_hosts_exponential_backoff"):
    _RESURRECT,
}


def port(integration: pathlib.Path) -> None:
    for name, rules in PORTS.items():
        path = integration / "data" / name
        text = path.read_text()
        for pattern, replacement in rules:
            text, count = re.subn(pattern, replacement, text)
            if count == 0:
                raise SystemExit(f"{name}: the port's pattern {pattern!r} matches nothing: not Horovod 0.28.1's script?")
        path.write_text(text)


def outcomes_of(junit: pathlib.Path) -> dict:
    import xml.etree.ElementTree as ET
    out = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        if case.find("failure") is not None or case.find("error") is not None:
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            out[name] = ("failed", (node.get("message") or "")[:300])
        elif case.find("skipped") is not None:
            out[name] = ("skipped", (case.find("skipped").get("message") or "")[:200])
        else:
            out[name] = ("passed", "")
    return out


def run_file(test_dir: pathlib.Path, entry: str, out_dir: pathlib.Path, timeout: float, extra):
    test_file, _, flavour = entry.partition("+")
    work = pathlib.Path(tempfile.mkdtemp(prefix="hvd-elastic-"))
    try:
        shutil.copytree(test_dir / "integration", work / "integration")
        shutil.copytree(test_dir / "utils", work / "utils")
        shutil.copy(test_dir / "conftest.py", work / "conftest.py")
        env_extra, ported = FLAVOURS[flavour]
        if ported:
            port(work / "integration")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "alias"), str(work / "utils"), env.get("PYTHONPATH", "")])
        env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(env_extra)
        tag = f".{flavour}" if flavour else ""
        junit = out_dir / f"{pathlib.Path(test_file).stem}{tag}.xml"
        log = out_dir / f"{pathlib.Path(test_file).stem}{tag}.log"
        start = time.time()
        with open(log, "w") as f:
            try:
                proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                                       f"--junitxml={junit}", f"integration/{test_file}", *extra],
                                      cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
                hung = False
            except subprocess.TimeoutExpired:
                hung = True
        outcomes = outcomes_of(junit)
        for m, (o, msg) in list(outcomes.items()):
            why = EXPLAINED.get((test_file, flavour, m)) or EXPLAINED.get((test_file, flavour, None))
            if o == "failed" and why:
                outcomes[m] = ("explained", f"{why} ({msg})")
        return outcomes, time.time() - start, hung
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("test_dir", type=pathlib.Path, help="Horovod 0.28.1's test/ folder")
    p.add_argument("--files", default=",".join(FILES))
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", type=pathlib.Path, default=HERE.parents[1] / "build" / "horovod_suite")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    test_dir = args.test_dir.resolve()
    if not (test_dir / "integration" / "test_elastic_tensorflow2.py").exists():
        p.error(f"{test_dir} is not Horovod's test/ folder (no integration/test_elastic_tensorflow2.py)")
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for entry in args.files.split(","):
        outcomes, seconds, hung = run_file(test_dir, entry, args.out.resolve(), args.timeout, argv[cut + 1:])
        counts = {k: sum(1 for o, _ in outcomes.values() if o == k) for k in ("passed", "failed", "explained", "skipped")}
        print(json.dumps({"library": "mlsl_tf", "file": entry, **counts, "hung": hung,
                          "seconds": round(seconds, 1)}), flush=True)
        for m, (o, msg) in outcomes.items():
            if o != "passed":
                print(f"  {o:9s} {m}: {msg}", flush=True)
        ok &= not hung and counts["failed"] == 0 and bool(outcomes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
