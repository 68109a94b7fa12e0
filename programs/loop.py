"""The one loop builder every program uses.

`build_loop_fn` turns a per-replica step function into a `tf.function` that
runs up to `num_steps` steps in an on-device `tf.range` loop, so the host is
out of the loop:

- metrics `{name: (value, weight)}` are summed as `value * weight` and
  `weight` over replicas and steps, as loop carries;
- per-example tensors are gathered from every replica in order and collected
  in TensorArrays (the TF2 form of TPU outfeed);
- an optional tail function runs once after the loop, in the same function;
- everything comes back to the host in one transfer.

The number of steps is a tensor argument and iterators are composite
tensors, so neither a shorter last loop nor a fresh iterator retraces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

# A per-replica step returns (metrics, per_example).
SUM = tf.distribute.ReduceOp.SUM
StepFn = Callable[[Any], tuple[Mapping[str, tuple[Any, Any]], Mapping[str, tf.Tensor]]]


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """How a loop function is built.

  Attributes:
    until_exhausted: Stop early, without error, when the iterator ends.
    collect_per_example: Gather per-example outputs back to the host.
    jit_compile: Compile the loop function with XLA.
  """

  until_exhausted: bool = False
  collect_per_example: bool = True
  jit_compile: bool | None = None


@dataclasses.dataclass
class LoopResult:
  """What one loop call hands to the host (numpy values).

  Attributes:
    steps: Steps actually run (fewer than asked when the data ended).
    metric_sums: `sum(value * weight)` per metric over steps and replicas.
    metric_weights: `sum(weight)` per metric.
    per_example: `{name: array[examples, ...]}` in step, then replica order.
  """

  steps: int
  metric_sums: dict[str, float]
  metric_weights: dict[str, float]
  per_example: dict[str, np.ndarray]

  def means(self) -> dict[str, float]:
    """Weighted means of the metrics (NaN where no weight was seen)."""
    return {k: _safe_div(self.metric_sums[k], self.metric_weights[k]) for k in self.metric_sums}


class MetricAccumulator:
  """Adds up `LoopResult`s on the host (float64) into weighted means."""

  def __init__(self):
    self.steps = 0
    self._sums: dict[str, float] = {}
    self._weights: dict[str, float] = {}
    self._per_example: dict[str, list[np.ndarray]] = {}

  def add(self, result: LoopResult) -> None:
    """Accumulates one loop's sums, weights and per-example rows."""
    self.steps += result.steps
    for k, v in result.metric_sums.items():
      self._sums[k] = self._sums.get(k, 0.0) + float(v)
      self._weights[k] = self._weights.get(k, 0.0) + float(result.metric_weights[k])
    for k, v in result.per_example.items():
      self._per_example.setdefault(k, []).append(v)

  def means(self) -> dict[str, float]:
    """Weighted means over everything added."""
    return {k: _safe_div(self._sums[k], self._weights[k]) for k in self._sums}

  def per_example(self) -> dict[str, np.ndarray]:
    """Per-example rows of every loop added, concatenated."""
    return {k: np.concatenate(v, axis=0) for k, v in self._per_example.items()}


def _safe_div(num: float, den: float) -> float:
  return float(num) / float(den) if den else float("nan")


