"""The one loop builder every program uses.

`LoopBody` turns a per-replica step function into the body of an on-device
loop (`tf.while_loop`) of up to `num_steps` steps; `build_loop_fn` compiles one body
into a `tf.function` (every program), `compile_loops` several in sequence
(the fused train-and-decode program). The host is out of the loop:

- metrics `{name: (value, weight)}` are summed as `value * weight` and
  `weight` over replicas and steps, as loop carries;
- per-example tensors are gathered from every replica in order and collected
  in TensorArrays (the TF2 form of TPU outfeed);
- an optional tail function runs once after the loop, in the same function,
  and may return scalars (the global step, the learning rate);
- everything comes back to the host in one transfer.

The step is traced without AutoGraph unless asked (`LoopOptions.autograph`):
AutoGraph's source transformations were most of a program's start-up.

The number of steps is a tensor argument and iterators are composite
tensors, so neither a shorter last loop nor a fresh iterator retraces.

Short loops cost little on the host: every scalar a loop produces (steps,
metric sums and weights, the tail's values) comes back packed in one float64
tensor, the compiled function is called through its one concrete function (no
dispatch on the arguments), and a loop of one step (`steps_per_loop=1`) is a
straight-line step, with no `tf.while_loop` around it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from programs.core.results import LoopResult, host_value

# A per-replica step returns (metrics, per_example).
SUM = tf.distribute.ReduceOp.SUM
StepFn = Callable[[Any], tuple[Mapping[str, tuple[Any, Any]], Mapping[str, tf.Tensor]]]
# A tail takes the number of steps run and may return {name: scalar tensor}.
TailFn = Callable[[tf.Tensor], Mapping[str, tf.Tensor] | None]


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """How a loop function is built.

  Attributes:
    until_exhausted: Stop early, without error, when the iterator ends.
    collect_per_example: Gather per-example outputs back to the host.
    jit_compile: Compile the step with XLA (the loop around it holds the
      iterator, which XLA cannot compile).
    autograph: Convert the step and tail functions with AutoGraph, so that
      Python `if`/`for`/`while` on tensors become graph control flow. Off,
      they are traced as plain Python (as Keras 3 traces models), which makes
      tracing several times faster.
    single_step: Every call runs exactly one step (a program with
      `steps_per_loop=1`): the step is traced without a loop around it.
  """

  until_exhausted: bool = False
  collect_per_example: bool = True
  jit_compile: bool | None = None
  autograph: bool = False
  single_step: bool = False


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
    tail_fn: TailFn | None = None,
    rows_per_replica: int | None = None,
    name: str = "loop",
    on_trace: Callable[[str], None] | None = None,
    read_fn: Callable[[Any], Any] | None = None,
  ):
    """Traces the step once (never runs it): its outputs size the loop's carries.

    Args:
      strategy: The runtime's strategy; `step_fn` runs under `strategy.run`.
      step_fn: Per-replica step: batch -> (metrics, per_example).
      iterator: A distributed iterator of the right type, used to trace (the
        step now, the loop function when it is compiled); calls may pass any
        iterator of the same spec.
      options: See `LoopOptions`.
      tail_fn: Called once after the steps with the number of steps run, in
        cross-replica context, inside the same compiled function; may return
        `{name: scalar tensor}`, handed back as `LoopResult.tail`.
      rows_per_replica: Most rows of a per-example output on one replica in
        one step (the per-replica batch size). With several replicas, rows
        are padded to it to be gathered; None gathers uneven rows.
      name: Names the step function for `on_trace`: `<name>/step`.
      on_trace: Called with the function's name each time the step function
        is traced (the no-retrace check).
      read_fn: Reads one step's per-replica batch from the iterator, in the
        trace (a worker's own `tf.data.Iterator`, whose state can be saved:
        `Runtime.per_replica`); None: `next(iterator)` of a distributed
        iterator. Not with `until_exhausted`.
    """
    self.strategy, self.options, self.iterator = strategy, options, iterator
    # Overlapping iterations lets the next batch's GetNext run during a step.
    # Across replicas, though, iterations of a step with no state to
    # serialise them (eval, decode) could pair one replica's collective of
    # step i with another's of step i+1: one iteration at a time there.
    self._parallel_iterations = 10 if strategy.num_replicas_in_sync == 1 else 1
    self.metric_names: list[str] = []
    self.metric_shapes: list[tf.TensorShape] = []
    self.example_names: list[str] = []
    if options.autograph:
      step_fn = _autograph(step_fn)
      tail_fn = tail_fn and _autograph(tail_fn)
    self.tail_fn = tail_fn

    # Every replica's rows are padded to `rows_per_replica` and gathered with
    # their counts, then the padding is dropped: an all-gather of uneven rows
    # fails inside a loop when a replica's last batch is empty.
    pad_to = rows_per_replica if strategy.num_replicas_in_sync > 1 else None

    def replica_fn(batch):
      metrics, per_example = step_fn(batch)
      metrics = {k: _weighted_pair(k, v) for k, v in metrics.items()}
      if pad_to is None:
        return metrics, per_example, {}
      counts = {k: tf.shape(v)[:1] for k, v in per_example.items()}
      return metrics, {k: _pad_rows(k, v, pad_to) for k, v in per_example.items()}, counts

    def gather(rows, counts):
      gathered = strategy.gather(rows, axis=0)
      if pad_to is None:
        return gathered
      keep = tf.sequence_mask(strategy.gather(counts, axis=0), pad_to)
      return tf.boolean_mask(gathered, tf.reshape(keep, [-1]))

    def one_step(batch):
      metrics, per_example, counts = strategy.run(replica_fn, args=(batch,))
      self.metric_names = sorted(metrics)
      self.example_names = sorted(per_example) if options.collect_per_example else []
      sums = [strategy.reduce(SUM, metrics[k][0], axis=None) for k in self.metric_names]
      self.metric_shapes = [t.shape for t in sums]
      weights = [strategy.reduce(SUM, metrics[k][1], axis=None) for k in self.metric_names]
      examples = [gather(per_example[k], counts.get(k)) for k in self.example_names]
      return sums, weights, examples

    def step_on_batch(batch):
      return (tf.constant(True), *one_step(batch))

    def step_on_optional(optional):
      specs = []

      def run():
        outputs = one_step(optional.get_value())
        specs.extend(outputs[2])
        return (tf.constant(True), *outputs)

      def nothing():
        zeros = [tf.zeros(shape, tf.float32) for shape in self.metric_shapes]
        empty = [tf.zeros([0, *(d or 0 for d in t.shape[1:])], t.dtype) for t in specs]
        return tf.constant(False), zeros, [tf.zeros((), tf.float32) for _ in self.metric_names], empty

      return tf.cond(optional.has_value(), run, nothing)

    self._read = read_fn or next
    if options.until_exhausted:
      if read_fn is not None:
        raise ValueError("a loop that reads until its data ends takes a distributed iterator, not a read_fn")
      step, spec = step_on_optional, tf.OptionalSpec(iterator.element_spec)
    else:
      step, spec = step_on_batch, iterator.element_spec if read_fn is None else _read_spec(read_fn, iterator)

    def traced_step(step_input):
      if on_trace is not None:
        on_trace(f"{name}/step")
      return step(step_input)

    # Traced on its own first, never run: its outputs size the loop's carries.
    # Without AutoGraph this costs a fraction of the loop's first run, and the
    # loop then inlines the step (a call to a nested function costs ~3% per
    # step), except under XLA, where the loop calls the compiled step.
    traced = tf.function(
      traced_step, jit_compile=options.jit_compile, reduce_retracing=False, autograph=False
    )
    concrete = traced.get_concrete_function(spec)
    # What the step runs, for the checks of a program (stateful random ops in a train step).
    self.step_graph = concrete.graph
    examples = concrete.structured_outputs[3]
    self.example_specs = [tf.TensorSpec(t.shape, t.dtype) for t in examples]
    self._step = traced if options.jit_compile else step

  def _add_step(self, step_input, state):
    """One step added to the loop state; returns (whether a step ran, the new state)."""
    steps, sums, weights, arrays = state
    ran, step_sums, step_weights, examples = self._step(step_input)
    sums = [total + x for total, x in zip(sums, step_sums)]
    weights = [total + x for total, x in zip(weights, step_weights)]
    if not self.options.until_exhausted:
      return ran, (steps + 1, sums, weights, [ta.write(steps, x) for ta, x in zip(arrays, examples)])
    if arrays:
      arrays = tf.cond(ran, lambda: [ta.write(steps, x) for ta, x in zip(arrays, examples)], lambda: arrays)
    return ran, (steps + tf.cast(ran, tf.int32), sums, weights, arrays)

  def __call__(self, iterator, num_steps):
    """Runs up to `num_steps` steps (in a trace); returns the loop's raw outputs (see `result`)."""
    state = (
      tf.constant(0, tf.int32),
      [tf.zeros(shape, tf.float32) for shape in self.metric_shapes],
      [tf.zeros((), tf.float32) for _ in self.metric_names],
      [tf.TensorArray(t.dtype, size=0, dynamic_size=True, infer_shape=False) for t in self.example_specs],
    )
    if self.options.single_step:
      step_input = iterator.get_next_as_optional() if self.options.until_exhausted else self._read(iterator)
      state = self._add_step(step_input, state)[1]
    elif self.options.until_exhausted:
      state = self._loop_until_exhausted(iterator, num_steps, state)
    else:
      state = tf.while_loop(
        lambda steps, *_: steps < num_steps,
        lambda *state: self._add_step(self._read(iterator), state)[1],
        state,
        parallel_iterations=self._parallel_iterations,
      )
    steps, sums, weights, arrays = state
    tail = dict((self.tail_fn(steps) or {}) if self.tail_fn is not None else {})
    self.tail_names = sorted(tail)
    self.tail_dtypes = [tf.as_dtype(tail[k].dtype) for k in self.tail_names]
    self._scalar_sums = [i for i, shape in enumerate(self.metric_shapes) if shape.rank == 0]
    # Every scalar in one float64 vector: one transfer to the host (float64 holds int64 steps exactly).
    scalars = [steps, *(sums[i] for i in self._scalar_sums), *weights, *(tail[k] for k in self.tail_names)]
    packed = tf.stack([tf.cast(t, tf.float64) for t in scalars])
    tensors = [s for i, s in enumerate(sums) if i not in self._scalar_sums]
    examples = [_concat(ta, spec) for ta, spec in zip(arrays, self.example_specs)]
    return packed, tensors, examples

  def _loop_until_exhausted(self, iterator, num_steps, state):
    """The loop, ending early (without error) when the iterator has no more batches."""

    def body(exhausted, *state):
      ran, state = self._add_step(iterator.get_next_as_optional(), state)
      return (tf.logical_not(ran), *state)

    _, *state = tf.while_loop(
      lambda exhausted, steps, *_: tf.logical_and(tf.logical_not(exhausted), steps < num_steps),
      body,
      (tf.constant(False), *state),
      parallel_iterations=self._parallel_iterations,
    )
    return state

  def result(self, outputs) -> LoopResult:
    """The host-side result of the loop's outputs (numpy): `(packed scalars, other sums, per-example rows)`."""
    packed, tensors, examples = outputs
    values = packed.tolist()
    k, n = len(self._scalar_sums), len(self.metric_names)
    scalar_sums, weights, tail = values[1 : 1 + k], values[1 + k : 1 + k + n], values[1 + k + n :]
    sums: list[float | Any] = list(map(host_value, tensors))
    for i, value in zip(self._scalar_sums, scalar_sums):
      sums.insert(i, value)
    return LoopResult(
      steps=int(values[0]),
      metric_sums=dict(zip(self.metric_names, sums)),
      metric_weights=dict(zip(self.metric_names, weights)),
      per_example=dict(zip(self.example_names, examples)),
      tail={k: dtype.as_numpy_dtype(v) for k, dtype, v in zip(self.tail_names, self.tail_dtypes, tail)},
    )


