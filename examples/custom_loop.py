"""A custom TF2 training loop with mlsl_tf.DistributedGradientTape: the digits CNN of
keras_digits.py, trained with a tf.function step instead of model.fit.

    python -m mlsl_tf.runner -np 2 python examples/custom_loop.py
"""

import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mlsl_tf.keras as hvd

hvd.init()

digits = load_digits()
images = (digits.images / 16.0).astype("float32")[..., None]
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0,
                                                    stratify=digits.target)
x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
batch_size, epochs = 32, 12
# Every rank must run the same number of steps: drop the remainder of the smallest shard.
steps = min(hvd.allgather_object(len(x_train), name="custom_loop.shard_sizes")) // batch_size
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train.astype("int32"))).shuffle(
    len(x_train), seed=hvd.rank()).batch(batch_size, drop_remainder=True).take(steps)

keras.utils.set_random_seed(hvd.rank())
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
optimizer = keras.optimizers.Adam(0.002 * hvd.size())
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# Build the optimizer now so that its state exists, then start every rank from rank 0's values.
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)


@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = loss_fn(labels, logits)
    tape = hvd.DistributedGradientTape(tape)  # gradients come back averaged over ranks
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), labels), tf.float32))
    return loss, correct


start = time.perf_counter()
for epoch in range(epochs):
    totals = np.zeros(3)  # loss sum, correct, examples
    for images_batch, labels_batch in dataset:
        loss, correct = train_step(images_batch, labels_batch)
        totals += [float(loss) * len(labels_batch), float(correct), len(labels_batch)]
    totals = hvd.allreduce(totals, op=hvd.Sum, name="custom_loop.epoch_metrics").numpy()
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1:2d}/{epochs}: loss {totals[0] / totals[2]:.4f}  accuracy {totals[1] / totals[2]:.4f}",
              flush=True)
train_s = time.perf_counter() - start

shard = slice(hvd.rank(), None, hvd.size())
predictions = np.argmax(model.predict(x_test[shard], verbose=0), axis=1)
correct = hvd.allreduce(np.array([np.sum(predictions == y_test[shard]), len(predictions)], np.float64), op=hvd.Sum,
                        name="custom_loop.test_accuracy").numpy()
if hvd.rank() == 0:
    print(f"test accuracy {correct[0] / correct[1]:.4f} on {int(correct[1])} images "
          f"({hvd.size()} ranks, {train_s:.1f} s of training)")
