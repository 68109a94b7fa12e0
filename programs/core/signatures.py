"""Serving signatures: a function of a batch traced as a concrete function of named tensors.

A SavedModel signature takes keyword arguments and returns a dict of tensors. `signature_function` gives each leaf
of a batch's structure a name (a dict's keys, `input_<i>` otherwise) and traces the function over them, so the
signature's inputs are the batch's field names and its outputs the function's keys.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

ServingFn = Callable[[Any], Mapping[str, tf.Tensor]]


def input_names(spec: Any) -> list[str]:
  """A signature argument name for each leaf of `spec`: a dict's keys, `input_<i>` otherwise."""
  if isinstance(spec, Mapping):
    return [identifier(path) for path in _paths(spec, "")]
  return [f"input_{i}" for i in range(len(tf.nest.flatten(spec)))]


def _paths(structure: Any, prefix: str) -> list[str]:
  """Joined key paths of the leaves of `structure`, in `tf.nest.flatten` order (dict keys sorted)."""
  if isinstance(structure, Mapping):
    return [p for k in sorted(structure) for p in _paths(structure[k], f"{prefix}{k}_")]
  if isinstance(structure, (list, tuple)):
    return [p for i, v in enumerate(structure) for p in _paths(v, f"{prefix}{i}_")]
  return [prefix.rstrip("_")]


def signature_function(
  fn: ServingFn, spec: Any, names: Sequence[str] | None = None
) -> tf.types.experimental.ConcreteFunction:
  """A concrete function of `fn` with one keyword argument per leaf of `spec`, returning a dict of tensors.

  Args:
    fn: Takes a structure like `spec`, returns `{name: tensor}` (names made identifiers: `a/b` is `a_b`).
    spec: The structure of `tf.TensorSpec` the function takes.
    names: The argument name of each leaf of `spec`; `input_names(spec)` when None.
  """
  names = list(names) if names is not None else input_names(spec)

  def serve(*args):
    batch = tf.nest.pack_sequence_as(spec, list(args))
    return {identifier(k): tf.convert_to_tensor(v) for k, v in fn(batch).items()}

  # Positional arguments take their signature names from the specs' names.
  signature = [tf.TensorSpec(s.shape, s.dtype, name=n) for n, s in zip(names, tf.nest.flatten(spec))]
  return tf.function(serve, input_signature=signature, autograph=False).get_concrete_function()


def identifier(name: str) -> str:
  """`name` as a signature key: every character that is not a letter, digit or `_` becomes `_`."""
  return re.sub(r"\W", "_", name).strip("_") or "output"
