"""Several inputs and outputs (keras.io "the functional API" ticket classifier shape).

A ticket's title and body (token ids) and tags (a multi-hot vector) in; its priority (a score) and department
(one of four) out; a loss per output with `loss_weights`, metrics per output, sample weights from the data.
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from keras import layers

NUM_WORDS = 200
NUM_TAGS = 12
NUM_DEPARTMENTS = 4


def tickets(n, seed):
  """({title, body, tags}, {priority, department}, sample_weight) arrays, generated offline."""
  rng = np.random.default_rng(seed)
  title = rng.integers(1, NUM_WORDS, (n, 6)).astype("int32")
  body = rng.integers(1, NUM_WORDS, (n, 20)).astype("int32")
  tags = rng.integers(0, 2, (n, NUM_TAGS)).astype("float32")
  department = (title[:, 0] * NUM_DEPARTMENTS // NUM_WORDS + tags[:, 0].astype("int32")) % NUM_DEPARTMENTS
  priority = (body[:, :3].mean(1) / NUM_WORDS + tags[:, 1] * 0.3 + rng.normal(0, 0.1, n)) > 0.6
  weight = np.where(priority, 2.0, 1.0).astype("float32")  # Urgent tickets count double.
  x = {"title": title, "body": body, "tags": tags}
  y = {"priority": priority.astype("float32")[:, None], "department": np.eye(NUM_DEPARTMENTS)[department]}
  return x, y, weight


@gin.configurable
def ticket_data(split):
  x, y, weight = tickets(512 if split == "train" else 96, 0 if split == "train" else 1)
  return tf.data.Dataset.from_tensor_slices((x, y, weight))


@gin.configurable
def ticket_model():
  title_input = keras.Input(shape=(None,), dtype="int32", name="title")
  body_input = keras.Input(shape=(None,), dtype="int32", name="body")
  tags_input = keras.Input(shape=(NUM_TAGS,), name="tags")
  title_features = layers.GlobalAveragePooling1D()(layers.Embedding(NUM_WORDS, 16)(title_input))
  body_features = layers.GlobalAveragePooling1D()(layers.Embedding(NUM_WORDS, 8)(body_input))
  x = layers.concatenate([title_features, body_features, tags_input])
  priority_pred = layers.Dense(1, name="priority")(x)
  department_pred = layers.Dense(NUM_DEPARTMENTS, name="department")(x)
  model = keras.Model(
    inputs=[title_input, body_input, tags_input],
    outputs={"priority": priority_pred, "department": department_pred},
  )
  model.compile(
    optimizer=keras.optimizers.RMSprop(1e-2),
    loss={
      "priority": keras.losses.BinaryCrossentropy(from_logits=True),
      "department": keras.losses.CategoricalCrossentropy(from_logits=True),
    },
    loss_weights={"priority": 1.0, "department": 0.2},
    metrics={"priority": [keras.metrics.BinaryAccuracy(threshold=0.0)], "department": ["accuracy"]},
  )
  return model
