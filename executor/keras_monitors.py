"""The actions Keras callbacks become (`executor/keras_callbacks.py` builds them from `KerasTask.callbacks`).

Each follows its Keras callback's rule (Keras 3, `keras/src/callbacks/*.py`) on the executor's epoch: one
evaluation of the monitored eval program for a `val_<metric>` monitor, one train loop for a train metric. Their
state is saved with the run, so a resumed run counts on where the stopped one was. A NaN value is no evidence
either way and is skipped, as by the executor's `EarlyStopping` (fit counts it as a bad epoch).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from executor.actions import Action, ActionContext
from executor.schedule import CycleResult
from executor.watchers import BestCheckpoints, _MetricWatch
from programs.core.errors import ConfigError
from programs.core.results import ProgramResult
from programs.core.task import Task


class Monitor:
  """What a Keras callback's `monitor` names in the executor: one metric of one program, and its better side.

  Attributes:
    owner: The callback, as error lines name it.
    program: The program whose metric is watched.
    metric: The metric.
    train: Whether it is the train program's (fed after each train loop) rather than an evaluation's.
    auto: Whether the better side is inferred, as Keras' `mode='auto'` does, once the model is built.
    resolved: Whether it was (`resolve`).
    watch: Reads and compares the metric (`executor.watchers`).
  """

  def __init__(self, owner: str, program: str, metric: str, mode: str, train: bool):
    self.owner, self.program, self.metric, self.train = owner, program, metric, train
    self.auto, self.resolved = mode == "auto", False
    self.watch = _MetricWatch(program, metric, "min" if self.auto else mode, owner)

  @property
  def mode(self) -> str:
    """'min' or 'max' (inferred for `mode='auto'` once `resolve` ran)."""
    return self.watch.mode

  def resolve(self, metric_names: Mapping[str, set[str] | None], model) -> None:
    """Checks the program returns the metric and infers the better side for `mode='auto'`, as Keras does.

    Raises:
      ConfigError: the program has no such metric, or `mode='auto'` cannot tell which side is better.
    """
    names = metric_names.get(self.program)
    if names is not None and self.metric not in names:
      raise ConfigError(
        f"{self.owner}: '{self.metric}' is not a metric of program '{self.program}' "
        f"(it has: {', '.join(sorted(names))})"
      )
    if not self.auto:
      return
    direction = "down" if self.metric == "loss" else None
    for metric in getattr(model, "metrics", []):
      for inner in [metric, *(getattr(metric, "metrics", None) or [])]:
        if inner.name == self.metric and hasattr(inner, "_direction"):
          direction = inner._direction
    if direction is None:
      raise ConfigError(
        f"{self.owner}: mode='auto' cannot tell whether '{self.metric}' is better high or low: "
        "pass mode='min' or mode='max'"
      )
    self.watch.mode = "max" if direction == "up" else "min"
    self.resolved = True

  def describe(self) -> str:
    """`program/metric (min)`, `(max)`, or `(auto)` until `resolve` infers the side."""
    return f"{self.program}/{self.metric} ({'auto' if self.auto and not self.resolved else self.mode})"


def keras_weights(task: Task) -> list:
  """What Keras' `model.get_weights()` covers: the model's weights, trainable or not (no optimizer state)."""
  return list(task.model.weights)


class MonitoredCallback(Action):
  """An action fed the monitored value once per epoch: after each evaluation, or after each train loop.

  Subclasses implement `observe(value, step)` (returning why to stop, or None) and `state_variables()`.
  A stop found after a train loop is returned at the end of its cycle (the executor stops between cycles);
  values after it in that cycle are not observed.

  Attributes:
    key: The name of its state in the checkpoint.
  """

  def __init__(self, monitor: Monitor, key: str, line: Callable[[], str], task: Task):
    self.monitor, self.key, self._line, self.task = monitor, key, line, task
    self.state: tf.Module | None = None
    self._pending: str | None = None
    self._context: ActionContext | None = None

  @property
  def keras_callback(self) -> str:
    """The line that says what the callback became (logged at start, shown by `--dry_run`)."""
    return self._line()

  def validate(self, program_names: Sequence[str]) -> None:
    self.monitor.watch.check(list(program_names))

  def validate_start(self, model_dir, metric_names):
    self.monitor.resolve(metric_names, self.task.model)

  def state_variables(self) -> dict[str, tf.Variable | list[tf.Variable]]:
    """The action's state, created before the restore."""
    raise NotImplementedError

  def checkpoint_items(self):
    if self.state is None:
      self.state = tf.Module(name=self.key)
      for name, value in self.state_variables().items():
        setattr(self.state, name, value)
    return {self.key: self.state}

  def start(self, context: ActionContext) -> None:
    self._context = context
    logging.info("%s", self.keras_callback)

  def before_cycle(self, step: int) -> None:
    self._pending = None  # A stop found in loops a rollback undid is forgotten with them.

  def after_train_loop(self, result: ProgramResult) -> None:
    if self.monitor.train and self._pending is None:
      if self.monitor.metric not in result.metrics:
        raise self.monitor.watch._unknown(result.metrics)
      self._pending = self._observe(result.metrics[self.monitor.metric], result.step)

  def __call__(self, cycle: CycleResult) -> str | None:
    if not self.monitor.train and self._pending is None:
      value = self.monitor.watch.value(cycle)
      if value is not None:
        self._pending = self._observe(value, cycle.step)
    reason, self._pending = self._pending, None
    return self.end_of_cycle(cycle, reason)

  def _observe(self, value: float, step: int) -> str | None:
    if math.isnan(value):
      logging.warning("%s: %s is NaN at step %d: skipped", self.monitor.owner, self.monitor.describe(), step)
      return None
    return self.observe(value, step)

  def observe(self, value: float, step: int) -> str | None:
    """Takes one epoch's value; returns why training should stop, or None."""
    raise NotImplementedError

  def end_of_cycle(self, cycle: CycleResult, reason: str | None) -> str | None:
    """Called at the end of each cycle with the stop reason found in it; returns the reason to stop."""
    return reason


