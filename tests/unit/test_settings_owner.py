"""Each setting of the library's table (ops/core/settings.cc) is parsed in one place (issue #34):
the library reads, checks and interprets the environment for the core; Python names a setting of
the table only where the list below says why that is no second parser -- mlslrun sets a variable
from its own flag, or Python gives meaning to a value the library's table checked (or, for
MLSL_TF_COMM_CORE, Python is the only parser: the table keeps its entry, type kPython, for the
default, doc and allowed words the docs show, and the library never parses it).  Defaults Python
shows or models must be the table's."""

import ast
import os
import pathlib
import subprocess
import sys

from mlsl_tf import _library
from mlsl_tf.runner import rank_env
from mlsl_tf.runner.argv import parse_args

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mlsl_tf"

_SETS = "mlslrun sets it from its flag and never reads it; the value it writes is one the table allows"
_MEANS = ("Python gives it its meaning (the core has no use for it) from the value _library.settings() "
          "gets with the table, which init() checked first")
# (file under mlsl_tf/, setting) -> why that file may name a setting of the library's table.
PYTHON_NAMES = {
    ("cpu_placement.py", "MLSL_TF_COMM_CORE"): "its one parser: mlslrun's rank wrapper needs it before the library "
                                       "loads, and init() hands the library a core number; the library's "
                                       "table keeps the entry (kPython) only for the docs and defaults",
    ("cpu_placement.py", "MLSL_TF_BIND"): _MEANS,
    ("cpu_placement.py", "MLSL_TF_INTER_OP_THREADS"): _MEANS,
    ("cpu_placement.py", "MLSL_TF_THREAD_SPINNING"): _MEANS,
    ("overlap.py", "MLSL_TF_CROSS_ITERATION"): _MEANS,
    ("groups.py", "MLSL_TF_DYNAMIC_PROCESS_SETS"): _MEANS,
    ("runner/rank_env.py", "MLSL_TF_FUSION_THRESHOLD"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_CHUNK_BYTES"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_INFLIGHT"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_PRIORITY"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_COMM_CORE"): _SETS + " (through mlsl_tf/cpu_placement.py)",
    ("runner/rank_env.py", "MLSL_TF_BIND"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_TIMELINE"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_START_TIMEOUT"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_AUTOTUNE"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_AUTOTUNE_LOG"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_AUTOTUNE_WARMUP_SAMPLES"): _SETS,
    ("runner/rank_env.py", "MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE"): _SETS,
}


def library_table():
    """{name: (default, Horovod alias)} of every setting the built library declares."""
    lib = _library.c_api()
    return {lib.mlsl_tf_setting_name(i).decode(): (lib.mlsl_tf_setting_default(i).decode(),
                                                    lib.mlsl_tf_setting_alias(i).decode())
            for i in range(lib.mlsl_tf_setting_count())}


def named_settings(names):
    """{(file under mlsl_tf/, name): line} of every string in the package's code that is exactly
    one of ``names`` (a docstring that mentions one is longer than the name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.setdefault((path.relative_to(PACKAGE).as_posix(), node.value), node.lineno)
    return found


def test_python_names_a_setting_of_the_library_only_where_listed():
    table = library_table()
    names = set(table) | {alias for _, alias in table.values() if alias}
    found = named_settings(names)
    unexplained = [f"mlsl_tf/{f}:{line}: {name}" for (f, name), line in sorted(found.items())
                   if (f, name) not in PYTHON_NAMES]
    assert not unexplained, ("Python names settings of the library's table (ops/core/settings.cc), a second "
                             "parser of the environment: read them through mlsl_tf._library.settings() "
                             "(or list why not in PYTHON_NAMES):\n" + "\n".join(unexplained))
    stale = sorted(set(PYTHON_NAMES) - set(found))
    assert not stale, f"PYTHON_NAMES lists what the code no longer names: {stale}"


def test_mlslrun_flag_defaults_are_the_librarys():
    table = library_table()
    for flag in rank_env.ENV_FLAGS:
        default, _ = table[flag.env_var]
        if flag.default is None:
            assert default == "", f"{flag.option}: the library's default is {default!r}; --help must show it"
        else:
            assert flag.convert(flag.default) == default, (flag.option, flag.default, default)
            assert f"(default: {flag.default})" in flag.help_text


def test_the_simulators_defaults_are_the_librarys():
    from mlsl_tf import simulate
    table = library_table()
    for key, name in (("chunk_bytes", "MLSL_TF_CHUNK_BYTES"), ("inflight", "MLSL_TF_INFLIGHT"),
                      ("fusion_threshold", "MLSL_TF_FUSION_THRESHOLD")):
        assert str(simulate.DEFAULTS[key]) == table[name][0], (key, name)


def test_values_mlslrun_writes_pass_the_librarys_check(tmp_path):
    """Every variable mlslrun's flags set, with values a user may give (fractions of a MB or of a
    second included), is accepted by init(), which refuses any value its table does not allow."""
    cfg = parse_args(["-np", "1", "--fusion-threshold-mb", "2.5", "--chunk-mb", "0.75", "--inflight", "8",
                      "--priority", "fifo", "--comm-core", "0", "--bind", "none",
                      "--timeline-filename", str(tmp_path / "t.json"), "--start-timeout", "2.5",
                      "--autotune", "--autotune-log-file", str(tmp_path / "autotune.csv"),
                      "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "2", "python"])
    written = dict(rank_env.resolve_env(cfg, {}))
    assert set(written) == {f.env_var for f in rank_env.ENV_FLAGS} | {rank_env.START_TIMEOUT_ENV}
    assert written[rank_env.START_TIMEOUT_ENV] == "3"  # whole seconds, rounded up
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "HOROVOD_", "PMI_"))}
    env.update(written, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", "import mlsl_tf as hvd\nhvd.init()\nprint('INIT OK', flush=True)\n"
                        "hvd.shutdown()"], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0 and "INIT OK" in r.stdout, r.stdout + r.stderr