def compile_loops(
  bodies: list[LoopBody], *, on_trace: Callable[[str], None] | None = None
) -> Callable[..., list[LoopResult]]:
  """Compiles loop bodies that run one after the other in one `tf.function`, and traces it.

  Args:
    bodies: The loops, in order (each traced with its own `iterator`).
    on_trace: Called with "loops" each time the function is traced (the
      no-retrace check).

  Returns:
    `run(iterator_1, num_steps_1, iterator_2, num_steps_2, ...) -> [LoopResult, ...]`,
    one host round trip for all of them.
  """

  def fused(*args):
    if on_trace is not None:
      on_trace("loops")
    return [body(args[2 * i], args[2 * i + 1]) for i, body in enumerate(bodies)]

  compiled = tf.function(fused, reduce_retracing=False, autograph=False)
  # Traced now, with tensor step counts, so that the first run costs no compile; then called directly (iterators
  # of another spec are an error, never a retrace).
  concrete = compiled.get_concrete_function(
    *[x for b in bodies for x in (b.iterator, tf.TensorSpec((), tf.int32))]
  )
  counts: dict[int, tf.Tensor] = {}  # Step counts as tensors, made once each.

  def count(n: int) -> tf.Tensor:
    if n not in counts:
      counts[n] = tf.constant(n, tf.int32)
    return counts[n]

  def run(*args) -> list[LoopResult]:
    outputs = concrete(*[count(a) if i % 2 else a for i, a in enumerate(args)])
    return [
      body.result((packed.numpy(), [t.numpy() for t in tensors], [t.numpy() for t in examples]))
      for body, (packed, tensors, examples) in zip(bodies, outputs)
    ]

  return run


