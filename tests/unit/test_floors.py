"""The Python package has floors, as the C++ core does: each module imports only modules on
lower floors (at the top of the file or inside a function alike), so it can be read bottom-up.
runner/ stands apart: it imports none of the package except, for --check-build, the loaded
library and the package's version, and mlsl_tf.cpu_placement (standard library only when imported), the one parser of
MLSL_TF_COMM_CORE.  runner/'s own modules have floors too (RUNNER_FLOORS), with the same rule."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mlsl_tf"

# module -> floor; a module may import only modules of a lower floor
FLOORS = {
    "mlsl_tf._library": 0,      # the loaded .so, its C API, settings, stats, errors
    "mlsl_tf.compression": 0,   # casting compressors
    "mlsl_tf.timeline": 0,      # PNG of a trace file
    "mlsl_tf.simulate": 0,      # the N-node simulator's driver (runs build/mlsl_sim)
    "mlsl_tf.elastic_link": 0,  # a worker's connection to elastic mlslrun
    "mlsl_tf.cpu_placement": 1,  # where threads run: comm core (runner/ uses it too), binding, TF pools
    "mlsl_tf.basics": 2,        # init, shutdown, rank/size, progress output
    "mlsl_tf.groups": 3,        # process sets
    "mlsl_tf.ops": 4,           # the collectives and their gradients
    "mlsl_tf.overlap": 5,       # cross-iteration overlap
    "mlsl_tf.keras2_compat": 4,  # Keras 2 (tf_keras): its private members, the optimizer helpers and hooks
    "mlsl_tf.keras3_compat": 4,  # Keras 3: its private members, the optimizer helpers and hooks
    "mlsl_tf.keras_flavour": 6,  # which of the two compat modules an object needs
    "mlsl_tf.parallel": 5,      # model-parallel ops
    "mlsl_tf.functions": 5,     # broadcast_variables, *_object
    "mlsl_tf.optimizer": 0,     # DistributedOptimizer's subpackage: a docstring, imports nothing
    "mlsl_tf.optimizer.reduce": 5,    # ReduceOptions: the reduction optimizers and tapes share
    "mlsl_tf.optimizer.keras2": 5,    # DistributedOptimizer over Keras 2 (tf_keras) optimizers
    "mlsl_tf.optimizer.keras3": 6,    # DistributedOptimizer over Keras 3 optimizers
    "mlsl_tf.optimizer.tf1": 6,       # DistributedOptimizer over TensorFlow 1 optimizers
    "mlsl_tf.optimizer.dispatch": 7,  # the public DistributedOptimizer: picks one of the three
    "mlsl_tf.tape": 7,          # DistributedGradientTape
    "mlsl_tf.elastic": 7,       # elastic state objects and run (resets under elastic mlslrun)
    "mlsl_tf.keras.layers": 8,
    "mlsl_tf.keras.callbacks": 8,
    "mlsl_tf.keras.sync_batch_norm": 8,
    "mlsl_tf.keras.elastic": 8,
    "mlsl_tf.keras": 9,
    "mlsl_tf": 10,              # the package: lazy exports of everything
}
RUNNER_MAY_IMPORT = {"mlsl_tf._library", "mlsl_tf", "mlsl_tf.cpu_placement"}
# runner/ has floors of its own, with the same rule
RUNNER_FLOORS = {
    "mlsl_tf.runner": 0,              # the package: a docstring, imports nothing
    "mlsl_tf.runner.config": 0,       # RunConfig, UsageError
    "mlsl_tf.runner.placement": 0,    # the rank's number, local rank and CPUs (rank wrapper)
    "mlsl_tf.runner.rank_status": 0,  # start marker, status and failure files (rank wrapper, mlslrun)
    "mlsl_tf.runner.output": 0,       # the rank's output copies and tags (rank wrapper)
    "mlsl_tf.runner.pmi_relay": 0,    # the PMI connection through the rank wrapper
    "mlsl_tf.runner.worker_env": 0,   # HOROVOD_RANK, HOROVOD_HOSTNAME, ... of a worker (rank wrapper)
    "mlsl_tf.runner.guard": 0,        # the launcher under a subreaper that leaves no process behind
    "mlsl_tf.runner.hosts": 1,        # -H, hostfiles
    "mlsl_tf.runner.rank_env": 1,     # the ranks' environment
    "mlsl_tf.runner.ssh": 1,          # ssh options and the check's verdicts
    "mlsl_tf.runner.child": 1,        # the rank's command as a child process (rank wrapper)
    "mlsl_tf.runner.elastic_hosts": 2,  # elastic: discovery output, blacklist, each generation's hosts
    "mlsl_tf.runner.argv": 2,         # mlslrun's command line
    "mlsl_tf.runner.launchers": 2,    # per-MPI launcher argv
    "mlsl_tf.runner.ssh_check": 2,    # the ssh pre-flight check
    "mlsl_tf.runner.elastic_driver": 3,  # elastic mlslrun: generations of workers, the driver's server
    "mlsl_tf.runner.launch": 4,       # mlslrun: runs the job
    "mlsl_tf.runner.task": 3,         # the rank wrapper: puts its floor-0/1 modules together
    "mlsl_tf.runner.__main__": 5,     # python -m mlsl_tf.runner
}


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _names_a_module_reached_by_name(node):
    """The mlsl_tf module a `sys.modules[...]`, `sys.modules.get(...)` or
    `importlib.import_module(...)` expression reaches, or None."""
    def is_sys_modules(n):
        return isinstance(n, ast.Attribute) and n.attr == "modules" and isinstance(n.value, ast.Name) \
            and n.value.id == "sys"
    arg = None
    if isinstance(node, ast.Subscript) and is_sys_modules(node.value):
        arg = node.slice
    elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) and (
            (node.func.attr in ("get", "pop") and is_sys_modules(node.func.value))
            or node.func.attr == "import_module"):
        arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("mlsl_tf"):
        return arg.value
    return None


def imported_modules(path):
    """Every mlsl_tf module a file imports, anywhere in it (inside functions too), or reaches by
    name through sys.modules or importlib."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        reached = _names_a_module_reached_by_name(node)
        if reached:
            out.add(reached)
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mlsl_tf")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlsl_tf"):
            for a in node.names:  # "from mlsl_tf import ops" imports the module mlsl_tf.ops
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in FLOORS or sub in RUNNER_FLOORS else node.module)
    return out


