"""What a `KerasTask` checks of its model and data at start: what `fit` users write that the programs run otherwise.

A model without `call` (keras.io's DCGAN: its `train_step` calls its parts), examples that come batched
(`timeseries_dataset_from_array(batch_size=256)`), and `compile()` arguments the programs decide instead.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from absl import logging

from programs.core.errors import describe_spec


def defines_call(model: keras.Model) -> bool:
  """Whether the model's class has a `call` (functional and `Sequential` models do; keras.io's DCGAN does not)."""
  return type(model).call is not keras.Model.call


def no_call(task_name: str, model: keras.Model, needs: str, instead: str) -> str:
  """The one-line refusal of what needs the model's `call` (`needs`), which its class does not define."""
  return (
    f"KerasTask '{task_name}': {type(model).__name__} defines no call(), which {needs}: define call(), "
    f"or {instead}"
  )


def batched_examples(task_name: str, split: str, model: keras.Model, spec: Any) -> str | None:
  """Why `spec` (a split's element spec) looks batched for `model`, in one line; None where it does not.

  Examples are batched when each input has as many dimensions as the model's input (its batch included) and an
  unknown first one: `KerasTask` batches them again.
  """
  features = spec[0] if isinstance(spec, tuple) else spec
  try:
    inputs = list(model.inputs)
  except (AttributeError, ValueError, TypeError):  # A subclassed model has no inputs to compare with.
    return None
  found = [s for s in tf.nest.flatten(features) if isinstance(s, tf.TensorSpec)]
  if not inputs or len(found) != len(inputs):
    return None
  if not all(
    s.shape.rank == len(i.shape) and s.shape.rank and s.shape[0] is None for s, i in zip(found, inputs)
  ):
    return None
  return (
    f"KerasTask '{task_name}': dataset_fn('{split}') returns batched examples ({describe_spec(spec)}: each has "
    f"the batch dimension of the model's input {tuple(inputs[0].shape)} already); KerasTask batches them itself "
    "by global_batch_size: return unbatched examples (timeseries_dataset_from_array(batch_size=None), or "
    "dataset.unbatch())"
  )


# `compile()` arguments the programs decide, whether a value asks for something they do not do, and what does it.
_PROGRAMS_DECIDE = {
  "jit_compile": (lambda value: value is True, "TrainProgram.jit_compile"),
  "steps_per_execution": (lambda value: value != 1, "TrainProgram.steps_per_loop"),
  "run_eagerly": (lambda value: value is True, "nothing: programs always run traced (tf.function)"),
}


def log_compile_arguments(task_name: str, model: keras.Model) -> None:
  """Logs one line naming the `compile()` arguments given that the programs replace, and what sets them instead.

  `compile` keeps its arguments, `jit_compile='auto'` resolved (to False under a `tf.distribute` strategy).
  """
  config = getattr(getattr(model, "_compile_config", None), "config", None) or {}
  given = {
    name: config[name]
    for name, (asks, _) in _PROGRAMS_DECIDE.items()
    if name in config and asks(config[name])
  }
  if not given:
    return
  logging.warning(
    "KerasTask '%s': compile(%s) is not what runs: the programs decide it (%s)",
    task_name,
    ", ".join(f"{name}={value!r}" for name, value in given.items()),
    "; ".join(f"{name}: {_PROGRAMS_DECIDE[name][1]}" for name in given),
  )
