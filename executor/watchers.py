"""Watching an eval or decode metric: early stopping and the best checkpoints."""

from __future__ import annotations

import json
import math
import os

import gin
import tensorflow as tf
from absl import logging

from executor.actions import Action, ActionContext
from executor.model_dir import check_directories
from executor.schedule import CycleResult
from programs.core.errors import ConfigError, check_value
from programs.core.files import atomic_write


class _MetricWatch:
  """Reads one metric of one program after each cycle and compares values."""

  def __init__(self, program: str, metric: str, mode: str, owner: str):
    if mode not in ("min", "max"):
      raise ConfigError(f"{owner}.mode must be 'min' or 'max', got {mode!r}")
    self.program, self.metric, self.mode, self.owner = program, metric, mode, owner

  def check(self, program_names: list[str]) -> None:
    """Fails unless the watched program is in the schedule."""
    if self.program not in program_names:
      raise ConfigError(
        f"{self.owner}.program '{self.program}' is not a program of the schedule (it has: {', '.join(program_names)})"
      )

  def check_metric(self, metric_names) -> None:
    """Fails unless the watched program returns the metric (where its names are known before a run)."""
    names = metric_names.get(self.program)
    if names is not None and self.metric not in names:
      raise self._unknown(names)

  def _unknown(self, names) -> ConfigError:
    return ConfigError(
      f"{self.owner}.metric '{self.metric}' is not a metric of program '{self.program}' "
      f"(it has: {', '.join(sorted(names))})"
    )

  def value(self, cycle: CycleResult) -> float | None:
    """The metric's value this cycle, or None if the program did not run."""
    metrics = cycle.metrics(self.program)
    if metrics is None:
      return None
    if self.metric not in metrics:
      raise self._unknown(metrics)
    return metrics[self.metric]

  def better(self, value: float, than: float, min_delta: float = 0.0) -> bool:
    """Whether `value` improves on `than` by more than `min_delta`."""
    if math.isnan(value):
      return False
    if math.isnan(than) or math.isinf(than):
      return True
    return value < than - min_delta if self.mode == "min" else value > than + min_delta


class EarlyStopping(Action, tf.Module):
  """An action that stops training when an eval or decode metric stops improving.

  Its state (best value, its step, evaluations without improvement) is
  checkpointed, so a resumed run does not forget it.
  """

  def __init__(
    self,
    program: str = "eval_test",
    metric: str = "loss",
    mode: str = "min",
    patience: int = 3,
    min_delta: float = 0.0,
  ):
    """Configures the rule.

    Args:
      program: Name of the eval or decode program whose metric is watched.
      metric: The metric.
      mode: 'min' or 'max': which direction is better.
      patience: Evaluations without an improvement before stopping.
      min_delta: An improvement must exceed this.
    """
    super().__init__(name="early_stopping")
    check_value("EarlyStopping.patience", patience, integer=True, minimum=1)
    check_value("EarlyStopping.min_delta", min_delta, minimum=0)
    self.watch = _MetricWatch(program, metric, mode, "EarlyStopping")
    self.patience, self.min_delta = patience, min_delta
    self.best: tf.Variable | None = None

  def validate(self, program_names):
    self.watch.check(program_names)

  def validate_start(self, model_dir, metric_names):
    self.watch.check_metric(metric_names)

  def checkpoint_items(self):
    if self.best is None:
      self.best = tf.Variable(float("nan"), dtype=tf.float64, trainable=False, name="best")
      self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
      self.bad_evaluations = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_evaluations")
    return {"early_stopping": self}

  def __call__(self, cycle: CycleResult) -> str | None:
    """Takes this cycle's metric; returns why to stop, or None."""
    step = cycle.step
    value = self.watch.value(cycle)
    if value is None:
      return None
    if math.isnan(value):  # No evidence either way (an empty or diverged evaluation): not counted.
      logging.warning(
        "EarlyStopping: %s/%s is NaN at step %d: ignored", self.watch.program, self.watch.metric, step
      )
      return None
    if self.watch.better(value, float(self.best.numpy()), self.min_delta):
      self.best.assign(value)
      self.best_step.assign(step)
      self.bad_evaluations.assign(0)
      return None
    self.bad_evaluations.assign_add(1)
    if int(self.bad_evaluations.numpy()) < self.patience:
      return None
    return (
      f"early stopping: {self.watch.program}/{self.watch.metric} has not improved on "
      f"{float(self.best.numpy()):.6g} (step {int(self.best_step.numpy())}) in {self.patience} evaluation(s); "
      f"it is {value:.6g} at step {step}"
    )