class KerasEarlyStopping(MonitoredCallback):
  """`keras.callbacks.EarlyStopping`'s rule, on the executor's epochs.

  `patience`, `min_delta`, `baseline` and `start_from_epoch` as in Keras; `restore_best_weights`: the model's weights
  of the best epoch are kept with the run's state and put back when training ends at `max_steps` or by this rule (a
  run stopped by a signal or another rule keeps its last weights, so a restart resumes it).
  """

  def __init__(
    self,
    monitor: Monitor,
    key: str,
    line: Callable[[], str],
    task: Task,
    patience: int,
    min_delta: float,
    baseline: float | None,
    restore_best_weights: bool,
    start_from_epoch: int,
  ):
    super().__init__(monitor, key, line, task)
    self.patience, self.min_delta, self.baseline = patience, abs(min_delta), baseline
    self.restore_best_weights, self.start_from_epoch = restore_best_weights, start_from_epoch
    self._restore_due = False

  def state_variables(self):
    state = {
      "best": tf.Variable(float("nan"), dtype=tf.float64, trainable=False, name="best"),
      "best_step": tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step"),
      "wait": tf.Variable(0, dtype=tf.int64, trainable=False, name="wait"),
      "epochs": tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs"),
    }
    if (
      self.restore_best_weights
    ):  # A copy of the weights, saved with the run: a resumed run restores them too.
      state["has_best_weights"] = tf.Variable(False, trainable=False, name="has_best_weights")
      state["best_weights"] = [
        tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False, name="best_weight")
        for w in keras_weights(self.task)
      ]
    return state

  def _keep_weights(self) -> None:
    for copy, weight in zip(self.state.best_weights, keras_weights(self.task)):
      copy.assign(weight.value)
    self.state.has_best_weights.assign(True)

  def observe(self, value, step):
    s, better = self.state, self.monitor.watch.better
    epoch = int(s.epochs.numpy())
    s.epochs.assign_add(1)
    if epoch < self.start_from_epoch:
      return None
    if self.restore_best_weights and not bool(s.has_best_weights.numpy()):
      self._keep_weights()
    wait = int(s.wait.numpy()) + 1
    if better(value, float(s.best.numpy()), self.min_delta):
      s.best.assign(value)
      s.best_step.assign(step)
      if self.restore_best_weights:
        self._keep_weights()
      if self.baseline is None or better(value, self.baseline, self.min_delta):
        wait = 0
      s.wait.assign(wait)
      return None
    s.wait.assign(wait)
    if wait < self.patience or epoch == 0:
      return None
    return (
      f"early stopping ({self.monitor.owner}): {self.monitor.program}/{self.monitor.metric} has not improved on "
      f"{float(s.best.numpy()):.6g} (step {int(s.best_step.numpy())}"
      + (f", baseline {self.baseline:.6g}" if self.baseline is not None else "")
      + f") in {wait} epoch(s); it is {value:.6g} at step {step}"
    )

  def end_of_cycle(self, cycle, reason):
    # Training ends after this cycle: the weights go back in `close`, after every action saw this cycle's (a
    # best checkpoint copies them) and before any action's end (an export at the end takes the restored ones).
    self._restore_due = reason is not None or cycle.step >= self._context.max_steps
    return reason

  def close(self) -> None:
    # Called from the run's `finally`: a run that fails or is stopped by a signal keeps its last weights.
    due, self._restore_due = self._restore_due, False
    if self.restore_best_weights and due and sys.exc_info()[0] is None:
      if not bool(self.state.has_best_weights.numpy()):
        return
      for weight, copy in zip(keras_weights(self.task), self.state.best_weights):
        weight.assign(copy)
      logging.info(
        "%s: restored the model's weights of step %d (%s = %.6g): the run ends with them",
        self.monitor.owner,
        int(self.state.best_step.numpy()),
        self.monitor.describe(),
        float(self.state.best.numpy()),
      )


