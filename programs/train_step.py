"""The train program's default step: a gradient tape over `Task.compute_loss`, with the framework's policy.

The policy (clipping by global norm, skipping non-finite updates) lives here, not in the task, so that a task that
writes its own `train_step` writes plain per-replica code and a task that does not gets every policy for free.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from programs.core.results import Metrics, PerExample
from programs.core.task import Task


def gradient_step(
  task: Task,
  batch: Any,
  clip_gradient_norm: float | None = None,
  skip_non_finite: bool = False,
  accumulate_steps: int = 1,
) -> tuple[tf.Tensor, Metrics, PerExample]:
  """One optimisation step of `task` on one replica's batch.

  Args:
    task: The task: its `compute_loss`, `trainable_variables` and `optimizer`.
    batch: This replica's batch.
    clip_gradient_norm: If set, gradients are clipped to this global norm (of the global batch's gradient) and the
      norm before clipping is the `grad_norm` metric.
    skip_non_finite: Skip the update, on every replica, when the loss or a gradient of any replica is NaN or Inf;
      the step then counts in the `skipped` metric and its loss and metrics weigh 0.
    accumulate_steps: Split the batch into this many equal micro-batches, run forward and backward on one at a
      time and apply the mean of their gradients once: the same update as on the whole batch, with the
      activations of one micro-batch in memory.

  Returns:
    (loss, metrics, per_example), in float32 whatever the compute precision.
  """
  num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
  variables = task.trainable_variables
  optimizer = task.optimizer
  # A float16 model's optimizer is a LossScaleOptimizer: it scales the loss, and unscales and checks the gradients.
  scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
  parts = _split(batch, accumulate_steps)
  grads, losses, metric_parts, examples = None, [], [], []
  for part in parts:
    with tf.GradientTape() as tape:
      loss, metrics, per_example = task.compute_loss(part, training=True)
      loss = tf.cast(loss, tf.float32)
      # Keras optimizers sum gradients across replicas, so scale to a mean (over micro-batches too).
      scaled_loss = loss / (num_replicas * accumulate_steps) if num_replicas * accumulate_steps > 1 else loss
      if scales_loss:
        scaled_loss = optimizer.scale_loss(scaled_loss)
    part_grads = tape.gradient(scaled_loss, variables)
    grads = part_grads if grads is None else [a + b for a, b in zip(grads, part_grads)]
    losses.append(loss)
    metric_parts.append(metrics)
    examples.append(per_example)
  loss, metrics, per_example = _combine(losses, metric_parts, examples)
  ctx = tf.distribute.get_replica_context()
  if clip_gradient_norm is not None:
    # The norm of the global-batch gradient needs the reduced gradient.
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    norm = tf.linalg.global_norm(reduced)
    if scales_loss:
      norm = norm / optimizer.dynamic_scale
    scale = tf.minimum(1.0, clip_gradient_norm / tf.maximum(norm, 1e-12))
    grads = [g * scale for g in grads]
    metrics["grad_norm"] = (norm, tf.constant(1.0))
  if scales_loss and num_replicas > 1:
    grads = _non_finite_everywhere_if_anywhere(ctx, grads)
  if not skip_non_finite:
    optimizer.apply(grads, variables)
    return loss, metrics, per_example
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in [loss, *grads]])
  bad_replicas = ctx.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
  ok = tf.equal(bad_replicas, 0.0)
  _apply_if(optimizer, ok, grads, variables)
  weight = tf.cast(ok, tf.float32)
  metrics.setdefault("loss", (loss, tf.constant(1.0)))
  metrics = {k: (v, tf.cast(w, tf.float32) * weight) for k, (v, w) in metrics.items()}
  metrics["skipped"] = (1.0 - weight, tf.constant(1.0))
  return loss, metrics, per_example


def _non_finite_everywhere_if_anywhere(ctx: tf.distribute.ReplicaContext, grads: list[Any]) -> list[Any]:
  """This replica's gradients, made NaN where another replica's hold NaN or Inf.

  Keras' `LossScaleOptimizer` skips an update (and lowers the scale) when the gradients are not finite, but it
  asks only the first replica's gradients, before they are summed: when another replica overflowed, the sum
  holds Inf and the weights turn NaN (`fit` does the same). With every replica's gradients non-finite, the
  first replica's say so too.
  """
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(_values(g))) for g in grads if g is not None])
  ok = tf.equal(ctx.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32)), 0.0)

  def poisoned(g):
    if g is None:
      return g
    values = tf.where(ok, _values(g), tf.constant(float("nan"), _values(g).dtype))
    return tf.IndexedSlices(values, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) else values

  return [poisoned(g) for g in grads]


def _values(gradient):
  return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _split(batch: Any, parts: int) -> list[Any]:
  if parts == 1:
    return [batch]
  flat = tf.nest.flatten(batch)
  pieces = [tf.split(t, parts, axis=0) for t in flat]
  return [tf.nest.pack_sequence_as(batch, [p[i] for p in pieces]) for i in range(parts)]


def _combine(losses, metric_parts, examples) -> tuple[tf.Tensor, Metrics, PerExample]:
  """The micro-batches' results as one batch's: mean loss, weighted metrics, concatenated per-example rows."""
  if len(losses) == 1:
    return losses[0], dict(metric_parts[0]), examples[0]
  metrics = {}
  for name in metric_parts[0]:
    pairs = [(tf.cast(v, tf.float32), tf.cast(w, tf.float32)) for v, w in (m[name] for m in metric_parts)]
    weight = tf.add_n([w for _, w in pairs])
    value = tf.math.divide_no_nan(tf.add_n([tf.math.multiply_no_nan(v, w) for v, w in pairs]), weight)
    metrics[name] = (value, weight)
  per_example = {k: tf.concat([e[k] for e in examples], axis=0) for k in examples[0]}
  return tf.add_n(losses) / len(losses), metrics, per_example


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
