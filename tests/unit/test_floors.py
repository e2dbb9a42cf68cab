"""The Python package has floors, as the C++ core does: each module imports only modules on
lower floors, so it can be read bottom-up. An import counts wherever it is: at the top of the
file, inside a function, relative (`from . import x`), or a module reached by name through
sys.modules, importlib.import_module or __import__. Imports of the package's modules belong at
the top of the file: one inside a function needs its reason in LAZY_IMPORTS.
runner/ stands apart: it imports none of the package except, for --check-build, the loaded
library and the package's version, and mlsl_tf.cpu_placement (standard library only when
imported), the one parser of MLSL_TF_COMM_CORE.  runner/'s own modules have floors too
(RUNNER_FLOORS), with the same rule."""

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
    "mlsl_tf.optimizer.keras2": 6,    # DistributedOptimizer over Keras 2 (tf_keras) optimizers (overlap too)
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
    "mlsl_tf.runner.job_verdicts": 1,  # what the status files say: who failed first, who left early
    "mlsl_tf.runner.rank_env": 1,     # the ranks' environment
    "mlsl_tf.runner.ssh": 1,          # ssh options and the check's verdicts
    "mlsl_tf.runner.child": 1,        # the rank's command as a child process (rank wrapper)
    "mlsl_tf.runner.elastic_hosts": 2,  # elastic: discovery output, blacklist, each generation's hosts
    "mlsl_tf.runner.argv": 2,         # mlslrun's command line
    "mlsl_tf.runner.launchers": 2,    # per-MPI launcher argv
    "mlsl_tf.runner.ssh_check": 2,    # the ssh pre-flight check
    "mlsl_tf.runner.installed": 3,    # the MPI launcher found, --check-build's report
    "mlsl_tf.runner.elastic_driver": 3,  # elastic mlslrun: generations of workers, the driver's server
    "mlsl_tf.runner.launch": 4,       # mlslrun: runs the job
    "mlsl_tf.runner.task": 3,         # the rank wrapper: puts its floor-0/1 modules together
    "mlsl_tf.runner.__main__": 5,     # python -m mlsl_tf.runner
}


# Imports inside a function, of a module of the package: each needs a reason to be lazy (the
# floor rule applies to them as to every import). (importer, imported) -> why.
LAZY_IMPORTS = {
    ("mlsl_tf.cpu_placement", "mlsl_tf._library"):
        "mlslrun's rank wrapper imports cpu_placement for MLSL_TF_COMM_CORE and loads nothing else of the "
        "package (tests/unit/test_mlslrun.py, TASK_MODULES); only the functions init() calls need the settings",
    ("mlsl_tf.runner.installed", "mlsl_tf._library"):
        "--check-build only: mlslrun loads the compiled library only when asked to check it",
    ("mlsl_tf.runner.installed", "mlsl_tf"):
        "--check-build only: the package's version when it is not installed as a distribution",
}


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _known(name):
    return name in FLOORS or name in RUNNER_FLOORS


def _names_a_module_reached_by_name(node):
    """The mlsl_tf module a `sys.modules[...]`, `sys.modules.get(...)`, `importlib.import_module(...)`
    (or `import_module(...)`) or `__import__(...)` expression reaches, or None."""
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
    elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) and \
            node.func.id in ("import_module", "__import__"):
        arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("mlsl_tf"):
        return arg.value
    return None


def _modules_of(node, package):
    """The mlsl_tf modules one node imports or reaches by name; `package` is the package the file
    belongs to (its relative imports start there)."""
    reached = _names_a_module_reached_by_name(node)
    if reached:
        return {reached}
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name.startswith("mlsl_tf")}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:  # from . import x, from ..ops import y
        parts = package.split(".")
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    if not base.startswith("mlsl_tf"):
        return set()
    out = set()
    for a in node.names:  # "from mlsl_tf import ops" imports the module mlsl_tf.ops
        sub = f"{base}.{a.name}"
        out.add(sub if _known(sub) else base)
    return out


def _package_of(path, module):
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imported_modules(path, module=None):
    """Every mlsl_tf module a file imports, anywhere in it (inside functions too), or reaches by
    name through sys.modules or importlib. `module`: the file's module name (default: from its
    path in the package)."""
    module = module or module_name(path)
    package = _package_of(path, module)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        out |= _modules_of(node, package)
    return out


def lazily_imported_modules(path, module=None):
    """The mlsl_tf modules a file imports (or reaches by name) inside a function."""
    module = module or module_name(path)
    package = _package_of(path, module)
    out = set()
    for function in ast.walk(ast.parse(path.read_text())):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(function):
                out |= _modules_of(node, package)
    return out


def upward_imports(path, module=None, floors=None):
    """'me (floor a) imports other (floor b)' for each import of a module on the file's floor or
    above (modules without a floor in `floors` are not compared)."""
    module = module or module_name(path)
    floors = FLOORS if floors is None else floors
    return [f"{module} (floor {floors[module]}) imports {other} (floor {floors[other]})"
            for other in sorted(imported_modules(path, module))
            if other != module and other in floors and floors[other] >= floors[module]]


def unlisted_lazy_imports(path, module=None):
    """'me imports other inside a function' for each lazy import LAZY_IMPORTS does not list."""
    module = module or module_name(path)
    return [f"{module} imports {other} inside a function" for other in sorted(lazily_imported_modules(path, module))
            if other != module and (module, other) not in LAZY_IMPORTS]


