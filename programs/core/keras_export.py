"""A Keras model as a SavedModel that serves its predictions under the model's own input and output names.

`serving_default` (and `serve`) is the model's call, `training=False`, on its inputs alone, one named argument per
input (what a `KerasTask`'s export writes):

- inputs: a model built on `keras.Input`s (functional or `Sequential`) takes what it was built on: the keys of a
  dict of inputs, else each input's `name`; a model without declared inputs (subclassed) takes the features `x`
  of the exported split's examples: a dict's keys, else `inputs` (`inputs_<i>` for a tuple).
- outputs: a dict output's keys, else the output layer's name (`model.output_names`), each with a batch dimension.

A name Keras made up (`keras_tensor_3`, `dense_7`: it counts the layers made in the process, so it changes from one
process to the next) is no name a client can rely on: an input so named is served as `inputs` (`inputs_<i>`), an
output as `prediction` (`prediction_<i>`), as a decode program names the model's outputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from programs.core.export import absl_level_kept
from programs.core.signatures import identifier, input_names


def serving_structure(model: keras.Model, features: Any) -> tuple[Any, list[str]]:
  """The structure of `tf.TensorSpec` the model is served on (batch dimension None) and each leaf's name.

  Args:
    model: A built model.
    features: The element spec of one example's features `x`, for a model without declared inputs.
  """
  structure = _declared_inputs(model)
  if structure is None:
    spec = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), features)
    if isinstance(spec, Mapping):
      return spec, input_names(spec)
    leaves = tf.nest.flatten(spec)
    return spec, ["inputs"] if len(leaves) == 1 else [f"inputs_{i}" for i in range(len(leaves))]
  spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), structure)
  if isinstance(structure, Mapping):
    return spec, input_names(spec)
  leaves = tf.nest.flatten(structure)
  names = [None if _made_up(t.name, "KerasTensor", "InputLayer") else identifier(t.name) for t in leaves]
  if len(leaves) == 1:
    return spec, [names[0] or "inputs"]
  return spec, [n or f"inputs_{i}" for i, n in enumerate(names)]


def output_names(model: keras.Model, outputs: Any) -> dict[str, Any]:
  """`{name: tensor}` of the model's outputs `outputs`: a dict's keys, else the output layers' own names."""
  if isinstance(outputs, Mapping):
    return {identifier(k): outputs[k] for k in outputs}
  flat = tf.nest.flatten(outputs)
  layers = _output_layers(model)
  names = [
    None if layer is None or _made_up(layer.name, type(layer).__name__) else identifier(layer.name)
    for layer in (layers if len(layers) == len(flat) else [None] * len(flat))
  ]
  if len(flat) == 1:
    return {names[0] or "prediction": flat[0]}
  return {n or f"prediction_{i}": t for i, (n, t) in enumerate(zip(names, flat))}


def export_model(model: keras.Model, directory: str, features: Any) -> list[str]:
  """Writes the model's call as the SavedModel `directory`, with `serve` and `serving_default` endpoints.

  Keras' `ExportArchive` writes it: it tracks the model's variables and the lookup tables of its preprocessing
  layers (`StringLookup`, `IntegerLookup`, ...).

  Returns:
    The signature names written.
  """
  spec, names = serving_structure(model, features)
  leaves = tf.nest.flatten(spec)
  signature = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(leaves, names)]

  def serve(*args):
    return output_names(model, model(tf.nest.pack_sequence_as(spec, list(args)), training=False))

  archive = keras.export.ExportArchive()
  archive.track(model)
  archive.add_endpoint("serve", serve, input_signature=signature)
  with absl_level_kept():
    archive.write_out(directory, verbose=False)
  return ["serve", "serving_default"]


def _declared_inputs(model: keras.Model) -> Any:
  """The dict, list or tensor of `keras.Input`s the model was built on; None for a model without (subclassed).

  A `Sequential` declares its `inputs` but has no `input` until it is called on a symbolic tensor.
  """
  try:
    return model.input
  except (AttributeError, ValueError):
    pass
  try:
    inputs = model.inputs
  except (AttributeError, ValueError):
    return None
  if not inputs:
    return None
  return inputs[0] if len(inputs) == 1 else list(inputs)


def _output_layers(model: keras.Model) -> list[Any]:
  """The layer (or op) making each of the model's outputs; [] for a model without declared outputs."""
  try:
    outputs = model.outputs
  except (AttributeError, ValueError):
    return []
  return [getattr(t, "_keras_history", (None,))[0] for t in outputs or []]


def _made_up(name: str, *class_names: str) -> bool:
  """Whether `name` is one Keras generates for an object of one of `class_names` (`dense`, `dense_7`)."""
  for class_name in class_names:
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", class_name)).lower()
    if re.fullmatch(rf"{re.escape(snake)}(_\d+)?", name):
      return True
  return False
