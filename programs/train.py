"""TrainProgram: `steps_per_loop` train steps and the tail computation in one call."""

from __future__ import annotations

import math
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from core.errors import ConfigError
from core.summaries import SummaryWriter, program_logdir
from core.task import Task
from programs.loop import LoopOptions, LoopResult
from programs.program import Program, ProgramResult, format_metrics

NON_FINITE_POLICIES = ("stop", "skip", "rollback")


class NonFiniteLossError(FloatingPointError):
  """The training loss became NaN or infinite.

  Attributes:
    program: The train program whose loss it was (None when not known).
  """

  def __init__(self, message: str, program: TrainProgram | None = None):
    super().__init__(message)
    self.program = program


@gin.configurable
class TrainProgram(Program):
  """Runs `steps_per_loop` train steps on device, then `task.post_training_loop()`.

  One compiled function per call: the steps in a `tf.range` loop over the
  persistent train iterator, metrics accumulated as loop carries, per-example
  outputs collected, the global step advanced and the tail computation run,
  all before returning to the host. Writes `train/` summaries: `loss`, every
  task metric, `learning_rate`, `global_step/sec` and `examples/sec`.
  """

  kind = "train"

  def __init__(
    self,
    task: Task,
    split: str = "train",
    steps_per_loop: int = 100,
    collect_per_example: bool = True,
    jit_compile: bool | None = None,
    non_finite_policy: str = "stop",
    max_rollbacks: int = 3,
    name: str = "train",
  ):
    """Configures the program.

    Args:
      task: The task to train.
      split: The split to train on.
      steps_per_loop: Train steps per compiled call (one host round trip).
      collect_per_example: Bring the train step's per-example outputs back.
      jit_compile: Compile the train step with XLA (None: TensorFlow's
        default); the loop around it stays a TensorFlow graph (it holds the
        input iterator, which XLA cannot compile).
      non_finite_policy: What a NaN/Inf loss does: 'stop' (raise an error
        naming the program and step; the last good checkpoint stays the
        latest), 'skip' (skip that update on device and count it in
        `skipped_steps`), or 'rollback' (restore the last good checkpoint and
        go on past the batches that diverged, at most `max_rollbacks` times).
      max_rollbacks: Rollbacks allowed in one run before stopping.
      name: Summary folder name.
    """
    super().__init__(task, split, steps_per_loop, name)
    if non_finite_policy not in NON_FINITE_POLICIES:
      raise ConfigError(
        f"TrainProgram '{self.name}': non_finite_policy must be one of {', '.join(NON_FINITE_POLICIES)}, "
        f"got {non_finite_policy!r}"
      )
    self.non_finite_policy = non_finite_policy
    self.max_rollbacks = max_rollbacks
    self.collect_per_example = collect_per_example
    self.jit_compile = jit_compile
    self._iterator = None
    self.input_position: tf.Variable | None = None

  def loop_options(self) -> LoopOptions:
    return LoopOptions(
      until_exhausted=False,
      collect_per_example=self.collect_per_example,
      jit_compile=self.jit_compile,
      autograph=self.task.autograph,
    )

  def validate(self, runtime):
    super().validate(runtime)
    if (
      self.jit_compile
      and runtime.num_replicas > 1
      and not isinstance(runtime.strategy, tf.distribute.TPUStrategy)
    ):
      raise ConfigError(
        f"TrainProgram '{self.name}': jit_compile=True compiles the step of every replica into one XLA "
        f"program, which runs on one device; {type(runtime.strategy).__name__} has {runtime.num_replicas} "
        "replicas on different devices (leave jit_compile unset, or run one replica per process)"
      )

  def build(self, runtime):
    super().build(runtime)
    # Steps taken on this program's data: where the input resumes after a restart.
    self.input_position = runtime.counter(f"{self.name}_input_position")

  def checkpoint_items(self):
    return {f"{self.name.replace('/', '_')}_input_position": self.input_position}

  def setup(self, runtime, model_dir):
    self.runtime = runtime
    self.writer = SummaryWriter(program_logdir(model_dir, self.name), enabled=runtime.is_chief)
    self.reset_input()

  def reset_input(self) -> None:
    """Restarts the input where `input_position` says (after a restore)."""
    position = int(self.input_position.numpy())
    self.dataset = self.runtime.distribute_dataset(self.task, self.split, skip_steps=position)
    self._iterator = iter(self.dataset)

  def _trace_iterator(self):
    return self._iterator

  def _step_fn(self, batch):
    if self.non_finite_policy == "skip":
      loss, metrics, per_example = self.task.train_step(batch, skip_non_finite=True)
    else:
      loss, metrics, per_example = self.task.train_step(batch)
    metrics = dict(metrics)
    metrics.setdefault("loss", (loss, tf.constant(1.0)))
    return metrics, per_example

  def _tail_fn(self):
    global_step, position, task = self.runtime.global_step, self.input_position, self.task

    def tail(steps):
      global_step.assign_add(tf.cast(steps, tf.int64))
      position.assign_add(tf.cast(steps, tf.int64))
      task.post_training_loop()
      # Read here, they reach the host with the loop's results: no extra round trip.
      out = {"global_step": tf.identity(global_step)}
      learning_rate = task.learning_rate()
      if learning_rate is not None:
        out["learning_rate"] = learning_rate
      return out

    return tail

  def run(self, num_steps: int | None = None) -> ProgramResult:
    """Runs one train loop of `num_steps` (default `steps_per_loop`) steps."""
    num_steps = self.steps_per_loop if num_steps is None else min(num_steps, self.steps_per_loop)
    start = time.perf_counter()
    result = self._loop(self._iterator, num_steps)
    return self._report(result, time.perf_counter() - start)

  def _report(self, result: LoopResult, secs: float) -> ProgramResult:
    """Host work after a train loop: checks, summaries, the log line."""
    step = int(result.tail["global_step"])
    self.runtime.note_step(step)
    metrics = self.task.reduce_metrics(result.metric_sums, result.metric_weights)
    if "skipped" in metrics:
      metrics["skipped_steps"] = round(metrics.pop("skipped") * result.steps)
    loss = metrics.get("loss", 0.0)
    if not math.isfinite(loss) and self.non_finite_policy != "skip":
      raise NonFiniteLossError(
        f"program '{self.name}' of task '{self.task.name}': loss is {loss} in the train loop ending "
        f"at step {step}; the last checkpoint was kept",
        program=self,
      )
    scalars = dict(metrics)
    if "learning_rate" in result.tail:
      scalars["learning_rate"] = result.tail["learning_rate"]
    scalars["global_step/sec"] = result.steps / secs
    scalars["examples/sec"] = result.steps * self.task.global_batch_size / secs
    self.writer.scalars(scalars, step)
    logging.info(
      "%s step %d: %s, %.1f steps/s", self.name, step, format_metrics(metrics), scalars["global_step/sec"]
    )
    per_example = result.per_example
    return ProgramResult(
      step=step,
      steps=result.steps,
      metrics=metrics,
      per_example={k: np.asarray(v) for k, v in per_example.items()},
      secs=secs,
      examples=result.steps * self.task.global_batch_size,
    )
