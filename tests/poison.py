"""A task whose train data holds NaN in chosen batches: drives the non-finite policies."""

import gin
import numpy as np
import tensorflow as tf

from executor.tasks.spirals import SpiralsClassifier


@gin.configurable
class PoisonedSpirals(SpiralsClassifier):
  """Spirals whose train batches number `poisoned_batches` (0-based) are all NaN.

  With `finite_loss=True` the loss of a poisoned batch stays finite and only its gradients are NaN (what a NaN
  feature through a ReLU does), so only the weights tell.
  """

  def __init__(self, poisoned_batches=(), finite_loss=False, **kwargs):
    super().__init__(**kwargs)
    self.poisoned_batches = tuple(poisoned_batches)
    self.finite_loss = finite_loss

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
    if self.finite_loss:
      bad = tf.reduce_any(tf.math.is_nan(batch["x"]))
      clean = {**batch, "x": tf.where(tf.math.is_nan(batch["x"]), 0.0, batch["x"])}
      loss, metrics, per_example = super().compute_loss(clean, training)
      return _nan_gradient(loss, bad), metrics, per_example
    loss, metrics, per_example = super().compute_loss(batch, training)
    # A NaN input reaches the loss whatever the kernels do with it: a fused
    # MatMul+BiasAdd+Relu (grappler's remapper) may turn NaN into 0.
    poison = 0.0 * tf.reduce_sum(batch["x"])
    return loss + poison, {**metrics, "loss": (metrics["loss"][0] + poison, metrics["loss"][1])}, per_example


@tf.custom_gradient
def _nan_gradient(loss, bad):
  """`loss`, whose gradient is NaN where `bad`."""

  def grad(upstream):
    return tf.where(bad, np.float32("nan"), upstream), None

  return tf.identity(loss), grad
