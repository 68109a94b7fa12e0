"""Small tasks for tests: exact expectations can be computed by hand."""

import keras
import numpy as np
import tensorflow as tf

from programs.core.task import Task


class CountingRegression(Task):
  """Linear regression with a counter the tail op increments, and uneven test batches."""

  splits = ("train", "test")

  def __init__(self, **kwargs):
    kwargs.setdefault("global_batch_size", 8)
    super().__init__(optimizer_fn=lambda: keras.optimizers.SGD(0.05), **kwargs)

  def build(self):
    self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="linear")], name="reg")
    self.tail_calls = tf.Variable(0, dtype=tf.int64, trainable=False)
    super().build()

  def _data(self, split):
    rng = np.random.default_rng(0 if split == "train" else 1)
    x = rng.normal(size=(100 if split == "train" else 37, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
    return x, y

  def dataset(self, split, input_context):
    x, y = self._data(split)
    ds = tf.data.Dataset.from_tensor_slices({"x": x, "y": y, "id": np.arange(len(x))})
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    batch = input_context.get_per_replica_batch_size(self.global_batch_size)
    if split == "train":
      return ds.repeat().batch(batch, drop_remainder=True)
    return ds.batch(batch)

  def compute_loss(self, batch, training):
    err = self.model(batch["x"], training=training) - batch["y"]
    per_example = tf.reduce_mean(tf.square(err), axis=-1)
    n = tf.cast(tf.shape(err)[0], tf.float32)
    loss = tf.reduce_mean(per_example)
    return loss, {"mse": (loss, n), "abs": (tf.reduce_mean(tf.abs(err)), n)}, {"id": batch["id"]}

  def decode_step(self, batch):
    return {"id": batch["id"], "prediction": self.model(batch["x"])[:, 0]}

  def post_training_loop(self):
    super().post_training_loop()
    self.tail_calls.assign_add(1)
