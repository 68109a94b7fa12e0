"""EvalProgram: weighted-mean metrics over the same batches every run."""

from __future__ import annotations

import time

import gin
from absl import logging

from programs.core.errors import ConfigError, check_value
from programs.core.results import MetricsText, ProgramResult
from programs.core.task import Task
from programs.program import Program


class SplitProgram(Program):
  """A program that makes one pass over a split (or its first `num_batches` batches) per run: eval and decode.

  Not configurable itself, so that bindings of one of its configurable subclasses never reach another.
  """

  def __init__(
    self,
    task: Task,
    split: str = "test",
    num_batches: int | None = None,
    steps_per_loop: int = 100,
    use_ema: bool = False,
    trigger_interval: int = 1,
    trigger_offset: int = 0,
    name: str | None = None,
  ):
    """Configures the program.

    Args:
      task: The task.
      split: The split to read; must be finite if `num_batches` is None.
      num_batches: Batches per run; None runs until the split ends.
      steps_per_loop: Steps per compiled call.
      use_ema: Run on the exponential moving average of the weights
        (`Task.ema_decay`) instead of the live weights.
      trigger_interval: Run in every this many schedule cycles.
      trigger_offset: ... in the cycles whose index modulo `trigger_interval`
        is this (cycles count from 0 across restarts).
      name: Summary folder name; defaults to `<kind>_<split>`.
    """
    super().__init__(task, split, steps_per_loop, name)
    check_value(
      f"{type(self).__name__} '{self.name}': num_batches", num_batches, integer=True, minimum=1, optional=True
    )
    self.num_batches = num_batches
    self.use_ema = use_ema
    self._set_trigger(trigger_interval, trigger_offset)

  def validate(self, runtime):
    super().validate(runtime)
    self._check_finite_split(self.num_batches)


@gin.configurable
class EvalProgram(SplitProgram):
  """Evaluates the task on a split: `num_batches` batches, or until it ends.

  Every run reads the same batches from the start of the split (one iterator
  over them, repeated, where their number is known; else a fresh iterator per
  run); the metrics are weighted means over all of them, whatever
  `steps_per_loop` or the replica count. Writes `eval_<split>/` summaries at
  the current global step.
  """

  kind = "eval"

  def _step_fn(self, batch):
    return self.task.eval_step(batch), {}

  def run(self) -> ProgramResult:
    """Evaluates once at the current global step and writes the summaries."""
    step = self.runtime.step()
    start = time.perf_counter()
    acc = self._run_until(*self._run_input())
    secs = time.perf_counter() - start
    if acc.steps == 0:  # Its size was not known before (a filtered split): refused at the first run.
      raise ConfigError(
        f"EvalProgram '{self.name}': split '{self.split}' of task '{self.task.name}' is empty"
      )
    metrics = self.task.reduce_metrics(acc.sums, acc.weights)
    self.writer.scalars({**metrics, "examples/sec": acc.steps * self.task.global_batch_size / secs}, step)
    logging.info("%s step %d: %s", self.name, step, MetricsText(metrics))
    return ProgramResult(step=step, steps=acc.steps, metrics=metrics, per_example={}, secs=secs)
