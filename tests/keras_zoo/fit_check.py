"""`fit` beside the executor: the same model, initial weights (and RNG seeds), batches in the same order and steps.

The executor's side is built from the model's gin file as the `executor` command builds it (in this process): the
task, runtime (precision) and programs its bindings say. The batches are those the train program reads: the
runtime's distributed train split, read again from its start under the same input seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_zoo import ZooModel

TESTS = Path(__file__).resolve().parent.parent


def executor_of(model: ZooModel, model_dir: Path, params: list[str] | None = None):
  """The `Executor` the model's gin file (and `params`) makes, its runtime built and its train and eval programs
  prepared."""
  from executor.cli.config import parse_config
  from executor.executor import Executor

  parse_config([str(model.gin_file)], [*model.params, *(params or [])], [str(TESTS)], [])
  executor = Executor(str(model_dir))
  executor.runtime.build(executor.tasks)
  train = executor.schedule.train_program
  evaluate = next(p for p in executor.schedule.eval_programs if p.kind == "eval")
  for program in (train, evaluate):
    program.prepare(executor.runtime, str(model_dir))
  return executor, executor.tasks[0], train, evaluate


def train_batches(executor, task, steps: int) -> list[Any]:
  """The first `steps` batches of the train split, as the train program reads them (numpy)."""
  iterator = iter(executor.runtime.distribute_dataset(task, task.train_split))
  return [tf.nest.map_structure(lambda t: t.numpy(), next(iterator)) for _ in range(steps)]


def as_dataset(batches: list[Any]) -> tf.data.Dataset:
  """A dataset whose elements are `batches`, in order."""
  stacked = tf.nest.map_structure(lambda *parts: np.stack(parts), *batches)
  return tf.data.Dataset.from_tensor_slices(stacked)


def keras_copy(task, precision: str) -> keras.Model:
  """A fresh model of `task.model_fn` (no strategy, the run's dtype policy), holding the task model's variables:
  weights, non-trainable state and the RNG seeds of its layers."""
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(precision)
  try:
    model = task.model_fn()
  finally:
    keras.config.set_dtype_policy(previous)
  copy_variables(task.model, model)
  return model


def copy_variables(source: keras.Model, target: keras.Model) -> None:
  """Assigns `source`'s variables (seed generators included) to `target`'s, in order (two models of one
  `model_fn` list them in the same order; their paths differ by Keras' name counters)."""
  pairs = list(zip(source.variables, target.variables))
  assert len(source.variables) == len(target.variables) and all(
    a.shape == b.shape and a.dtype == b.dtype for a, b in pairs
  ), "the two models' variables differ"
  for theirs, ours in pairs:
    ours.assign(theirs.numpy())


def paired_values(
  ours: keras.Model, theirs: keras.Model
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """The two models' variable values, both keyed by `ours`' paths (paired in order: see `copy_variables`)."""
  names = [v.path for v in ours.variables]
  return (
    dict(zip(names, (v.numpy() for v in ours.variables))),
    dict(zip(names, (v.numpy() for v in theirs.variables))),
  )


def differences(
  ours: Mapping[str, Any], theirs: Mapping[str, Any], rel: float, abs_tol: float = 1e-6
) -> list[str]:
  """Names missing on either side, then values that differ beyond the tolerance (one line each)."""
  lines = [f"{k}: only the executor's" for k in sorted(ours.keys() - theirs.keys())]
  lines += [f"{k}: only fit's" for k in sorted(theirs.keys() - ours.keys())]
  for key in sorted(ours.keys() & theirs.keys()):
    a, b = np.asarray(ours[key], np.float64), np.asarray(theirs[key], np.float64)
    if a.shape != b.shape:
      lines.append(f"{key}: shape {a.shape} vs {b.shape}")
    elif not np.allclose(a, b, rtol=rel, atol=abs_tol):
      gap = np.max(np.abs(a - b))
      lines.append(f"{key}: executor {_show(a)} vs fit {_show(b)} (max |difference| {gap:.3g})")
  return lines


def _show(value: np.ndarray) -> str:
  return f"{float(value.reshape(())):.6g}" if value.size == 1 else f"array{list(value.shape)}"