def build_loop_fn(
  body: LoopBody, on_trace: Callable[[str], None] | None = None
) -> Callable[[Any, int], LoopResult]:
  """Compiles and traces the loop function of one body (one program).

  Args:
    body: The loop.
    on_trace: Called with "loops" each time the loop function is traced.

  Returns:
    `run(iterator, num_steps) -> LoopResult`.
  """
  run_all = compile_loops([body], on_trace=on_trace)
  return lambda iterator, num_steps: run_all(iterator, num_steps)[0]


def _read_spec(read_fn: Callable[[Any], Any], iterator: Any) -> Any:
  """The type spec of what `read_fn(iterator)` returns (traced, never run)."""
  outputs = tf.function(read_fn, autograph=False).get_concrete_function(iterator).structured_outputs
  return tf.nest.map_structure(tf.type_spec_from_value, outputs)


def _pad_rows(name: str, value: tf.Tensor, rows: int) -> tf.Tensor:
  """`value` with zero rows appended up to `rows` (on one replica)."""
  count = tf.shape(value)[0]
  check = tf.debugging.assert_less_equal(
    count, rows, message=f"per-example output '{name}' has more rows than the per-replica batch ({rows})"
  )
  with tf.control_dependencies([check]):
    padding = [[0, rows - count]] + [[0, 0]] * (value.shape.rank - 1)
    return tf.ensure_shape(tf.pad(value, padding), [rows, *value.shape[1:]])


