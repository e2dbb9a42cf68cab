"""The README's quick starts run as written: the python blocks under "Quick start: Keras" and
"Quick start: TensorFlow" are executed on every rank, and what they promise holds -- every rank
ends with the same weights, the averaged loss is the same everywhere, the collectives give their
documented results."""

import os
import re

import numpy as np
import tensorflow as tf

import mlsl_tf as hvd

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_blocks(section):
    """The ```python blocks of one '## ' section of the README, in order."""
    text = open(README).read()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no section '## {section}'"
    blocks = re.findall(r"```python\n(.*?)```", match.group(1), re.S)
    assert blocks, f"README.md's section '{section}' has no python block"
    return blocks


def same_on_every_rank(values, name):
    """Each rank's arrays gathered and compared with rank 0's, bit for bit."""
    gathered = hvd.allgather_object([np.asarray(v) for v in values], name=name)
    for rank, theirs in enumerate(gathered):
        for mine, other in zip(gathered[0], theirs):
            np.testing.assert_array_equal(mine, other, err_msg=f"rank {rank} differs from rank 0")


def test_keras_quick_start():
    (block,) = python_blocks("Quick start: Keras")
    scope = {}
    exec(compile(block, "README.md (Keras quick start)", "exec"), scope)
    model = scope["model"]
    weights = model.get_weights()
    assert all(np.all(np.isfinite(w)) for w in weights)
    same_on_every_rank(weights, "readme.keras.weights")
    assert np.isfinite(model.history.history["loss"][-1])


def test_tensorflow_quick_start_and_collectives():
    quick_start, collectives = python_blocks("Quick start: TensorFlow")
    scope = {}
    exec(compile(quick_start, "README.md (TensorFlow quick start)", "exec"), scope)
    same_on_every_rank([v.numpy() for v in scope["model"].trainable_variables], "readme.tf.weights")
    averaged = float(hvd.allreduce(scope["loss"], name="readme.tf.loss"))
    same_on_every_rank([np.float64(averaged)], "readme.tf.averaged_loss")

    n, r = hvd.size(), hvd.rank()
    scope["x"] = tf.fill([4], float(r + 1))
    exec(compile(collectives, "README.md (collectives)", "exec"), scope)
    np.testing.assert_array_equal(scope["total"].numpy(), np.full(4, n * (n + 1) / 2))
    assert scope["rows"].shape == (n * (n + 1) // 2, 3)
    same_on_every_rank([scope["w"].numpy()], "readme.tf.broadcast")
    # every rank sent tf.range(2n) in slices of 2: rank r receives slice r from each of the n ranks
    np.testing.assert_array_equal(scope["out"].numpy(), np.tile([2 * r, 2 * r + 1], n))
    np.testing.assert_array_equal(scope["received_splits"].numpy(), [2] * n)
    np.testing.assert_array_equal(scope["part"].numpy(), np.full((2, 3), float(n)))