def files():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_has_a_floor():
    missing = [module_name(p) for p in files()
               if not module_name(p).startswith("mlsl_tf.runner") and module_name(p) not in FLOORS]
    assert missing == [], f"give these modules a floor in FLOORS: {missing}"


def test_imports_go_only_downward():
    upward = []
    for path in files():
        me = module_name(path)
        if me.startswith("mlsl_tf.runner"):
            continue
        for other in imported_modules(path):
            if other != me and FLOORS[other] >= FLOORS[me]:
                upward.append(f"{me} (floor {FLOORS[me]}) imports {other} (floor {FLOORS[other]})")
    assert upward == []


def test_runner_stands_apart():
    for path in (PACKAGE / "runner").glob("*.py"):
        outside = {m for m in imported_modules(path) if not m.startswith("mlsl_tf.runner")}
        assert outside <= RUNNER_MAY_IMPORT, f"{path.name} imports {outside - RUNNER_MAY_IMPORT}"


def test_runner_imports_go_only_downward():
    missing = [module_name(p) for p in (PACKAGE / "runner").glob("*.py") if module_name(p) not in RUNNER_FLOORS]
    assert missing == [], f"give these modules a floor in RUNNER_FLOORS: {missing}"
    upward = []
    for path in (PACKAGE / "runner").glob("*.py"):
        me = module_name(path)
        for other in imported_modules(path):
            if other in RUNNER_FLOORS and other != me and RUNNER_FLOORS[other] >= RUNNER_FLOORS[me]:
                upward.append(f"{me} (floor {RUNNER_FLOORS[me]}) imports {other} (floor {RUNNER_FLOORS[other]})")
    assert upward == []


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = PACKAGE / "basics.py"
    text = bad.read_text() + "\n\ndef _late():\n    from mlsl_tf.keras import callbacks\n"
    copy = tmp_path / "basics.py"
    copy.write_text(text)
    assert "mlsl_tf.keras.callbacks" in imported_modules(copy)
    for reach in ('sys.modules.get("mlsl_tf.overlap")', 'sys.modules["mlsl_tf.groups"]',
                  'importlib.import_module("mlsl_tf.optimizer.dispatch")'):
        copy.write_text(bad.read_text() + f"\n\ndef _late():\n    return {reach}\n")
        assert reach.split('"')[1] in imported_modules(copy), reach
