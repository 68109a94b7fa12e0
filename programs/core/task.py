"""The Task contract: the one class a user writes.

A task owns its model, optimizer, data, losses, decoding and host-side
post-processing. Programs call into it; the runtime builds it once under the
distribution strategy's scope.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf

from programs.core.ema import WeightAverage
from programs.core.errors import ConfigError, check_value
from programs.core.export import export_task, flat_metrics
from programs.core.optimizers import OptimizerState, WithoutOptimizer
from programs.core.results import Metrics, PerExample


@gin.configurable
class Task:
  """Base class of every task.

  Subclasses set `self.model` (a `keras.Model` or any `tf.Module`) in `build`
  and implement `dataset`, `compute_loss`, and, where they apply, `eval_step`,
  `decode_step` and `postprocess_decode`. Training needs no step code: the
  train program differentiates `compute_loss` and applies the optimizer, with
  its policy (gradient clipping, non-finite skipping, EMA); a task that needs
  another update overrides `train_step` with plain per-replica code.

  Attributes:
    name: Short identifier, used in logs and summary folders.
    global_batch_size: Examples per step across all replicas.
    model: Set by `build`.
    optimizer: Created by `build` from `optimizer_fn`.
    serving_inputs: The batch fields an export's `serving_default` takes (a class attribute or the constructor
      argument); None: those `decode_step`'s predictions read (see `export`).
  """

  splits: tuple[str, ...] = ()
  serving_inputs: tuple[str, ...] | None = None

  def __init__(
    self,
    name: str | None = None,
    global_batch_size: int = 32,
    optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
    ema_decay: float | None = None,
    autograph: bool = False,
    serving_inputs: Sequence[str] | None = None,
  ):
    """Initialises the task configuration; variables come later, in `build`.

    Args:
      name: Short identifier; defaults to the class name in snake case.
      global_batch_size: Examples per step, summed over all replicas.
      optimizer_fn: Zero-argument callable returning a Keras optimizer, called
        inside the strategy scope (for example `@keras.optimizers.Adam` in gin).
        Defaults to Adam with Keras' default learning rate.
      ema_decay: If set, keep an exponential moving average of the trainable
        weights, updated once per train loop by the train program, after
        `post_training_loop` (so the decay is per loop, not per step); eval
        and decode programs with `use_ema=True` run on it.
      autograph: Convert the task's device code (`train_step`, `eval_step`,
        `decode_step`, `post_training_loop` and what they call) with
        AutoGraph, so that Python `if`, `for` and `while` on tensors become
        graph control flow. Off (the default, as in Keras 3), the code is
        traced as plain Python: use `tf.cond` and `tf.while_loop` for
        control flow on tensors; start-up traces several times faster.
      serving_inputs: The fields of a batch that the `serving_default` signature of an export takes (the
        model's inputs, e.g. `('x',)`); None: the class attribute `serving_inputs`, and when that is None too,
        the fields `decode_step`'s outputs read, leaving out outputs that pass a field through (see `export`).
    """
    if global_batch_size < 1:
      raise ValueError(f"{type(self).__name__}.global_batch_size must be >= 1, got {global_batch_size}")
    self.name = name or _snake_case(type(self).__name__)
    self.global_batch_size = global_batch_size
    check_value(f"{type(self).__name__}.ema_decay", ema_decay, minimum=0, below=1, optional=True)
    self.ema_decay = ema_decay
    self.autograph = autograph
    if serving_inputs is not None:
      if isinstance(serving_inputs, str) or not all(isinstance(f, str) for f in serving_inputs):
        raise ConfigError(
          f"{type(self).__name__}.serving_inputs must be a tuple of batch field names, got {serving_inputs!r}"
        )
      if type(self).export is not Task.export:
        raise ConfigError(
          f"{type(self).__name__}.serving_inputs does not apply: {type(self).__name__}.export decides what its "
          "serving signature takes (a KerasTask serves its model's inputs: name them with keras.Input(name=...))"
        )
      self.serving_inputs = tuple(serving_inputs)
    self.ema: WeightAverage | None = None
    self._optimizer_fn = optimizer_fn or keras.optimizers.Adam
    self.model: Any = None
    self.optimizer: keras.optimizers.Optimizer | None = None

  # ----- Building -----------------------------------------------------------

  def build(self) -> None:
    """Creates the model (and anything else with variables).

    Called exactly once, inside `strategy.scope()`, by the runtime, which then
    creates the optimizer and the weight average (no `super().build()` needed).
    """

  def _build_optimizer_and_ema(self, loss_scale: dict[str, Any] | None = None) -> None:
    """Creates and builds the optimizer and the EMA, so no variable is made in a trace (the runtime calls it).

    With `loss_scale` (float16 compute: `initial_scale` and `dynamic_growth_steps`), the optimizer is wrapped in
    a dynamic `LossScaleOptimizer`; one that already is (as Keras' `compile` makes under the float16 policy)
    takes these settings, so the runtime's hold for every task.
    """
    if self.optimizer is None:
      self.optimizer = self._optimizer_fn()
    if loss_scale is not None:
      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
        self.optimizer.initial_scale = loss_scale["initial_scale"]
        self.optimizer.dynamic_growth_steps = loss_scale["dynamic_growth_steps"]
        if self.optimizer.built:
          self.optimizer.dynamic_scale.assign(loss_scale["initial_scale"])
      else:
        self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer, **loss_scale)
    if self.model is not None and not self.optimizer.built:
      self.optimizer.build(self.trainable_variables)
    if self.ema_decay is not None and self.ema is None:
      self.ema = WeightAverage(self.trainable_variables, self.ema_decay)

  @property
  def trainable_variables(self) -> list[tf.Variable]:
    """The variables the default train step differentiates."""
    return list(self.model.trainable_variables) if self.model is not None else []

  @property
  def variables(self) -> list[tf.Variable]:
    """Every variable of the model (for analysis and checkpoints)."""
    return list(self.model.variables) if self.model is not None else []

  def checkpoint_items(self) -> dict[str, Any]:
    """Trackable objects saved with the run, beyond what the runtime saves.

    The optimizer is saved by name and without its learning rate (`OptimizerState`), so what the configuration
    says (learning rate or schedule, hyperparameters) is what runs after a restore.
    """
    items = {}
    if self.model is not None:
      items["model"] = WithoutOptimizer(self.model)
    if self.optimizer is not None:
      items["optimizer"] = OptimizerState(self.optimizer)
    if self.ema is not None:
      items["ema"] = self.ema
    return items

  # ----- Data -----------------------------------------------------------------

  def dataset(
    self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0
  ) -> tf.data.Dataset:
    """Returns the per-replica batches of `split` for one input pipeline.

    Args:
      split: One of `self.splits`.
      input_context: Says the input pipeline id, the number of pipelines and
        the per-replica batch size (`input_context.get_per_replica_batch_size(
        self.global_batch_size)`); shard by it.
      start_example: Examples of this pipeline's stream already read (a
        resumed train split): start there, in constant time, as
        `array_dataset` does. An override that leaves this
        parameter out resumes from its iterator state, saved in each
        checkpoint, where tf.data can save it (one device, no generator or
        `py_function`); else it is replayed with `skip` (the log says what
        that costs).
    """
    raise NotImplementedError(f"{type(self).__name__} does not implement dataset()")

  # ----- Device steps ---------------------------------------------------------

  def compute_loss(self, batch: Any, training: bool) -> tuple[tf.Tensor, Metrics, PerExample]:
    """Returns (per-replica mean loss, metrics, per-example tensors) of a batch."""
    raise NotImplementedError(f"{type(self).__name__} does not implement compute_loss()")

  def train_step(self, batch: Any) -> tuple[tf.Tensor, Metrics, PerExample]:
    """Your own optimisation step on one replica's batch (optional).

    Not overridden, the train program runs its gradient step over
    `compute_loss` (`programs/train_step.py`) with its policy: clipping
    (`TrainProgram.clip_gradient_norm`) and non-finite skipping. An override
    is plain per-replica code (gradients, `self.optimizer.apply`); the
    program then applies no policy of its own and refuses those settings.

    Returns:
      (loss, metrics, per_example); the program adds `loss` to the metrics
      unless they hold it.
    """
    raise NotImplementedError(f"{type(self).__name__} does not implement train_step()")

  def eval_step(self, batch: Any) -> Metrics:
    """Metrics of one replica's batch, without updating anything."""
    _, metrics, _ = self.compute_loss(batch, training=False)
    return metrics

  def decode_step(self, batch: Any) -> PerExample:
    """Per-example decoder outputs of one replica's batch, on device."""
    raise NotImplementedError(f"{type(self).__name__} does not implement decode_step()")

  def post_training_loop(self) -> None:
    """Tail computation run once after each train loop, on device (none by default).

    The EMA update is the train program's, not this hook's: overrides need
    no `super()` call.
    """

  # ----- Serving --------------------------------------------------------------

  def serving_functions(self) -> dict[str, Callable[[Any], Mapping[str, tf.Tensor]]]:
    """The functions a SavedModel export serves, by signature name; each maps a batch to named tensors.

    The default: `serving_default` is `decode_step`, `score` is `eval_step` as `{name: value, name_weight:
    weight}` (left out when the task cannot compute it). Override to serve something else; what each signature
    takes is said in `export`.
    """
    return {"serving_default": self.decode_step, "score": lambda batch: flat_metrics(self.eval_step(batch))}

  def export(self, directory: str, split: str) -> list[str]:
    """Writes a SavedModel of the task's inference to `directory` (which must not exist); returns its signatures.

    `serving_default` takes the model's inputs alone: the fields `serving_inputs` names, or (None) those its
    outputs read; outputs that pass a field through unchanged (a label, an index), or read a field it does not
    take, are left out (`programs/core/serving_inputs.py`). Every other signature (`score`) takes every field of
    the batch, labels included. Each field is one argument, named by a dict batch's keys (nested keys joined by
    `_`), `input_<i>` otherwise.

    Args:
      directory: Where the SavedModel goes.
      split: The split whose batches' element spec, with a polymorphic batch dimension, is the input signature.

    Raises:
      ConfigError: what `serving_default` takes cannot be determined (the message says what to declare).
    """
    return export_task(self, directory, split)

  # ----- Host -----------------------------------------------------------------

  def postprocess_decode(
    self, per_example: Mapping[str, np.ndarray]
  ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Turns decoder outputs into JSON-serialisable records and metrics, on the host."""
    n = len(next(iter(per_example.values()))) if per_example else 0
    records = [{k: _to_json(v[i]) for k, v in per_example.items()} for i in range(n)]
    return records, {}

  def reduce_metrics(self, sums: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, float]:
    """The metrics of a train loop or an eval run, on the host, from what loops and replicas summed.

    Args:
      sums: `sum(value * weight)` of each metric over the steps and replicas (an array for a metric whose
        value is not a scalar).
      weights: `sum(weight)` of each metric.

    Returns:
      `{name: float}`; the default is the weighted means. Override for metrics that are not means: a
      `KerasTask` computes each Keras metric's result from its summed state.
    """
    means = {}
    for name, total in sums.items():
      if np.ndim(total):
        raise ValueError(
          f"task '{self.name}': metric '{name}' is not a scalar (shape {np.shape(total)}); override "
          f"{type(self).__name__}.reduce_metrics to turn it into scalars"
        )
      means[name] = float(total) / weights[name] if weights[name] else float("nan")
    return means

  def learning_rate(self) -> tf.Tensor | None:
    """The optimizer's current learning rate (float32 scalar), or None without an optimizer.

    Read on device, in the train loop's tail, for the `learning_rate` summary.
    """
    if self.optimizer is None:
      return None
    optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
    return tf.cast(optimizer.learning_rate, tf.float32)


def _snake_case(name: str) -> str:
  out = []
  for i, c in enumerate(name):
    if c.isupper() and i and not name[i - 1].isupper():
      out.append("_")
    out.append(c.lower())
  return "".join(out)


def _to_json(value: Any) -> Any:
  if isinstance(value, np.ndarray):
    if value.dtype.kind in "SO":
      return [v.decode() if isinstance(v, bytes) else v for v in value.tolist()]
    return value.tolist()
  if isinstance(value, bytes):
    return value.decode()
  if isinstance(value, np.generic):
    return value.item()
  return value
