"""Refusing a checkpoint that does not fit the model, before anything is written.

A changed gin (bigger layers, another optimizer, another task) on an existing model_dir would otherwise fail deep
inside a restore, or, worse, fall back to an older checkpoint or a fresh start. The checkpoint's variables are
compared with the model's by their readable names (the checkpoint's `variables/` index), and the optimizers' state
by name (`programs.core.optimizers.optimizer_state`: slots, iterations, loss scale); every difference is listed
with both shapes. Names that differ only in Keras' counters (`dense_8` for the checkpoint's `dense_1`: the model was
built after others in this process) are matched as the restore matches them (`programs.core.saved_names`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from executor.warm_start import item_keys, source_names
from programs.core.analysis import unique_variables, variable_name
from programs.core.errors import ConfigError
from programs.core.optimizers import optimizer_state
from programs.core.saved_names import pair_names


def differences(
  checkpoint_path: str, variables: Sequence[tf.Variable], optimizers: Mapping[str, object] | None = None
) -> list[str]:
  """What differs between a checkpoint and the model: one line per variable (name, checkpoint, model).

  Args:
    checkpoint_path: A checkpoint written by this executor.
    variables: The model variables (as the checkpoint's `variables/` index names them).
    optimizers: `{checkpoint item name: Keras optimizer}`; their state is compared by name.
  """
  shapes = dict(tf.train.list_variables(checkpoint_path))
  dtypes = tf.train.load_checkpoint(checkpoint_path).get_variable_to_dtype_map()
  found = source_names(checkpoint_path)
  lines = []
  model = {variable_name(v): v for v in unique_variables(variables)}
  saved_name = pair_names(model, found)
  for name, v in sorted(model.items()):
    key = found.get(saved_name.get(name, ""))
    if key is None:
      lines.append(f"{name}: not in the checkpoint; model {_describe(v.shape, v.dtype)}")
    elif shapes[key] != list(v.shape) or dtypes[key] != tf.as_dtype(v.dtype).base_dtype:
      lines.append(
        f"{name}: checkpoint {_describe(shapes[key], dtypes[key])}, model {_describe(v.shape, v.dtype)}"
      )
  for name in sorted(set(found) - set(saved_name.values())):
    key = found[name]
    lines.append(f"{name}: checkpoint {_describe(shapes[key], dtypes[key])}, not in the model")
  for item, optimizer in (optimizers or {}).items():
    lines += _optimizer_differences(checkpoint_path, item, optimizer, shapes, dtypes)
  return lines


def _optimizer_differences(
  checkpoint_path: str, item: str, optimizer, shapes: Mapping[str, list[int]], dtypes
) -> list[str]:
  """The optimizer's state (`optimizer_state`) against the checkpoint's `item/<name>`, by name and shape.

  State the checkpoint lacks cannot be restored (a slot of `use_ema`, of gradient accumulation, of another
  optimizer; the loss scale of float16 compute): refused, by name. State only the checkpoint has (a feature
  turned off) is left unread.
  """
  saved = item_keys(checkpoint_path, item)
  if not saved:
    return []  # No optimizer state saved under this name: nothing to restore into it (as before this check).
  what = f"{item} ({type(optimizer).__name__})"
  if {"_variables", "_iterations", "inner_optimizer"} & saved.keys():
    return [
      f"{what}: its state was saved by position (by an earlier release), which cannot be matched by name; "
      "resume this model_dir with that release"
    ]
  lines = []
  state = optimizer_state(optimizer)
  saved_name = pair_names(state, saved)
  for name, v in sorted(state.items()):
    key = saved.get(saved_name.get(name, ""))
    if key is None:
      lines.append(
        f"{what} {name}: not in the checkpoint, so it cannot be restored; model {_describe(v.shape, v.dtype)}"
      )
    elif shapes[key] != list(v.shape) or dtypes[key] != tf.as_dtype(v.dtype).base_dtype:
      lines.append(
        f"{what} {name}: checkpoint {_describe(shapes[key], dtypes[key])}, model {_describe(v.shape, v.dtype)}"
      )
  return lines


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
