"""Refusing a checkpoint that does not fit the model, before anything is written.

A changed gin (bigger layers, another optimizer, another task) on an existing model_dir would otherwise fail deep
inside a restore, or, worse, fall back to an older checkpoint or a fresh start. The checkpoint's variables are
compared with the model's by their readable names (the checkpoint's `variables/` index) and the optimizers' slots
by position; every difference is listed with both shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from executor.warm_start import source_names
from programs.core.analysis import unique_variables, variable_name
from programs.core.errors import ConfigError

_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def differences(
  checkpoint_path: str, variables: Sequence[tf.Variable], optimizers: Mapping[str, object] | None = None
) -> list[str]:
  """What differs between a checkpoint and the model: one line per variable (name, checkpoint, model).

  Args:
    checkpoint_path: A checkpoint written by this executor.
    variables: The model variables (as the checkpoint's `variables/` index names them).
    optimizers: `{checkpoint item name: Keras optimizer}`; their slot variables are compared by position.
  """
  shapes = dict(tf.train.list_variables(checkpoint_path))
  dtypes = tf.train.load_checkpoint(checkpoint_path).get_variable_to_dtype_map()
  found = source_names(checkpoint_path)
  lines = []
  model = {variable_name(v): v for v in unique_variables(variables)}
  for name, v in sorted(model.items()):
    key = found.get(name)
    if key is None:
      lines.append(f"{name}: not in the checkpoint; model {_describe(v.shape, v.dtype)}")
    elif shapes[key] != list(v.shape) or dtypes[key] != tf.as_dtype(v.dtype).base_dtype:
      lines.append(
        f"{name}: checkpoint {_describe(shapes[key], dtypes[key])}, model {_describe(v.shape, v.dtype)}"
      )
  for name in sorted(set(found) - set(model)):
    key = found[name]
    lines.append(f"{name}: checkpoint {_describe(shapes[key], dtypes[key])}, not in the model")
  for item, optimizer in (optimizers or {}).items():
    lines += _optimizer_differences(item, optimizer, shapes)
  return lines


def _optimizer_differences(item: str, optimizer, shapes: Mapping[str, list[int]]) -> list[str]:
  prefix = f"{item}/_variables/"
  saved = {
    int(k[len(prefix) : -len(_VALUE)]): s
    for k, s in shapes.items()
    if k.startswith(prefix) and k.endswith(_VALUE)
  }
  # The first two are the step count and the learning rate, saved under their own names.
  mine = {i: list(v.shape) for i, v in enumerate(optimizer.variables) if i >= 2}
  if not saved or saved == mine:
    return []
  return [
    f"{item} ({type(optimizer).__name__}): checkpoint has {len(saved)} slot variable(s) "
    f"{_shapes(saved)}, model has {len(mine)} {_shapes(mine)}"
  ]


def check(
  checkpoint_path: str | None,
  model_dir: str,
  variables: Sequence[tf.Variable],
  optimizers: Mapping[str, object] | None = None,
) -> None:
  """Raises ConfigError listing every difference when `checkpoint_path` does not fit the model.

  A checkpoint that cannot be read is not judged here (the restore skips it with a warning).
  """
  if checkpoint_path is None:
    return
  try:
    lines = differences(checkpoint_path, variables, optimizers)
  except (tf.errors.OpError, ValueError):
    return
  if not lines:
    return
  shown = lines[:20] + ([f"... and {len(lines) - 20} more"] if len(lines) > 20 else [])
  raise ConfigError(
    f"model_dir '{model_dir}' holds checkpoint '{checkpoint_path}', which does not fit this model "
    f"({len(lines)} difference(s): "
    + "; ".join(shown)
    + "). Nothing was changed. To proceed, train in a new --model_dir, or start a new one from this checkpoint "
    "with a warm start and rules (Executor.warm_start = @WarmStart(), WarmStart.checkpoint_path, "
    "WarmStart.rules / WarmStart.ignore)."
  )


def _describe(shape, dtype) -> str:
  return f"{list(shape)} {tf.as_dtype(dtype).name}"


def _shapes(by_index: Mapping[int, list[int]]) -> str:
  return "[" + ", ".join(str(by_index[i]) for i in sorted(by_index)) + "]"
