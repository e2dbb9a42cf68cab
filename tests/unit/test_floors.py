"""The Python package has floors, as the C++ core does: each module imports only modules on
lower floors (at the top of the file or inside a function alike), so it can be read bottom-up.
runner/ stands apart: it imports none of the package except, for --check-build, the loaded
library and the package's version, and mlsl_tf.cores (standard library only), the one parser of
MLSL_TF_COMM_CORE."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mlsl_tf"

# module -> floor; a module may import only modules of a lower floor
FLOORS = {
    "mlsl_tf._library": 0,      # the loaded .so, its C API, settings, stats, errors
    "mlsl_tf.compression": 0,   # casting compressors
    "mlsl_tf.timeline": 0,      # PNG of a trace file
    "mlsl_tf.simulate": 0,      # the N-node simulator's driver (runs build/mlsl_sim)
    "mlsl_tf.cores": 0,         # MLSL_TF_COMM_CORE: the background thread's core (runner/ uses it too)
    "mlsl_tf.affinity": 0,      # which cores a rank's threads run on
    "mlsl_tf.threads": 1,       # TensorFlow pool sizes
    "mlsl_tf.basics": 2,        # init, shutdown, rank/size, progress output
    "mlsl_tf.groups": 3,        # process sets
    "mlsl_tf.ops": 4,           # the collectives and their gradients
    "mlsl_tf.overlap": 5,       # cross-iteration overlap
    "mlsl_tf.keras2_compat": 5,  # Keras 2 (tf_keras): its DistributedOptimizer and optimizer helpers
    "mlsl_tf.keras3_compat": 4,  # Keras 3: the optimizer helpers callbacks and elastic state use
    "mlsl_tf.keras_flavour": 6,  # which of the two compat modules an object needs
    "mlsl_tf.parallel": 5,      # model-parallel ops
    "mlsl_tf.functions": 5,     # broadcast_variables, *_object
    "mlsl_tf.optimizer": 6,     # DistributedOptimizer
    "mlsl_tf.optimizer_v1": 7,  # DistributedOptimizer over TensorFlow 1 optimizers
    "mlsl_tf.tape": 7,          # DistributedGradientTape
    "mlsl_tf.elastic": 7,       # elastic state objects on a fixed job
    "mlsl_tf.optimizers": 8,    # DistributedOptimizer for any optimizer (picks the wrapper)
    "mlsl_tf.keras.layers": 8,
    "mlsl_tf.keras.callbacks": 8,
    "mlsl_tf.keras.sync_batch_norm": 8,
    "mlsl_tf.keras.elastic": 8,
    "mlsl_tf.keras": 9,
    "mlsl_tf": 10,              # the package: lazy exports of everything
}
RUNNER_MAY_IMPORT = {"mlsl_tf._library", "mlsl_tf", "mlsl_tf.cores"}


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path):
    """Every mlsl_tf module a file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mlsl_tf")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlsl_tf"):
            for a in node.names:  # "from mlsl_tf import ops" imports the module mlsl_tf.ops
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in FLOORS or sub.startswith("mlsl_tf.runner") else node.module)
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


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = PACKAGE / "basics.py"
    text = bad.read_text() + "\n\ndef _late():\n    from mlsl_tf.keras import callbacks\n"
    copy = tmp_path / "basics.py"
    copy.write_text(text)
    assert "mlsl_tf.keras.callbacks" in imported_modules(copy)
