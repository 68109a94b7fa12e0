"""What every program shares: validation, setup, compile-once, summaries."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from programs.core.errors import ConfigError, describe_spec, failing_line
from programs.core.metric_writers import MultiWriter, program_writer
from programs.core.results import MetricAccumulator, ProgramResult
from programs.core.runtime import Runtime
from programs.core.task import Task
from programs.loop import LoopBody, LoopOptions, build_loop_fn
from programs.run_errors import named

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Keras' bold in its error messages.


class Program:
  """One unit of compiled work over the runtime: traced once, run many times.

  Subclasses say which task step to loop over (`_step_fn`), which split it
  reads, and what the host does with the loop's results (`run`).
  """

  kind = "program"

  def __init__(self, task: Task, split: str, steps_per_loop: int, name: str | None = None):
    """Validates the configuration; touches no device and no file.

    Args:
      task: The task this program runs.
      split: The data split it reads.
      steps_per_loop: Device steps per compiled call (>= 1).
      name: Summary folder name; defaults to the program's kind and split.
    """
    self.name = name or self.default_name(split)
    if not isinstance(steps_per_loop, int) or steps_per_loop < 1:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': steps_per_loop must be an integer >= 1, got {steps_per_loop!r}"
      )
    if task.splits and split not in task.splits:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': task '{task.name}' has no split "
        f"'{split}' (it has: {', '.join(task.splits)})"
      )
    self.task = task
    self.split = split
    self.steps_per_loop = steps_per_loop
    self.use_ema = False
    self.trigger_interval = 1
    self.trigger_offset = 0
    self.trace_counts: dict[str, int] = {}
    self.num_batches: int | None = None
    self._epoch_iterator = None
    self._epoch_steps: int | None = None
    self.compile_secs: float | None = None
    self.runtime: Runtime | None = None
    self.writer: MultiWriter | None = None
    # Steps whose outputs a retention policy must keep (those of kept and best checkpoints); set by the executor.
    self.keep_steps: Callable[[], Collection[int]] = tuple
    self._loop = None

  def runs_in_cycle(self, cycle: int) -> bool:
    """Whether the schedule runs this (eval or decode) program in cycle `cycle`."""
    return cycle % self.trigger_interval == self.trigger_offset % self.trigger_interval

  def _set_trigger(self, interval: int, offset: int) -> None:
    if interval < 1 or offset < 0:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': trigger_interval must be >= 1 and trigger_offset >= 0, "
        f"got {interval} and {offset}"
      )
    self.trigger_interval, self.trigger_offset = interval, offset

  def default_name(self, split: str) -> str:
    """The summary folder name when none is given."""
    return f"{self.kind}_{split}"

  # ----- Lifecycle ------------------------------------------------------------

  def prepare(self, runtime: Runtime, model_dir: str) -> float:
    """Makes the program ready to run: validate, build, setup, compile; returns the compile seconds.

    The one entry point of the lifecycle: the executor, the tests and the benchmarks all call it. The runtime
    must be built (its tasks' variables exist); a checkpoint may be restored afterwards (see `restored`).
    """
    self.validate(runtime)
    self.build(runtime)
    self.setup(runtime, model_dir)
    return self.compile()

  def validate(self, runtime: Runtime) -> None:
    """Checks the configuration against the built runtime and task; writes nothing."""
    if self.use_ema and self.task.ema is None:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': use_ema needs an EMA of the weights: set "
        f"{type(self.task).__name__}.ema_decay"
      )
    if self.task.global_batch_size % runtime.num_replicas:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': the global batch size {self.task.global_batch_size} of task "
        f"'{self.task.name}' does not divide by the {runtime.num_replicas} replicas"
      )

  def build(self, runtime: Runtime) -> None:
    """Creates the program's own state (under the strategy scope), before restore."""
    self.runtime = runtime

  def restored(self) -> None:
    """Called after a checkpoint was restored into the prepared program (the train input re-positions)."""

  def checkpoint_items(self) -> dict[str, Any]:
    """Program state that must survive a restart (saved with the run)."""
    return {}

  def setup(self, runtime: Runtime, model_dir: str) -> None:
    """Binds the program to the built runtime and creates its summary folder."""
    self.runtime = runtime
    self.writer = program_writer(model_dir, self.name, enabled=runtime.is_chief)
    self.dataset = runtime.distribute_dataset(self.task, self.split)
    self._setup_run_input(runtime)

  def compile(self) -> float:
    """Traces the program's step and loop functions once; returns the seconds it took.

    Raises:
      ConfigError: The task's device code uses Python control flow on a
        tensor while `Task.autograph` is off, or fails on the split's
        batches (keys, shapes or dtypes that do not fit the model): names
        the task, the split, its element spec and the failing line.
    """
    start = time.perf_counter()
    try:
      self._compile_loops()
    except tf.errors.OperatorNotAllowedInGraphError as e:
      what = str(e).strip().splitlines()[0]
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': the device code of task '{self.task.name}' uses Python "
        f"control flow on a tensor ({what}); write it with tf.cond / tf.while_loop, or set "
        f"{type(self.task).__name__}.autograph = True"
      ) from e
    except (KeyError, ValueError, TypeError, IndexError, tf.errors.InvalidArgumentError) as e:
      if isinstance(e, ConfigError):
        raise
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': the device code of task '{self.task.name}' fails on the batches "
        f"of split '{self.split}' ({element_spec(self.task, self.split)}) at {failing_line(e)}: "
        f"{type(e).__name__}: {' '.join(re.sub(_ANSI, '', str(e)).split())[:400]}"
      ) from e
    self.compile_secs = time.perf_counter() - start
    logging.info("Compiled program %s in %.2fs", self.name, self.compile_secs)
    return self.compile_secs

  def _compile_loops(self) -> None:
    """Builds and traces the loop function(s) that `run` calls."""
    self._body = self.loop_body()
    self._loop = build_loop_fn(self._body, on_trace=self._count_trace)

  def metric_names(self) -> set[str] | None:
    """The names of the metrics a run returns, known once the program is traced; None where not known.

    Asks the task's `reduce_metrics` what it makes of the traced metrics (with zero sums), so a name a watcher
    refers to is checked before the first run.
    """
    body = getattr(self, "_body", None)
    if body is None or not body.metric_names:
      return None
    sums = {n: np.zeros([d or 0 for d in s]) for n, s in zip(body.metric_names, body.metric_shapes)}
    try:
      return set(self.task.reduce_metrics(sums, dict.fromkeys(body.metric_names, 0.0)))
    except Exception:  # noqa: BLE001  (a task's own reduction may need real values: then checked at the first run)
      return None

  def loop_body(self, name: str = "loop", on_trace: Callable[[str], None] | None = None) -> LoopBody:
    """The on-device loop over this program's step (traced, not compiled): what its loop function runs."""
    return LoopBody(
      self.runtime.strategy,
      self._step_fn,
      self._trace_iterator(),
      options=self.loop_options(),
      tail_fn=self._tail_fn(),
      rows_per_replica=self.rows_per_replica(),
      name=name,
      on_trace=on_trace or self._count_trace,
      read_fn=self._read_fn(),
    )

  def run(self, *args, **kwargs) -> ProgramResult:
    """Runs the program once; see subclasses."""
    raise NotImplementedError

  def stop_reason(self) -> str | None:
    """Why the run should end after this cycle (a quality target reached), or None."""
    return None

  def final_metrics(self, result: ProgramResult) -> dict[str, float]:
    """The metrics of a run, once every part of it is done (decode: after post-processing)."""
    return result.metrics

  def wait(self) -> None:
    """Blocks until asynchronous host work of earlier runs is done."""

  def busy(self) -> bool:
    """Whether asynchronous host work of an earlier run is still going on."""
    return False

  def parts(self) -> list[Program]:
    """This program and the programs it runs inside itself (each with its own writer)."""
    return [self]

  def close(self) -> None:
    """Finishes pending work and closes the summary writer."""
    self.wait()
    if self.writer is not None:
      self.writer.close()

  # ----- For subclasses -------------------------------------------------------

  def rows_per_replica(self) -> int:
    """Most per-example rows one replica produces per step: the per-replica batch size."""
    return self.task.global_batch_size // self.runtime.num_replicas

  def loop_options(self) -> LoopOptions:
    """How this program's loop is built."""
    return LoopOptions(
      until_exhausted=True, autograph=self.task.autograph, single_step=self.steps_per_loop == 1
    )

  def _step_fn(self, batch: Any):
    raise NotImplementedError

  def _tail_fn(self):
    return None

  def _read_fn(self):
    """How the loop reads a step's batches from its iterator (`LoopBody`'s `read_fn`): None, a distributed one's."""
    return None

  def _trace_iterator(self):
    return self._epoch_iterator if self._epoch_iterator is not None else iter(self.dataset)

  # ----- The input of runs that read the same batches every time (eval, decode) -----

  def _setup_run_input(self, runtime: Runtime) -> None:
    """Finds how many steps one run takes, where that is exact, and then repeats them.

    A run reads the first `num_batches` steps of the split, or all of it.
    Where that number of steps is known (one input pipeline, a split of
    known size that divides into whole steps, or `num_batches` of an endless
    split), the program keeps one iterator over those batches repeated
    forever and each run takes exactly that many steps: no iterator is
    created and torn down per run (about a millisecond each, with
    prefetching). Otherwise each run reads a fresh iterator until the data
    ends.
    """
    self._epoch_iterator, self._epoch_steps = None, None
    if runtime.num_workers != 1:
      return
    replicas = runtime.num_replicas
    context = tf.distribute.InputContext(
      num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas
    )
    batches = int(self.task.dataset(self.split, context).cardinality())
    if batches == tf.data.INFINITE_CARDINALITY and self.num_batches is not None:
      steps = self.num_batches
    elif batches >= 0 and self.num_batches is not None and self.num_batches * replicas <= batches:
      steps = self.num_batches
    elif batches > 0 and batches % replicas == 0:
      steps = batches // replicas
    else:
      return
    self._epoch_steps = steps
    dataset = runtime.distribute_dataset(self.task, self.split, repeat_steps=steps)
    self._epoch_iterator = iter(dataset)

  def _run_input(self) -> tuple[Any, int | None]:
    """(iterator, steps) of one run: the repeated batches, or a fresh iterator read to the end."""
    if self._epoch_iterator is not None:
      return self._epoch_iterator, self._epoch_steps
    with self._failures_named(f"opening its input at step {self.runtime.step()}"):
      return iter(self.dataset), self.num_batches

  def _failures_named(
    self, what: str, splits: list[str] | None = None, step: int | None = None
  ) -> contextlib.AbstractContextManager:
    """An op's error in the block becomes a one-line `RunError` naming this program and `what` it was doing."""
    return named(self, what, splits, step)

  @property
  def trace_count(self) -> int:
    """Most traces of any one of the program's functions: 1 once compiled, and forever after."""
    return max(self.trace_counts.values(), default=0)

  def _count_trace(self, function: str) -> None:
    count = self.trace_counts[function] = self.trace_counts.get(function, 0) + 1
    if count > 1:
      logging.warning("Program %s: function %s was traced again (trace %d)", self.name, function, count)

  def _weights(self) -> contextlib.AbstractContextManager:
    """The weights a run uses: the EMA's with `use_ema`, else the live ones."""
    return self.task.ema.averaged() if self.use_ema else contextlib.nullcontext()

  def _run_until(self, iterator, num_batches: int | None) -> MetricAccumulator:
    """Runs loops over `iterator` until `num_batches` or the data ends."""
    with self._weights():
      return self._run_loops(iterator, num_batches)

  def _run_loops(self, iterator, num_batches: int | None) -> MetricAccumulator:
    acc = MetricAccumulator()
    while num_batches is None or acc.steps < num_batches:
      want = self.steps_per_loop if num_batches is None else min(self.steps_per_loop, num_batches - acc.steps)
      batches = f"{acc.steps + 1}-{acc.steps + want}" if num_batches is not None else f"from {acc.steps + 1}"
      with self._failures_named(
        f"the {self.kind} at step {self.runtime.step()} (batches {batches} of its split)"
      ):
        result = self._loop(iterator, want)
      acc.add(result)
      if result.steps < want:
        break
    return acc

  def _probe_dataset(self) -> tf.data.Dataset:
    """The split's dataset of one input pipeline, to check; the dataset function's ConfigError names this program.

    Raises:
      ConfigError: the task's `dataset` refused the split (no examples, a batch of none, a file missing): naming
        this program, the split and the task.
    """
    try:
      return self.task.dataset(self.split, tf.distribute.InputContext())
    except ConfigError as e:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': split '{self.split}' of task '{self.task.name}': "
        f"{str(e).splitlines()[0]}"
      ) from e

  def _check_not_empty(self, probe: tf.data.Dataset) -> None:
    """A split with no batch at all gives no metric (NaN), and a watcher could act on it."""
    if probe.cardinality() == 0:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': split '{self.split}' of task '{self.task.name}' is empty"
      )

  def _check_finite_split(self, num_batches: int | None) -> None:
    """An infinite split needs `num_batches`, or the program would never end; an empty one is refused."""
    if num_batches is not None:
      if num_batches < 1:
        raise ConfigError(f"{type(self).__name__} '{self.name}': num_batches must be >= 1, got {num_batches}")
      self._check_not_empty(self._probe_dataset())
      return
    probe = self._probe_dataset()
    self._check_not_empty(probe)
    if probe.cardinality() == tf.data.INFINITE_CARDINALITY:
      raise ConfigError(
        f"{type(self).__name__} '{self.name}': split '{self.split}' of task '{self.task.name}' "
        "repeats forever; set num_batches"
      )


def element_spec(task: Task, split: str) -> str:
  """What one batch of `split` holds, as `name: dtype[shape]` (for messages)."""
  try:
    spec = task.dataset(split, tf.distribute.InputContext()).element_spec
  except Exception as e:  # noqa: BLE001  (a message about the data must not fail on the data)
    return f"element spec unknown: {type(e).__name__}"
  return describe_spec(spec)