def _configurable_by_its_name_alone(cls: type) -> type:
  """Registers `cls` in gin as `Name`, with no module: gin takes an exact name over a partial match.

  So `@EarlyStopping()` stays this action while Keras' callback of the same name is
  `@keras.callbacks.EarlyStopping()` (executor/keras_callbacks.py); with a module, the two would be ambiguous.
  """
  module, cls.__module__ = cls.__module__, None
  try:
    return gin.configurable(cls)
  finally:
    cls.__module__ = module


EarlyStopping = _configurable_by_its_name_alone(EarlyStopping)


@gin.configurable
class BestCheckpoints(Action):
  """An action that keeps the best K checkpoints by an eval or decode metric in `model_dir/best/`.

  `best/best.json` lists them (step, value, path), best first; it is
  rewritten atomically, and a checkpoint leaves the folder only after the
  record no longer names it.
  """

  def __init__(self, program: str = "eval_test", metric: str = "loss", mode: str = "min", keep: int = 3):
    """Configures what is kept.

    Args:
      program: Name of the eval or decode program whose metric ranks checkpoints.
      metric: The metric.
      mode: 'min' or 'max': which direction is better.
      keep: How many checkpoints to keep.
    """
    check_value("BestCheckpoints.keep", keep, integer=True, minimum=1)
    self.watch = _MetricWatch(program, metric, mode, "BestCheckpoints")
    self.keep = keep
    self.directory: str | None = None
    self._context: ActionContext | None = None

  def validate(self, program_names):
    self.watch.check(program_names)

  def validate_start(self, model_dir, metric_names):
    self.watch.check_metric(metric_names)
    self.directory = os.path.join(model_dir, "best")
    check_directories([self.directory])
    self.records()  # A damaged record fails here, before the run writes anything.

  def start(self, context: ActionContext) -> None:
    """Uses `model_dir/best/`."""
    self.directory = os.path.join(context.model_dir, "best")
    self._context = context

  @property
  def record_path(self) -> str:
    """Where the JSON record lives."""
    return os.path.join(self.directory, "best.json")

  def records(self) -> list[dict]:
    """The kept checkpoints, best first.

    Raises:
      ConfigError: the record is not a JSON list of {step, value, path} entries, or an entry's path is not a
        checkpoint name inside `best/` (the record is never trusted to name a file elsewhere).
    """
    if not os.path.lexists(self.record_path):
      return []
    try:
      with open(self.record_path) as f:
        records = json.load(f)
    except (OSError, ValueError) as e:
      raise ConfigError(
        f"BestCheckpoints: '{self.record_path}' is unreadable ({e}): fix or remove it"
      ) from None
    for r in records if isinstance(records, list) else [records]:
      ok = isinstance(r, dict) and isinstance(r.get("step"), int) and isinstance(r.get("value"), (int, float))
      path = r.get("path") if isinstance(r, dict) else None
      if not ok or not isinstance(path, str) or path != os.path.basename(path) or path in ("", ".", ".."):
        raise ConfigError(
          f"BestCheckpoints: '{self.record_path}' holds {r!r}, not a {{step, value, path}} entry of a "
          "checkpoint in its folder (a list is expected): fix or remove it"
        )
    return records

  def kept_steps(self) -> list[int]:
    """The steps of the kept checkpoints (none while the record cannot be read)."""
    if self.directory is None:
      return []
    try:
      return [int(r["step"]) for r in self.records()]
    except (OSError, ValueError, TypeError, KeyError):
      return []

  def __call__(self, cycle: CycleResult) -> None:
    """Keeps this cycle's state as a checkpoint if it ranks among the best (on the chief)."""
    if not self._context.is_chief:
      return None
    step = cycle.step
    value = self.watch.value(cycle)
    if value is None or math.isnan(value):
      return None
    records = [r for r in self.records() if r["step"] != step]
    ranked = sorted(
      records + [{"step": step, "value": value}], key=lambda r: r["value"], reverse=self.watch.mode == "max"
    )
    kept = ranked[: self.keep]
    if all(r["step"] != step for r in kept):
      return None
    os.makedirs(self.directory, exist_ok=True)
    path = self._context.checkpointer.write_copy(os.path.join(self.directory, f"ckpt-{step}"))
    for r in kept:
      if r["step"] == step:
        r["path"] = os.path.basename(path)
    with atomic_write(self.record_path) as f:  # Synced before the rename, like the checkpoints.
      json.dump(kept, f, indent=2)
    for r in records:
      if r not in kept:
        for name in tf.io.gfile.glob(os.path.join(self.directory, f"{r['path']}.*")):
          tf.io.gfile.remove(name)
    logging.info(
      "Kept the checkpoint of step %d in %s (%s %s = %.6g)",
      step,
      self.directory,
      self.watch.program,
      self.watch.metric,
      value,
    )
    return None
