"""A task's inference as a SavedModel: serving signatures over a split's element spec.

The default export of a `Task` (`Task.export` calls `export_task`): `serving_default` runs `decode_step` and
`score` runs `eval_step` (when the task can compute it), both over the element spec of a split's batches with a
polymorphic batch dimension. The SavedModel needs TensorFlow alone to load and run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import tensorflow as tf

ServingFn = Callable[[Any], Mapping[str, tf.Tensor]]


class Servable(Protocol):
  """What an export needs of a task (`programs.core.task.Task` is one): its model, data and serving functions."""

  model: Any

  def dataset(self, split: str, input_context: tf.distribute.InputContext) -> tf.data.Dataset: ...

  def serving_functions(self) -> dict[str, ServingFn]: ...


def batch_spec(task: Servable, split: str) -> Any:
  """The element spec of `split`'s batches, with the batch dimension unknown (None)."""
  context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
  spec = task.dataset(split, context).element_spec
  return tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype), spec)


def input_names(spec: Any) -> list[str]:
  """A signature argument name for each leaf of `spec`: a dict's keys, `input_<i>` otherwise."""
  if isinstance(spec, Mapping):
    return [_identifier(path) for path in _paths(spec, "")]
  return [f"input_{i}" for i in range(len(tf.nest.flatten(spec)))]


def _paths(structure: Any, prefix: str) -> list[str]:
  """Joined key paths of the leaves of `structure`, in `tf.nest.flatten` order (dict keys sorted)."""
  if isinstance(structure, Mapping):
    return [p for k in sorted(structure) for p in _paths(structure[k], f"{prefix}{k}_")]
  if isinstance(structure, (list, tuple)):
    return [p for i, v in enumerate(structure) for p in _paths(v, f"{prefix}{i}_")]
  return [prefix.rstrip("_")]


def signature_function(fn: ServingFn, spec: Any) -> tf.types.experimental.ConcreteFunction:
  """A concrete function of `fn` with one keyword argument per leaf of `spec`, returning a dict of tensors."""
  names = input_names(spec)
  leaves = tf.nest.flatten(spec)

  def serve(*args):
    batch = tf.nest.pack_sequence_as(spec, list(args))
    return {_identifier(k): tf.convert_to_tensor(v) for k, v in fn(batch).items()}

  # Positional arguments take their signature names from the specs' names.
  signature = [tf.TensorSpec(s.shape, s.dtype, name=n) for n, s in zip(names, leaves)]
  return tf.function(serve, input_signature=signature, autograph=False).get_concrete_function()


def flat_metrics(metrics: Mapping[str, Any]) -> dict[str, tf.Tensor]:
  """`{name: (value, weight)}` as `{name: value, name_weight: weight}` (float32 tensors)."""
  out = {}
  for name, (value, weight) in metrics.items():
    out[name] = tf.cast(value, tf.float32)
    out[f"{name}_weight"] = tf.cast(weight, tf.float32)
  return out


def export_task(task: Servable, directory: str, split: str) -> list[str]:
  """Writes the task's `serving_functions` over `split`'s batches as a SavedModel in `directory`.

  Returns:
    The signature names written.
  """
  spec = batch_spec(task, split)
  signatures = {}
  for name, fn in task.serving_functions().items():
    try:
      signatures[name] = signature_function(fn, spec)
    except NotImplementedError:  # A task without eval_step has no score signature.
      if name == "serving_default":
        raise
  module = tf.Module()
  module.model = task.model
  tf.saved_model.save(module, directory, signatures=signatures)
  return sorted(signatures)


def _identifier(name: str) -> str:
  return re.sub(r"\W", "_", name).strip("_") or "output"