def build_loop_fn(
  strategy: tf.distribute.Strategy,
  step_fn: StepFn,
  iterator: Any,
  *,
  options: LoopOptions = LoopOptions(),
  tail_fn: Callable[[tf.Tensor], None] | None = None,
  on_trace: Callable[[], None] | None = None,
) -> Callable[[Any, int], LoopResult]:
  """Builds and traces a loop function over `step_fn`.

  Args:
    strategy: The runtime's strategy; `step_fn` runs under `strategy.run`.
    step_fn: Per-replica step: batch -> (metrics, per_example).
    iterator: A distributed iterator of the right type, used to trace; calls
      may pass any iterator of the same spec.
    options: See `LoopOptions`.
    tail_fn: Called once after the steps with the number of steps run, in
      cross-replica context, inside the same compiled function.
    on_trace: Called each time the loop function is traced (for tests and the
      no-retrace check).

  Returns:
    `run(iterator, num_steps) -> LoopResult`.
  """

  def replica_fn(batch):
    metrics, per_example = step_fn(batch)
    return {k: _weighted_pair(k, v) for k, v in metrics.items()}, per_example

  metric_specs, example_specs = _output_specs(strategy, replica_fn, iterator)
  if not options.collect_per_example:
    example_specs = {}
  metric_names = sorted(metric_specs)
  example_names = sorted(example_specs)

  def one_step(batch, state):
    steps, sums, weights, arrays = state
    metrics, per_example = strategy.run(replica_fn, args=(batch,))
    sums = [total + strategy.reduce(SUM, metrics[k][0], axis=None) for k, total in zip(metric_names, sums)]
    weights = [
      total + strategy.reduce(SUM, metrics[k][1], axis=None) for k, total in zip(metric_names, weights)
    ]
    arrays = [
      ta.write(steps, strategy.gather(per_example[k], axis=0)) for ta, k in zip(arrays, example_names)
    ]
    return steps + 1, sums, weights, arrays

  def loop(iterator, num_steps):
    if on_trace is not None:
      on_trace()
    state = (
      tf.constant(0, tf.int32),
      [tf.zeros((), tf.float32) for _ in metric_names],
      [tf.zeros((), tf.float32) for _ in metric_names],
      [
        tf.TensorArray(example_specs[k].dtype, size=0, dynamic_size=True, infer_shape=False)
        for k in example_names
      ],
    )
    for _ in tf.range(num_steps):
      if options.until_exhausted:
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
          break
        state = one_step(optional.get_value(), state)
      else:
        state = one_step(next(iterator), state)
    steps, sums, weights, arrays = state
    if tail_fn is not None:
      tail_fn(steps)
    return steps, sums, weights, [ta.concat() for ta in arrays]

  compiled = tf.function(loop, jit_compile=options.jit_compile, reduce_retracing=False)
  # Trace now, with a tensor step count, so that the first run costs no compile.
  compiled.get_concrete_function(iterator, tf.TensorSpec((), tf.int32))

  def run(iterator, num_steps: int) -> LoopResult:
    steps, sums, weights, examples = compiled(iterator, tf.constant(num_steps, tf.int32))
    # One host transfer for everything the loop produced.
    steps, sums, weights, examples = tf.nest.map_structure(
      lambda t: t.numpy(), (steps, sums, weights, examples)
    )
    return LoopResult(
      steps=int(steps),
      metric_sums=dict(zip(metric_names, map(float, sums))),
      metric_weights=dict(zip(metric_names, map(float, weights))),
      per_example=dict(zip(example_names, examples)),
    )

  return run


def _weighted_pair(name, pair) -> tuple[tf.Tensor, tf.Tensor]:
  """(value * weight, weight) in float32; a replica with an empty batch reports NaN * 0 = 0."""
  if not isinstance(pair, (tuple, list)) or len(pair) != 2:
    raise ValueError(f"metric '{name}' must be a (value, weight) pair, got {pair!r}")
  value, weight = (tf.cast(t, tf.float32) for t in pair)
  if value.shape.rank != 0 or weight.shape.rank != 0:
    raise ValueError(
      f"metric '{name}' must be a (value, weight) pair of scalars, got shapes {value.shape} and {weight.shape}"
    )
  return tf.math.multiply_no_nan(value, weight), weight


def _output_specs(strategy, replica_fn, iterator):
  """Traces one step (never runs it) to learn the names and shapes of its outputs.

  The loop's carries must exist before the loop; tracing the step once on its
  own is cheaper than peeling a first step into every compiled loop.
  """
  names = []

  def one_step(iterator):
    metrics, per_example = strategy.run(replica_fn, args=(next(iterator),))
    names.extend(metrics)
    return {k: strategy.gather(v, axis=0) for k, v in per_example.items()}

  per_example = tf.function(one_step).get_concrete_function(iterator).structured_outputs
  return names, {k: tf.TensorSpec(v.shape, v.dtype) for k, v in per_example.items()}
