"""The train program's default step: a gradient tape over `Task.compute_loss`, with the framework's policy.

The policy (clipping by global norm, skipping non-finite updates) lives here, not in the task, so that a task that
writes its own `train_step` writes plain per-replica code and a task that does not gets every policy for free.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from core.results import Metrics, PerExample
from core.task import Task


def gradient_step(
  task: Task, batch: Any, clip_gradient_norm: float | None = None, skip_non_finite: bool = False
) -> tuple[tf.Tensor, Metrics, PerExample]:
  """One optimisation step of `task` on one replica's batch.

  Args:
    task: The task: its `compute_loss`, `trainable_variables` and `optimizer`.
    batch: This replica's batch.
    clip_gradient_norm: If set, gradients are clipped to this global norm (of the global batch's gradient) and the
      norm before clipping is the `grad_norm` metric.
    skip_non_finite: Skip the update, on every replica, when the loss or a gradient of any replica is NaN or Inf;
      the step then counts in the `skipped` metric and its loss and metrics weigh 0.

  Returns:
    (loss, metrics, per_example).
  """
  num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
  variables = task.trainable_variables
  with tf.GradientTape() as tape:
    loss, metrics, per_example = task.compute_loss(batch, training=True)
    # Keras optimizers sum gradients across replicas, so scale to a mean.
    scaled_loss = loss / num_replicas if num_replicas > 1 else loss
  grads = tape.gradient(scaled_loss, variables)
  metrics = dict(metrics)
  ctx = tf.distribute.get_replica_context()
  if clip_gradient_norm is not None:
    # The norm of the global-batch gradient needs the reduced gradient.
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    norm = tf.linalg.global_norm(reduced)
    scale = tf.minimum(1.0, clip_gradient_norm / tf.maximum(norm, 1e-12))
    grads = [g * scale for g in grads]
    metrics["grad_norm"] = (norm, tf.constant(1.0))
  if not skip_non_finite:
    task.optimizer.apply(grads, variables)
    return loss, metrics, per_example
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in [loss, *grads]])
  bad_replicas = ctx.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
  ok = tf.equal(bad_replicas, 0.0)
  _apply_if(task.optimizer, ok, grads, variables)
  weight = tf.cast(ok, tf.float32)
  metrics.setdefault("loss", (loss, tf.constant(1.0)))
  metrics = {k: (v, tf.cast(w, tf.float32) * weight) for k, (v, w) in metrics.items()}
  metrics["skipped"] = (1.0 - weight, tf.constant(1.0))
  return loss, metrics, per_example


def _apply_if(optimizer, ok: tf.Tensor, grads, variables) -> None:
  """`optimizer.apply(grads, variables)` on every replica if `ok`, else nothing.

  The condition is taken in cross-replica context (through `merge_call`): strategies do not allow a branch that
  synchronises replicas (the optimizer all-reduces gradients) inside a per-replica `tf.cond`. `ok` must be the
  same on every replica.
  """

  def in_cross_replica(distribution, ok, grads):
    def apply():
      distribution.extended.call_for_each_replica(lambda g: optimizer.apply(g, variables), args=(grads,))
      return tf.constant(True)

    first_ok = distribution.experimental_local_results(ok)[0]
    return tf.cond(first_ok, apply, lambda: tf.constant(False))

  tf.distribute.get_replica_context().merge_call(in_cross_replica, args=(ok, grads))
