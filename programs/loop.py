"""The one loop builder every program uses.

`LoopBody` turns a per-replica step function into the body of an on-device
`tf.range` loop of up to `num_steps` steps; `build_loop_fn` compiles one body
into a `tf.function` (every program), `compile_loops` several in sequence
(the fused train-and-decode program). The host is out of the loop:

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


class LoopBody:
  """The traceable body of one on-device loop over a per-replica step (not compiled).

  `build_loop_fn` compiles one body; `compile_loops` compiles several in
  sequence into one function (a fused train-and-decode program), so every
  program's loop comes from this one class.
  """

  def __init__(
    self,
    strategy: tf.distribute.Strategy,
    step_fn: StepFn,
    iterator: Any,
    *,
    options: LoopOptions = LoopOptions(),
    tail_fn: Callable[[tf.Tensor], None] | None = None,
  ):
    """Learns the step's outputs (by tracing one step, never run).

    Args:
      strategy: The runtime's strategy; `step_fn` runs under `strategy.run`.
      step_fn: Per-replica step: batch -> (metrics, per_example).
      iterator: A distributed iterator of the right type, used to trace.
      options: See `LoopOptions`.
      tail_fn: Called once after the steps with the number of steps run, in
        cross-replica context, inside the same compiled function.
    """
    self.strategy, self.options, self.tail_fn = strategy, options, tail_fn

    def replica_fn(batch):
      metrics, per_example = step_fn(batch)
      return {k: _weighted_pair(k, v) for k, v in metrics.items()}, per_example

    self._replica_fn = replica_fn
    metric_names, example_specs = _output_specs(strategy, replica_fn, iterator)
    self.metric_names = sorted(metric_names)
    self.example_specs = example_specs if options.collect_per_example else {}
    self.example_names = sorted(self.example_specs)

  def _one_step(self, batch, state):
    strategy = self.strategy
    steps, sums, weights, arrays = state
    metrics, per_example = strategy.run(self._replica_fn, args=(batch,))
    sums = [
      total + strategy.reduce(SUM, metrics[k][0], axis=None) for k, total in zip(self.metric_names, sums)
    ]
    weights = [
      total + strategy.reduce(SUM, metrics[k][1], axis=None) for k, total in zip(self.metric_names, weights)
    ]
    arrays = [
      ta.write(steps, strategy.gather(per_example[k], axis=0)) for ta, k in zip(arrays, self.example_names)
    ]
    return steps + 1, sums, weights, arrays

  def __call__(self, iterator, num_steps):
    """Runs up to `num_steps` steps (in a trace); returns the loop's raw outputs."""
    state = (
      tf.constant(0, tf.int32),
      [tf.zeros((), tf.float32) for _ in self.metric_names],
      [tf.zeros((), tf.float32) for _ in self.metric_names],
      [
        tf.TensorArray(self.example_specs[k].dtype, size=0, dynamic_size=True, infer_shape=False)
        for k in self.example_names
      ],
    )
    for _ in tf.range(num_steps):
      if self.options.until_exhausted:
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
          break
        state = self._one_step(optional.get_value(), state)
      else:
        state = self._one_step(next(iterator), state)
    steps, sums, weights, arrays = state
    if self.tail_fn is not None:
      self.tail_fn(steps)
    return steps, sums, weights, [ta.concat() for ta in arrays]

  def result(self, outputs) -> LoopResult:
    """The host-side result of the loop's outputs (numpy)."""
    steps, sums, weights, examples = outputs
    return LoopResult(
      steps=int(steps),
      metric_sums=dict(zip(self.metric_names, map(float, sums))),
      metric_weights=dict(zip(self.metric_names, map(float, weights))),
      per_example=dict(zip(self.example_names, examples)),
    )


def compile_loops(
  bodies: list[LoopBody],
  iterators: list[Any],
  *,
  jit_compile: bool | None = None,
  on_trace: Callable[[], None] | None = None,
) -> Callable[..., list[LoopResult]]:
  """Compiles loop bodies that run one after the other in one `tf.function`, and traces it.

  Args:
    bodies: The loops, in order.
    iterators: One iterator per body, of the type later calls pass, to trace.
    jit_compile: Compile with XLA.
    on_trace: Called each time the function is traced (the no-retrace check).

  Returns:
    `run(iterator_1, num_steps_1, iterator_2, num_steps_2, ...) -> [LoopResult, ...]`,
    one host round trip for all of them.
  """

  def fused(*args):
    if on_trace is not None:
      on_trace()
    return [body(args[2 * i], args[2 * i + 1]) for i, body in enumerate(bodies)]

  compiled = tf.function(fused, jit_compile=jit_compile, reduce_retracing=False)
  # Trace now, with tensor step counts, so that the first run costs no compile.
  compiled.get_concrete_function(*[x for it in iterators for x in (it, tf.TensorSpec((), tf.int32))])

  def run(*args) -> list[LoopResult]:
    args = [tf.constant(a, tf.int32) if i % 2 else a for i, a in enumerate(args)]
    # One host transfer for everything the loops produced.
    outputs = tf.nest.map_structure(lambda t: t.numpy(), compiled(*args))
    return [body.result(out) for body, out in zip(bodies, outputs)]

  return run


def build_loop_fn(
  strategy: tf.distribute.Strategy,
  step_fn: StepFn,
  iterator: Any,
  *,
  options: LoopOptions = LoopOptions(),
  tail_fn: Callable[[tf.Tensor], None] | None = None,
  on_trace: Callable[[], None] | None = None,
) -> Callable[[Any, int], LoopResult]:
  """Builds, compiles and traces the loop function of one program.

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
  body = LoopBody(strategy, step_fn, iterator, options=options, tail_fn=tail_fn)
  run_all = compile_loops([body], [iterator], jit_compile=options.jit_compile, on_trace=on_trace)
  return lambda iterator, num_steps: run_all(iterator, num_steps)[0]


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