def _concat(array: tf.TensorArray, spec: tf.TensorSpec) -> tf.Tensor:
  """The rows of every step; no rows (a loop that found the data already ended) is an empty tensor."""
  empty = tf.zeros([0, *(d or 0 for d in spec.shape[1:])], spec.dtype)
  return tf.cond(array.size() > 0, array.concat, lambda: empty)


def _autograph(fn: Callable) -> Callable:
  """`fn` converted with AutoGraph (methods too), for tracing without `tf.function`'s own conversion."""

  def call(*args):
    return fn(*args)

  return tf.autograph.to_graph(call)


def _weighted_pair(name, pair) -> tuple[tf.Tensor, tf.Tensor]:
  """(value * weight, weight) in float32; a replica with an empty batch reports NaN * 0 = 0.

  The value is a scalar, or a tensor of static shape (reduced elementwise: the summed state of a stateful
  metric, `programs.core.keras_task`); the weight is a scalar.
  """
  if not isinstance(pair, (tuple, list)) or len(pair) != 2:
    raise ValueError(f"metric '{name}' must be a (value, weight) pair, got {pair!r}")
  value, weight = (tf.cast(t, tf.float32) for t in pair)
  if weight.shape.rank != 0 or not value.shape.is_fully_defined():
    raise ValueError(
      f"metric '{name}' must be a (value, weight) pair: a scalar weight and a value of static shape, got "
      f"shapes {value.shape} and {weight.shape}"
    )
  return tf.math.multiply_no_nan(value, tf.broadcast_to(weight, value.shape)), weight
