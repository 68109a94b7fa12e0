"""Keras optimizers and learning-rate schedules, made configurable in gin.

Bind a task's optimizer as a factory, e.g.
  MyTask.optimizer_fn = @keras.optimizers.Adam
  keras.optimizers.Adam.learning_rate = 1e-3

A checkpoint holds an optimizer's state by name (`OptimizerState`), never its learning rate: configuration is
configuration, state is state.
"""

from typing import Any

import gin
import keras
import tensorflow as tf

from programs.core.saved_names import NamedChildren

for _cls in (
  keras.optimizers.SGD,
  keras.optimizers.Adam,
  keras.optimizers.AdamW,
  keras.optimizers.Adafactor,
  keras.optimizers.RMSprop,
  keras.optimizers.Lion,
):
  gin.external_configurable(_cls, module="keras.optimizers")

for _cls in (
  keras.optimizers.schedules.CosineDecay,
  keras.optimizers.schedules.ExponentialDecay,
  keras.optimizers.schedules.PiecewiseConstantDecay,
  keras.optimizers.schedules.PolynomialDecay,
  keras.optimizers.schedules.InverseTimeDecay,
  keras.optimizers.schedules.CosineDecayRestarts,
):
  gin.external_configurable(_cls, module="keras.optimizers.schedules")


def optimizer_state(optimizer: keras.optimizers.Optimizer) -> dict[str, keras.Variable]:
  """What a Keras optimizer carries from step to step, by name: its slots, `iteration` and loss-scale state.

  The name is the variable's Keras path without the optimizer's own (process-dependent) name, e.g.
  `mlp_hidden_0_kernel_momentum`; a wrapped optimizer's (a `LossScaleOptimizer`'s) under `inner_optimizer/`.
  Variables Keras names alike (Adafactor names its factors after the model variable's short name, `kernel`)
  are numbered in the optimizer's order (`kernel#1`, ...), which is fixed by the model's. The learning rate is
  configuration, not state: it is left out, so the configured value or schedule runs after a restore.
  """
  inner = getattr(optimizer, "inner_optimizer", None)
  own = optimizer.variables
  if inner is not None:
    own = [v for v in own if not any(v is w for w in inner.variables)]
  learning_rate = getattr(optimizer, "_learning_rate", None)
  state = {}
  for variable in own:
    if variable is learning_rate:
      continue
    name = base = variable.path.split("/", 1)[-1]
    repeat = 1
    while name in state:  # Slots Keras names alike (Adafactor's factors): numbered in the optimizer's order.
      name, repeat = f"{base}#{repeat}", repeat + 1
    state[name] = variable
  if inner is not None:
    state.update({f"inner_optimizer/{k}": v for k, v in optimizer_state(inner).items()})
  return state


class OptimizerState(NamedChildren):
  """A Keras optimizer's state in a checkpoint, each variable under its name (`optimizer_state`).

  Keras saves an optimizer's variables by position, learning rate included, so a schedule (which has no
  learning-rate variable), `use_ema` or gradient accumulation shifts every slot, and a restored learning rate
  overrides the configured one. Saved by name, a checkpoint restores exactly the state and nothing else.
  """

  def __init__(self, optimizer: keras.optimizers.Optimizer):
    """Wraps a built `optimizer`."""
    self.optimizer = optimizer

  def named_children(self) -> dict[str, keras.Variable]:
    return optimizer_state(self.optimizer)


class WithoutOptimizer(tf.__internal__.tracking.Trackable):
  """A trackable (a compiled `keras.Model`) as checkpoints see it, less the optimizer it holds.

  The optimizer is saved once, by name, as an `OptimizerState`; left in a compiled model, it would also be
  saved by position, with its learning rate.
  """

  def __init__(self, trackable: Any):
    """Wraps `trackable`."""
    self.trackable = trackable

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    children = self.trackable._trackable_children(save_type, **kwargs)
    return {k: v for k, v in children.items() if not isinstance(v, keras.optimizers.Optimizer)}
