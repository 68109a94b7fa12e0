"""Run-level progress in the log, and profiler traces of chosen train loops."""

from __future__ import annotations

import datetime
import logging as std_logging
import os
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from executor.actions import Action, ActionContext
from programs.core.errors import check_value
from programs.core.results import ProgramResult


@gin.configurable
class Progress(Action):
  """An action that logs step / max_steps, throughput, the last loss and an ETA after each train loop.

  The ETA uses the wall-clock rate since this run started (evals, decodes and
  saves included), so it is the time the run will really take. The executor
  runs one unless `Executor.actions` lists one.
  """

  def __init__(self):
    self.start_step = 0
    self.max_steps = 0
    self._start = time.monotonic()

  def start(self, context: ActionContext) -> None:
    self.start_step, self.max_steps = context.step, context.max_steps
    self._start = time.monotonic()

  def line(self, result: ProgramResult) -> str:
    """The progress line after the train loop that produced `result`."""
    step = result.step
    rate = result.steps / result.secs if result.secs else 0.0
    elapsed = time.monotonic() - self._start
    done = step - self.start_step
    eta = (self.max_steps - step) * elapsed / done if done > 0 else float("inf")
    eta_text = str(datetime.timedelta(seconds=round(eta))) if eta != float("inf") else "unknown"
    return (
      f"Progress: step {step}/{self.max_steps} ({100.0 * step / max(self.max_steps, 1):.1f}%) | "
      f"{rate:.1f} steps/s | {result.examples / result.secs if result.secs else 0.0:.1f} examples/s | "
      f"{_losses(result.metrics)}ETA {eta_text}"
    )

  def after_train_loop(self, result: ProgramResult) -> None:
    """Writes the progress line to the absl log."""
    if logging.get_absl_logger().isEnabledFor(std_logging.INFO):  # The line is made only to be written.
      logging.info("%s", self.line(result))


def _losses(metrics) -> str:
  """The losses of a progress line: `loss X | `, else its scalar `*loss` metrics, else nothing.

  A step of the task's own may return no one `loss` (a GAN's `d_loss` and `g_loss`).
  """
  if "loss" in metrics:
    return f"loss {float(metrics['loss']):.5g} | "
  losses = [(k, v) for k, v in metrics.items() if k.endswith("loss") and np.size(v) == 1]
  return " ".join(f"{k} {float(np.reshape(v, ())):.5g}" for k, v in losses) + " | " if losses else ""


@gin.configurable
class Profiler(Action):
  """An action that captures a TensorFlow profiler trace of chosen train loops into model_dir.

  The trace starts before the first cycle whose global step is at least
  `start_step` and stops after `num_loops` train loops; TensorBoard's profile
  tab shows it (`model_dir/plugins/profile/...`).
  """

  def __init__(self, start_step: int = 0, num_loops: int = 1):
    """Chooses what to profile.

    Args:
      start_step: Global step from which to profile.
      num_loops: Train loops in the trace.
    """
    check_value("Profiler.start_step", start_step, integer=True, minimum=0)
    check_value("Profiler.num_loops", num_loops, integer=True, minimum=1)
    self.start_step = start_step
    self.num_loops = num_loops
    self._logdir: str | None = None
    self._is_chief = True
    self._loops = 0
    self.state = "waiting"

  def start(self, context: ActionContext) -> None:
    self._logdir, self._is_chief = context.model_dir, context.is_chief

  def before_cycle(self, step: int) -> None:
    """Starts the trace if it is due (on the chief)."""
    if self._is_chief and self.state == "waiting" and step >= self.start_step:
      tf.profiler.experimental.start(self._logdir)
      self.state = "tracing"
      logging.info("Profiling %d train loop(s) from step %d", self.num_loops, step)

  def after_train_loop(self, result: ProgramResult) -> None:
    """Counts a traced loop; stops the trace after `num_loops`."""
    if self.state == "tracing":
      self._loops += 1
      if self._loops >= self.num_loops:
        self.close()

  def close(self) -> None:
    """Stops the trace (if one runs) and writes it."""
    if self.state == "tracing":
      tf.profiler.experimental.stop()
      self.state = "done"
      logging.info("Profile written to %s", os.path.join(self._logdir, "plugins", "profile"))
