"""TrainProgram: `steps_per_loop` train steps and the tail computation in one call."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from programs.core.errors import ConfigError, RunError, check_value
from programs.core.metric_writers import program_writer
from programs.core.random_ops import stateful_random_ops
from programs.core.results import LoopResult, MetricsText, ProgramResult
from programs.core.runtime import HostCounter
from programs.core.task import Task
from programs.loop import LoopBody, LoopOptions
from programs.program import Program
from programs.train_input import TrainInput
from programs.train_step import gradient_step

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
    clip_gradient_norm: float | None = None,
    accumulate_steps: int = 1,
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
      clip_gradient_norm: If set, gradients are clipped to this global norm
        (of the global batch's gradient) before the update; the norm before
        clipping is the `grad_norm` metric.
      accumulate_steps: Micro-batches per optimizer update: each replica's
        batch is split into this many, their gradients are summed on device
        and applied once (the update of the whole batch, with one micro-batch
        of activations in memory). The global step counts updates;
        `examples/sec` counts examples.
      name: Summary folder name.
    """
    super().__init__(task, split, steps_per_loop, name)
    if non_finite_policy not in NON_FINITE_POLICIES:
      raise ConfigError(
        f"TrainProgram '{self.name}': non_finite_policy must be one of {', '.join(NON_FINITE_POLICIES)}, "
        f"got {non_finite_policy!r}"
      )
    if clip_gradient_norm is not None and clip_gradient_norm <= 0:
      raise ConfigError(
        f"TrainProgram '{self.name}': clip_gradient_norm must be positive or None, got {clip_gradient_norm}"
      )
    if not isinstance(accumulate_steps, int) or accumulate_steps < 1:
      raise ConfigError(
        f"TrainProgram '{self.name}': accumulate_steps must be an integer >= 1, got {accumulate_steps!r}"
      )
    check_value(f"TrainProgram '{self.name}': max_rollbacks", max_rollbacks, integer=True, minimum=0)
    self.accumulate_steps = accumulate_steps
    self.non_finite_policy, self.max_rollbacks = non_finite_policy, max_rollbacks
    self.clip_gradient_norm = clip_gradient_norm
    self.collect_per_example, self.jit_compile = collect_per_example, jit_compile
    self.input_position: tf.Variable | None = None
    self.input: TrainInput | None = None  # Set up with the runtime.

  def loop_options(self) -> LoopOptions:
    return LoopOptions(
      until_exhausted=False,
      collect_per_example=self.collect_per_example,
      jit_compile=self.jit_compile,
      autograph=self.task.autograph,
      single_step=self.steps_per_loop == 1,
    )

  @property
  def task_writes_its_step(self) -> bool:
    """Whether the task writes its own `train_step` (then the program's step policy does not apply)."""
    return self.task.own_train_step is not None

  def validate(self, runtime):
    super().validate(runtime)
    # A split that ends later (its size may be unknown) is caught where it ends, in `run`.
    self._check_not_empty(self._probe_dataset())
    per_update = runtime.num_replicas * self.accumulate_steps
    if self.task.global_batch_size % per_update:
      raise ConfigError(
        f"TrainProgram '{self.name}': the global batch size {self.task.global_batch_size} of task "
        f"'{self.task.name}' does not divide into {runtime.num_replicas} replica(s) x accumulate_steps "
        f"{self.accumulate_steps}"
      )
    if self.task_writes_its_step:
      policy = [
        name
        for name, on in (
          ("clip_gradient_norm", self.clip_gradient_norm is not None),
          ("non_finite_policy='skip'", self.non_finite_policy == "skip"),
          ("accumulate_steps", self.accumulate_steps > 1),
        )
        if on
      ]
      if policy:
        raise ConfigError(
          f"TrainProgram '{self.name}': {' and '.join(policy)} apply to the program's gradient step, but task "
          f"'{self.task.name}' writes its own train_step ({self.task.own_train_step}): implement "
          "them there, or drop the override"
        )
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
    # Examples read from this program's data (over all replicas): where the input resumes after a restart,
    # counted in examples so that a resumed run with another global batch size reads on from the right one.
    self.input_position = runtime.counter(f"{self.name}_input_position")
    # What the saved run used, to say on resume what changed.
    self.saved_batch_size, self.saved_steps_per_loop = HostCounter(), HostCounter()

  def checkpoint_items(self):
    prefix = self.name.replace("/", "_")
    items = {
      f"{prefix}_input_position": self.input_position,
      f"{prefix}_global_batch_size": self.saved_batch_size,
      f"{prefix}_steps_per_loop": self.saved_steps_per_loop,
    }
    items.update(self.input.checkpoint_items(prefix))
    return items

  def setup(self, runtime, model_dir):
    self.runtime = runtime
    self.writer = program_writer(model_dir, self.name, enabled=runtime.is_chief)
    self.input = TrainInput(self.name, self.task, self.split, runtime, self.input_position)

  @property
  def dataset(self):
    """The distributed dataset the train iterator reads."""
    return self.input.dataset

  def reset_input(self) -> None:
    """Restarts the input where `input_position` says (after a rollback's restore)."""
    with self._failures_named(f"reopening its input at example {int(self.input_position.numpy())}"):
      self.input.reset()

  def _trace_iterator(self):
    return self.input.iterator

  def _read_fn(self):
    return self.input.read_fn

  def restored(self) -> None:
    """After a restore: the input reads on from the restored position (the compiled loop takes the new iterator).

    A changed global batch size or `steps_per_loop` is allowed (and logged): the position is in examples.
    """
    for what, saved, now in (
      ("global batch size", self.saved_batch_size, self.task.global_batch_size),
      ("steps_per_loop", self.saved_steps_per_loop, self.steps_per_loop),
    ):
      if saved.value and saved.value != now:
        logging.warning(
          "Program %s: the %s changed from %d to %d on resume; the input reads on from example %d",
          self.name,
          what,
          saved.value,
          now,
          int(self.input_position.numpy()),
        )
      saved.value = now
    with self._failures_named(f"reopening its input at example {int(self.input_position.numpy())}"):
      self.input.restored()

  def loop_body(self, name: str = "loop", on_trace: Callable[[str], None] | None = None) -> LoopBody:
    """The loop over the train step; the log names any stateful random op of the step (see `random_ops`)."""
    body = super().loop_body(name, on_trace)
    ops = stateful_random_ops(body.step_graph)
    if ops:
      logging.warning(
        "Program %s: the train step of task '%s' draws random numbers with stateful op(s) %s, whose position in "
        "their stream no checkpoint holds: a resumed run draws other numbers, so it cannot resume exactly; draw "
        "them with keras.random.*(..., seed=self.seed_generator) (a keras.random.SeedGenerator made in __init__) "
        "or tf.random.stateless_*",
        self.name,
        self.task.name,
        "; ".join(ops[:3]) + (f" (and {len(ops) - 3} more)" if len(ops) > 3 else ""),
      )
    return body

  def _step_fn(self, batch):
    if self.task_writes_its_step:
      loss, metrics, per_example = self.task.train_step(batch)
    else:
      loss, metrics, per_example = gradient_step(
        self.task,
        batch,
        self.clip_gradient_norm,
        skip_non_finite=self.non_finite_policy == "skip",
        accumulate_steps=self.accumulate_steps,
      )
    metrics = dict(metrics)
    # The one place the default `loss` metric is set (a step of the task's own may have no one loss).
    if loss is not None:
      metrics.setdefault("loss", (loss, tf.constant(1.0)))
    return metrics, per_example

  @property
  def watches_weights(self) -> bool:
    """Whether each loop checks the weights are finite ('stop' and 'rollback'; `bench/non_finite.py` prices it)."""
    return self.non_finite_policy != "skip"

  def _tail_fn(self):
    global_step, position, task = self.runtime.global_step, self.input_position, self.task
    batch_size = tf.constant(task.global_batch_size, tf.int64)
    # A finite loss does not promise finite weights (a NaN feature through a ReLU): 'stop' and 'rollback' watch
    # the weights too, once per loop ('skip' checks every gradient before it is applied).
    watch_weights = self.watches_weights

    def tail(steps):
      global_step.assign_add(tf.cast(steps, tf.int64))
      position.assign_add(tf.cast(steps, tf.int64) * batch_size)
      task.post_training_loop()
      if task.ema is not None:
        task.ema.update()
      # Read here, they reach the host with the loop's results: no extra round trip.
      out = {"global_step": tf.identity(global_step)}
      if watch_weights:
        out["weights_finite"] = tf.reduce_all(
          [
            tf.reduce_all(tf.math.is_finite(v))
            for v in task.trainable_variables
            if tf.as_dtype(v.dtype).is_floating
          ]
        )
      learning_rate = task.learning_rate()
      if learning_rate is not None:
        out["learning_rate"] = learning_rate
      if isinstance(task.optimizer, keras.optimizers.LossScaleOptimizer):
        out["loss_scale"] = tf.cast(task.optimizer.dynamic_scale, tf.float32)
      return out

    return tail

  def run(self, num_steps: int | None = None) -> ProgramResult:
    """Runs one train loop of `num_steps` (default `steps_per_loop`) steps."""
    num_steps = self.steps_per_loop if num_steps is None else min(num_steps, self.steps_per_loop)
    if num_steps < 1:
      raise ValueError(f"program '{self.name}': a train loop needs at least one step, got {num_steps}")
    start = time.perf_counter()
    first = self.runtime.step() + 1
    with self._failures_named(f"the train loop of steps {first}-{first + num_steps - 1}"):
      try:
        result = self._loop(self.input.iterator, num_steps)
      except tf.errors.OutOfRangeError:
        ended = f"TrainProgram '{self.name}': {self._ends(f'ended after step {first - 1}')}"
        raise RunError(ended, self.name, first - 1, self.task.name, (self.split,)) from None
    return self._report(result, time.perf_counter() - start)

  def _ends(self, what: str) -> str:
    return (
      f"split '{self.split}' of task '{self.task.name}' {what}; training reads its split without end: repeat it "
      "in the task's dataset (ds.repeat())"
    )

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
    if not bool(result.tail.get("weights_finite", True)):
      raise NonFiniteLossError(
        f"program '{self.name}' of task '{self.task.name}': the weights hold NaN or Inf after the train loop "
        f"ending at step {step} (its loss is {loss}: look at the inputs); the last checkpoint was kept",
        program=self,
      )
    scalars = dict(metrics)
    for name in ("learning_rate", "loss_scale"):
      if name in result.tail:
        scalars[name] = result.tail[name]
    scalars["global_step/sec"] = result.steps / secs
    scalars["examples/sec"] = result.steps * self.task.global_batch_size / secs
    self.writer.scalars(scalars, step)
    logging.info(
      "%s step %d: %s, %.1f steps/s", self.name, step, MetricsText(metrics), scalars["global_step/sec"]
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