def files():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_has_a_floor():
    missing = [module_name(p) for p in files()
               if not module_name(p).startswith("mlsl_tf.runner") and module_name(p) not in FLOORS]
    assert missing == [], f"give these modules a floor in FLOORS: {missing}"


def test_imports_go_only_downward():
    upward = []
    for path in files():
        if not module_name(path).startswith("mlsl_tf.runner"):
            upward += upward_imports(path)
    assert upward == []


def test_imports_inside_functions_only_where_listed():
    lazy = [v for path in files() for v in unlisted_lazy_imports(path)]
    assert lazy == [], ("import these at the top of the file, or list why they must wait in LAZY_IMPORTS: "
                        f"{lazy}")
    found = {(module_name(p), other) for p in files() for other in lazily_imported_modules(p)}
    assert set(LAZY_IMPORTS) <= found, f"LAZY_IMPORTS lists imports no longer made: {set(LAZY_IMPORTS) - found}"


def test_runner_stands_apart():
    for path in (PACKAGE / "runner").glob("*.py"):
        outside = {m for m in imported_modules(path) if not m.startswith("mlsl_tf.runner")}
        assert outside <= RUNNER_MAY_IMPORT, f"{path.name} imports {outside - RUNNER_MAY_IMPORT}"


def test_runner_imports_go_only_downward():
    missing = [module_name(p) for p in (PACKAGE / "runner").glob("*.py") if module_name(p) not in RUNNER_FLOORS]
    assert missing == [], f"give these modules a floor in RUNNER_FLOORS: {missing}"
    upward = [v for path in (PACKAGE / "runner").glob("*.py") for v in upward_imports(path, floors=RUNNER_FLOORS)]
    assert upward == []


def _planted(tmp_path, code, name="basics.py"):
    """A copy of the package's `name` with `code` appended, outside the package."""
    copy = tmp_path / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text((PACKAGE / name).read_text() + "\n\n" + code + "\n")
    return copy


def test_the_checker_sees_an_upward_import(tmp_path):
    copy = _planted(tmp_path, "def _late():\n    from mlsl_tf.keras import callbacks\n")
    assert "mlsl_tf.keras.callbacks" in imported_modules(copy, "mlsl_tf.basics")
    assert upward_imports(copy, "mlsl_tf.basics") == \
        [f"mlsl_tf.basics (floor {FLOORS['mlsl_tf.basics']}) imports mlsl_tf.keras.callbacks "
         f"(floor {FLOORS['mlsl_tf.keras.callbacks']})"]
    for reach in ('sys.modules.get("mlsl_tf.overlap")', 'sys.modules["mlsl_tf.groups"]',
                  'importlib.import_module("mlsl_tf.optimizer.dispatch")', '__import__("mlsl_tf.ops")',
                  'import_module("mlsl_tf.tape")'):
        copy = _planted(tmp_path, f"def _late():\n    return {reach}\n")
        reached = reach.split('"')[1]
        assert reached in imported_modules(copy, "mlsl_tf.basics"), reach
        assert any(f"imports {reached} " in v for v in upward_imports(copy, "mlsl_tf.basics")), reach


def test_the_checker_sees_a_relative_import(tmp_path):
    copy = _planted(tmp_path, "from . import overlap\nfrom .optimizer import keras3\n")
    assert {"mlsl_tf.overlap", "mlsl_tf.optimizer.keras3"} <= imported_modules(copy, "mlsl_tf.basics")
    copy = _planted(tmp_path, "from .. import tape\nfrom ..keras import callbacks\n", name="optimizer/reduce.py")
    assert {"mlsl_tf.tape", "mlsl_tf.keras.callbacks"} <= imported_modules(copy, "mlsl_tf.optimizer.reduce")
    assert len(upward_imports(copy, "mlsl_tf.optimizer.reduce")) == 2


def test_the_checker_sees_an_unlisted_lazy_import(tmp_path):
    assert unlisted_lazy_imports(PACKAGE / "basics.py") == []
    # downward, but inside a function and not in LAZY_IMPORTS: refused all the same
    for code in ("def _late():\n    from mlsl_tf import _library\n",
                 "def _late():\n    import mlsl_tf.elastic_link\n",
                 "class _C:\n    def m(self):\n        return sys.modules['mlsl_tf._library']\n",
                 "async def _late():\n    from . import compression\n",
                 "_f = lambda: importlib.import_module('mlsl_tf._library')\n"):
        copy = _planted(tmp_path, code)
        assert unlisted_lazy_imports(copy, "mlsl_tf.basics"), code
    # the same import at the top of the file is an ordinary (downward) one
    copy = _planted(tmp_path, "from mlsl_tf import _library as _again\n")
    assert unlisted_lazy_imports(copy, "mlsl_tf.basics") == [] and upward_imports(copy, "mlsl_tf.basics") == []
    # a listed one passes, and only for its importer
    copy = _planted(tmp_path, "def _late():\n    from mlsl_tf import _library\n", name="cpu_placement.py")
    assert unlisted_lazy_imports(copy, "mlsl_tf.cpu_placement") == []
    assert unlisted_lazy_imports(copy, "mlsl_tf.compression") == ["mlsl_tf.compression imports mlsl_tf._library "
                                                                  "inside a function"]
