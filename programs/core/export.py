"""A task's inference as a SavedModel: serving signatures over a split's element spec.

The default export of a `Task` (`Task.export` calls `export_task`): `serving_default` runs `decode_step` on the
fields of a split's batches its predictions read (`serving_inputs.serving_default`: never a label it only passes
through), and `score` runs `eval_step` (when the task can compute it) on every field, labels included; both with a
polymorphic batch dimension. The SavedModel needs TensorFlow alone to load and run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import tensorflow as tf

from programs.core import serving_inputs
from programs.core.errors import ConfigError
from programs.core.signatures import ServingFn, input_names, signature_function


class Servable(Protocol):
  """What an export needs of a task (`programs.core.task.Task` is one): its model, data and serving functions."""

  name: str
  model: Any
  serving_inputs: tuple[str, ...] | None

  def dataset(self, split: str, input_context: tf.distribute.InputContext) -> tf.data.Dataset: ...

  def serving_functions(self) -> dict[str, ServingFn]: ...


def batch_spec(task: Servable, split: str) -> Any:
  """The element spec of `split`'s batches, with the batch dimension unknown (None)."""
  context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
  spec = task.dataset(split, context).element_spec
  return tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype), spec)


def flat_metrics(metrics: Mapping[str, Any]) -> dict[str, tf.Tensor]:
  """`{name: (value, weight)}` as `{name: value, name_weight: weight}` (float32 tensors)."""
  out = {}
  for name, (value, weight) in metrics.items():
    out[name] = tf.cast(value, tf.float32)
    out[f"{name}_weight"] = tf.cast(weight, tf.float32)
  return out


def export_task(task: Servable, directory: str, split: str) -> list[str]:
  """Writes the task's `serving_functions` over `split`'s batches as a SavedModel in `directory`.

  `serving_default` takes the fields its predictions read (`serving_inputs.serving_default`); every other
  signature (`score`) takes every field of the batch.

  Returns:
    The signature names written.

  Raises:
    ConfigError: the task has no `decode_step` to serve, or what `serving_default` takes cannot be determined.
  """
  spec = batch_spec(task, split)
  names = input_names(spec)
  where = f"task '{task.name}' (split '{split}')"
  signatures = {}
  for name, fn in task.serving_functions().items():
    try:
      if name == "serving_default":
        signatures[name] = serving_inputs.serving_default(fn, spec, names, task.serving_inputs, where)
      else:
        signatures[name] = signature_function(fn, spec, names)
    except NotImplementedError as e:  # A task without eval_step has no score signature.
      if name == "serving_default":
        raise ConfigError(
          f"{where} cannot be exported: serving_default runs decode_step, and {e}; define decode_step or "
          "override serving_functions"
        ) from None
  module = tf.Module()
  module.model = task.model
  # And what else the signatures read (the LM's sampling generator): a SavedModel holds every variable it uses.
  module.captured = list({v.ref(): v for f in signatures.values() for v in f.variables}.values())
  tf.saved_model.save(module, directory, signatures=signatures)
  return sorted(signatures)
