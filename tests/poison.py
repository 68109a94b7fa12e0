"""A task whose train data holds NaN in chosen batches: drives the non-finite policies."""

import gin
import numpy as np
import tensorflow as tf

from executor.tasks.spirals import SpiralsClassifier


@gin.configurable
class PoisonedSpirals(SpiralsClassifier):
  """Spirals whose train batches number `poisoned_batches` (0-based) are all NaN."""

  def __init__(self, poisoned_batches=(), **kwargs):
    super().__init__(**kwargs)
    self.poisoned_batches = tuple(poisoned_batches)

  def dataset(self, split, input_context):
    ds = super().dataset(split, input_context)
    if split != "train" or not self.poisoned_batches:
      return ds
    poisoned = tf.constant(self.poisoned_batches, tf.int64)

    def poison(index, batch):
      bad = tf.reduce_any(tf.equal(index, poisoned))
      x = tf.where(bad, tf.fill(tf.shape(batch["x"]), np.float32("nan")), batch["x"])
      return {"x": x, "y": batch["y"]}

    return ds.enumerate().map(poison)

  def compute_loss(self, batch, training):
    loss, metrics, per_example = super().compute_loss(batch, training)
    # A NaN input reaches the loss whatever the kernels do with it: a fused
    # MatMul+BiasAdd+Relu (grappler's remapper) may turn NaN into 0.
    poison = 0.0 * tf.reduce_sum(batch["x"])
    return loss + poison, {**metrics, "loss": (metrics["loss"][0] + poison, metrics["loss"][1])}, per_example
