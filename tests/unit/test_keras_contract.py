"""The Keras contract: every private Keras member mlsl_tf relies on (the PRIVATE_MEMBERS tables of
mlsl_tf/keras3_compat.py and mlsl_tf/keras2_compat.py) exists in the installed Keras 3 and
tf_keras with the expected kind and signature, and no module other than those two touches a
private Keras member. A Keras upgrade that moves one fails here, naming the member and its user."""

import ast
import importlib
import inspect
import pathlib

import pytest

import keras
import tf_keras

from mlsl_tf import keras2_compat, keras3_compat

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mlsl_tf"
COMPAT_MODULES = {"keras2_compat.py", "keras3_compat.py"}
FLAVOURS = {"keras3_compat": (keras3_compat, "keras", keras.__version__),
            "keras2_compat": (keras2_compat, "tf_keras", tf_keras.__version__)}


def resolve(path):
    """The object at dotted `path` (a module, or attributes inside one); raises LookupError
    naming the part that is missing."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i in range(cut, len(parts)):
            if not hasattr(obj, parts[i]):
                raise LookupError(".".join(parts[:i + 1]))
            obj = getattr(obj, parts[i])
        return obj
    raise LookupError(parts[0])


def _built_keras3_optimizer(cls):
    opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    assert isinstance(opt, cls)
    opt.build([keras.Variable([1.0, 2.0])])
    return opt


def _built_keras3_batch_norm(cls):
    layer = cls()
    layer.build((None, 3))
    return layer


def _tf_keras_legacy_sgd(cls):
    return cls(learning_rate=0.1, momentum=0.9)


def _tf_keras_new_optimizer(cls):
    import tensorflow as tf
    opt = tf_keras.optimizers.SGD(learning_rate=0.1)
    assert isinstance(opt, cls)
    opt.build([tf.Variable([1.0, 2.0])])
    return opt


# an instance of each class whose instance attributes a table names
INSTANCES = {
    keras3_compat.BASE_OPTIMIZER: _built_keras3_optimizer,
    keras3_compat.BATCH_NORMALIZATION: _built_keras3_batch_norm,
    keras3_compat.TF_VARIABLE: lambda cls: keras.Variable(1.0),
    keras2_compat.LEGACY_SGD: _tf_keras_legacy_sgd,
    keras2_compat.NEW_OPTIMIZER: _tf_keras_new_optimizer,
}


def check_member(flavour, owner_path, member, kind, used_by):
    """'' when `owner_path`.`member` is what the compat module `flavour` expects (`kind`), else
    a message naming the member, what moved, and what uses it."""
    _, keras_name, version = FLAVOURS[flavour]
    where = f"{owner_path}.{member}"

    def problem(what):
        return f"{keras_name} {version}: {where} {what}; used by {flavour}.{used_by}"

    try:
        owner = resolve(owner_path)
    except LookupError as missing:
        return problem(f"missing ({missing} not found)")
    if kind == "attribute":
        factory = INSTANCES.get(owner_path)
        if factory is None:
            return problem("has no instance factory in INSTANCES (test table incomplete)")
        try:
            instance = factory(owner)
        except Exception as e:  # noqa: BLE001 - any failure to build the sample is the finding
            return problem(f"could not be checked: making an instance failed with {type(e).__name__}: {e}")
        return "" if hasattr(instance, member) else problem("missing (no such attribute on an instance)")
    if not hasattr(owner, member):
        return problem("missing")
    value = getattr(owner, member)
    if kind == "class":
        return "" if inspect.isclass(value) else problem(f"is a {type(value).__name__}, not a class")
    if kind == "function":
        return "" if callable(value) else problem(f"is a {type(value).__name__}, not a function")
    if not callable(value):
        return problem(f"is a {type(value).__name__}, not a method")
    try:
        params = list(inspect.signature(value).parameters)
    except (TypeError, ValueError):
        return problem("has no readable signature")
    params = params[1:] if params and params[0] == "self" else params
    expected = list(kind)
    if params[:len(expected)] != expected:
        return problem(f"signature changed: parameters {params}, expected to start with {expected}")
    return ""


ENTRIES = [(flavour, *entry) for flavour, (module, _, _) in FLAVOURS.items() for entry in module.PRIVATE_MEMBERS]


@pytest.mark.parametrize("flavour,owner,member,kind,used_by", ENTRIES,
                         ids=[f"{e[0]}:{e[1].rsplit('.', 1)[-1]}.{e[2]}" for e in ENTRIES])
def test_private_member_is_still_there(flavour, owner, member, kind, used_by):
    message = check_member(flavour, owner, member, kind, used_by)
    assert message == "", message


# ------------------------------------------------------------------------------------------------
# the checker itself fails when a member moves

def test_checker_names_a_method_that_went_missing(monkeypatch):
    from keras.src.optimizers import base_optimizer
    monkeypatch.delattr(base_optimizer.BaseOptimizer, "_get_variable_index")
    message = check_member("keras3_compat", keras3_compat.BASE_OPTIMIZER, "_get_variable_index", ("variable",),
                           "variable_index")
    assert message == (f"keras {keras.__version__}: keras.src.optimizers.base_optimizer.BaseOptimizer."
                       "_get_variable_index missing; used by keras3_compat.variable_index")


def test_checker_names_an_attribute_that_went_missing(monkeypatch):
    from keras.src.optimizers import base_optimizer
    original_build = base_optimizer.BaseOptimizer.build

    def build_without_it(self, variables):
        original_build(self, variables)
        del self.__dict__["_trainable_variables"]
    monkeypatch.setattr(base_optimizer.BaseOptimizer, "build", build_without_it)
    message = check_member("keras3_compat", keras3_compat.BASE_OPTIMIZER, "_trainable_variables", "attribute",
                           "trainable_variables")
    assert "BaseOptimizer._trainable_variables missing" in message
    assert message.endswith("used by keras3_compat.trainable_variables")


def test_checker_sees_a_changed_signature(monkeypatch):
    from tf_keras.src.optimizers.legacy import optimizer_v2

    def moved(self, loss, variables, tape=None):
        return []
    monkeypatch.setattr(optimizer_v2.OptimizerV2, "_compute_gradients", moved)
    message = check_member("keras2_compat", keras2_compat.OPTIMIZER_V2, "_compute_gradients",
                           ("loss", "var_list", "grad_loss", "tape"), "x")
    assert message.startswith(f"tf_keras {tf_keras.__version__}: {keras2_compat.OPTIMIZER_V2}._compute_gradients "
                              "signature changed")


def test_checker_names_a_module_that_moved(monkeypatch):
    message = check_member("keras3_compat", "keras.src.no_such_module.Thing", "_x", "attribute", "y")
    assert "missing (keras.src.no_such_module not found)" in message


def test_apply_hook_is_idempotent_and_reversible():
    from keras.src.optimizers import base_optimizer
    was_installed = keras3_compat.apply_hook_installed()
    original = base_optimizer.BaseOptimizer.apply
    seen = []
    try:
        keras3_compat.remove_apply_hook()
        plain = base_optimizer.BaseOptimizer.apply
        keras3_compat.install_apply_hook(lambda opt, g, v: seen.append(len(g)) or False)
        hooked = base_optimizer.BaseOptimizer.apply
        keras3_compat.install_apply_hook(lambda opt, g, v: True)  # a second install changes nothing
        assert base_optimizer.BaseOptimizer.apply is hooked is not plain
        var = keras.Variable([1.0])
        opt = keras.optimizers.SGD(learning_rate=0.5)
        opt.apply([keras.ops.convert_to_tensor([2.0])], [var])
        assert seen == [1] and float(var.numpy()[0]) == 0.0  # offered, declined, applied as usual
        keras3_compat.remove_apply_hook()
        assert base_optimizer.BaseOptimizer.apply is plain
    finally:
        base_optimizer.BaseOptimizer.apply = original  # as it was before this test
    assert keras3_compat.apply_hook_installed() == was_installed


# ------------------------------------------------------------------------------------------------
# nobody else touches Keras privates

def _keras_private_names():
    """Every underscore (non-dunder) member of the Keras 3 and tf_keras classes mlsl_tf works
    with (class attributes and a built instance's), and every member the tables name."""
    from tf_keras.src.optimizers.legacy import optimizer_v2
    classes = [keras.optimizers.Optimizer, keras.optimizers.SGD, keras.optimizers.LossScaleOptimizer, keras.Variable,
               keras.layers.Layer, keras.layers.Dense, keras.layers.BatchNormalization, keras.Model,
               keras.callbacks.Callback, optimizer_v2.OptimizerV2, tf_keras.optimizers.legacy.SGD,
               tf_keras.optimizers.Optimizer, tf_keras.layers.Layer, tf_keras.layers.BatchNormalization,
               tf_keras.Model, tf_keras.callbacks.Callback]
    instances = [_built_keras3_optimizer(keras.optimizers.Optimizer), keras.Variable([1.0]),
                 _built_keras3_batch_norm(keras.layers.BatchNormalization),
                 _tf_keras_legacy_sgd(tf_keras.optimizers.legacy.SGD),
                 _tf_keras_new_optimizer(tf_keras.optimizers.Optimizer)]
    names = set()
    for obj in classes + instances:
        names |= {n for n in dir(obj) if n.startswith("_")}
    names |= {entry[1] for module in (keras2_compat, keras3_compat) for entry in module.PRIVATE_MEMBERS}
    return {n for n in names if n.startswith("_") and not n.startswith("__") and not n.startswith("_mlsl")}


def private_keras_uses(path, names):
    """'line: what' for each place in the file at `path` that touches a private Keras member: an
    attribute of one of `names` (on any object, self included), a method of that name (an
    override), one named in a string (getattr/setattr), an import from keras.src or
    tf_keras.src, or an assignment to __class__ (a class swap)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr == "__class__" and isinstance(node.ctx, ast.Store):
            found.append(f"{node.lineno}: __class__ assignment")
        elif isinstance(node, ast.ClassDef):
            found += [f"{f.lineno}: def {node.name}.{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[:2] in (["keras", "src"],
                                                                                          ["tf_keras", "src"]):
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[:2] in (["keras", "src"], ["tf_keras", "src"])]
    return found


@pytest.fixture(scope="module")
def private_names():
    return _keras_private_names()


def test_only_the_compat_modules_touch_keras_privates(private_names):
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in COMPAT_MODULES and path.parent == PACKAGE:
            continue
        offenders += [f"{path.relative_to(PACKAGE.parent)}:{use}" for use in private_keras_uses(path, private_names)]
    assert offenders == [], ("private Keras members used outside mlsl_tf/keras3_compat.py and keras2_compat.py "
                             f"(move them behind a named function there): {offenders}")


def test_the_scan_sees_a_reintroduced_access(private_names, tmp_path):
    source = (PACKAGE / "overlap.py").read_text()
    assert private_keras_uses(PACKAGE / "overlap.py", private_names) == []
    reintroduced = {
        "attribute": "\n\ndef _late(opt):\n    return opt._iterations\n",
        "override": "\n\nclass _Mine:\n    def _moments(self, inputs, mask):\n        return inputs\n",
        "string": "\n\ndef _late(opt):\n    return getattr(opt, '_learning_rate')\n",
        "import": "\n\ndef _late():\n    from keras.src.optimizers import base_optimizer\n",
        "class swap": "\n\ndef _late(v, cls):\n    v.__class__ = cls\n",
    }
    for what, code in reintroduced.items():
        copy = tmp_path / "overlap.py"
        copy.write_text(source + code)
        assert private_keras_uses(copy, private_names) != [], what