class ReduceLearningRateOnPlateau(MonitoredCallback):
  """`keras.callbacks.ReduceLROnPlateau`'s rule: the learning rate scaled on a plateau of the monitored metric.

  The learning rate times `factor` after `patience` epochs without an improvement of `min_delta`, then `cooldown`
  epochs of rest, never below `min_lr`.

  The reduction so far (the product of the factors applied) is state, saved with the run; the configured learning
  rate stays configuration: after a restore the optimizer runs at `max(configured * reduction, min_lr)`. The
  learning rate must be a number (a variable): a schedule's cannot be set (fit fails on it at the first plateau).
  """

  def __init__(
    self,
    monitor: Monitor,
    key: str,
    line: Callable[[], str],
    task: Task,
    factor: float,
    patience: int,
    min_delta: float,
    cooldown: int,
    min_lr: float,
  ):
    super().__init__(monitor, key, line, task)
    self.factor, self.patience, self.min_delta = factor, patience, abs(min_delta)
    self.cooldown, self.min_lr = cooldown, min_lr
    self.configured: float | None = None

  def _optimizer(self) -> keras.optimizers.Optimizer:
    return getattr(self.task.optimizer, "inner_optimizer", self.task.optimizer)

  def validate_start(self, model_dir, metric_names):
    super().validate_start(model_dir, metric_names)
    optimizer = self._optimizer()
    rate = getattr(optimizer, "_learning_rate", None)
    if not isinstance(rate, keras.Variable):
      what = type(rate).__name__ if optimizer is not None else "no optimizer"
      raise ConfigError(
        f"{self.monitor.owner}: the optimizer's learning rate is {what}, not a number that can be reduced "
        "(fit fails on it at the first plateau): give the optimizer a float learning rate, or drop the callback "
        "and keep the schedule"
      )

  def state_variables(self):
    return {
      "best": tf.Variable(float("nan"), dtype=tf.float64, trainable=False, name="best"),
      "wait": tf.Variable(0, dtype=tf.int64, trainable=False, name="wait"),
      "cooldown": tf.Variable(0, dtype=tf.int64, trainable=False, name="cooldown"),
      "reduction": tf.Variable(1.0, dtype=tf.float64, trainable=False, name="reduction"),
    }

  def start(self, context):
    super().start(context)
    # The optimizer's learning rate is never restored (configuration): here it is the configured one.
    self.configured = float(np.asarray(self._optimizer().learning_rate))
    self._apply()
    reduction = float(self.state.reduction.numpy())
    if reduction != 1.0:
      logging.info(
        "%s: the learning rate is %.6g (the configured %.6g x %.6g, reduced on plateaus so far)",
        self.monitor.owner,
        self.learning_rate(),
        self.configured,
        reduction,
      )

  def learning_rate(self) -> float:
    """The optimizer's learning rate now (float32, as it runs)."""
    return float(np.asarray(self._optimizer().learning_rate))

  def _apply(self) -> None:
    rate = max(self.configured * float(self.state.reduction.numpy()), self.min_lr)
    if float(np.float32(rate)) != self.learning_rate():
      self._optimizer().learning_rate = rate

  def before_cycle(self, step):
    super().before_cycle(step)
    self._apply()  # Also after a rollback, which restores the reduction but never the learning rate.

  def observe(self, value, step):
    s = self.state
    cooldown, wait = int(s.cooldown.numpy()), int(s.wait.numpy())
    if cooldown > 0:
      cooldown, wait = cooldown - 1, 0
    if self.monitor.watch.better(value, float(s.best.numpy()), self.min_delta):
      s.best.assign(value)
      wait = 0
    elif cooldown == 0:
      wait += 1
      if wait >= self.patience and self.learning_rate() > float(np.float32(self.min_lr)):
        s.reduction.assign(s.reduction * self.factor)
        self._apply()
        logging.info(
          "%s: %s has not improved in %d epoch(s): learning rate reduced to %.6g at step %d",
          self.monitor.owner,
          self.monitor.describe(),
          wait,
          self.learning_rate(),
          step,
        )
        cooldown, wait = self.cooldown, 0
    s.cooldown.assign(cooldown)
    s.wait.assign(wait)
    return None


class KerasBestCheckpoints(BestCheckpoints):
  """`keras.callbacks.ModelCheckpoint(save_best_only=True)`: the best checkpoint in `model_dir/best/` (keep 1)."""

  def __init__(self, monitor: Monitor, line: Callable[[], str], task: Task):
    super().__init__(monitor.program, monitor.metric, "min", keep=1)
    self.watch, self.monitor, self._line, self.task = monitor.watch, monitor, line, task

  @property
  def keras_callback(self) -> str:
    """The line that says what the callback became."""
    return self._line()

  def validate_start(self, model_dir, metric_names):
    self.monitor.resolve(metric_names, self.task.model)
    super().validate_start(model_dir, metric_names)

  def start(self, context):
    super().start(context)
    logging.info("%s", self.keras_callback)


class BuiltInCallback(Action):
  """A Keras callback whose work the executor does anyway: logs at start what does it, and where."""

  def __init__(self, keras_callback: str):
    self.keras_callback = keras_callback

  def start(self, context: ActionContext) -> None:
    logging.info("%s", self.keras_callback)
