"""Stateful random ops in a traced step: they draw from a stream whose position no checkpoint holds.

An op such as `RandomUniform` (`tf.random.uniform`, `tf.nn.dropout`, `tf.image.random_flip_left_right`) keeps its
generator's position inside the op's kernel, seeded or not: a restarted process draws its numbers from the start
again, so a resumed run cannot be exact. Stateless ops (`tf.random.stateless_*`, `keras.random.*` with a
`keras.random.SeedGenerator`, whose state is a variable the checkpoint holds) resume exactly; so do the ops of a
`tf.random.Generator` (their state is a variable too) and the input pipeline's own (its state is saved).
`keras.random.*` without `seed=` draws from Keras' global `SeedGenerator`, a variable of no model: listed too.
"""

from __future__ import annotations

import linecache

import tensorflow as tf

from programs.core.errors import is_user_file

# TensorFlow's random ops that keep their state in the kernel (the stateless and `Stateful*` ones do not).
STATEFUL_RANDOM_OPS = frozenset(
  {
    "Multinomial",
    "ParameterizedTruncatedNormal",
    "RandomCrop",
    "RandomGamma",
    "RandomPoisson",
    "RandomPoissonV2",
    "RandomShuffle",
    "RandomStandardNormal",
    "RandomUniform",
    "RandomUniformInt",
    "SampleDistortedBoundingBox",
    "SampleDistortedBoundingBoxV2",
    "TruncatedNormal",
  }
)


def stateful_random_ops(graph: tf.Graph) -> list[str]:
  """What `graph` draws random numbers from that no checkpoint holds.

  Each stateful random op of `graph` and of the functions it calls (`tf.cond`, `tf.while_loop` bodies), and Keras'
  global `SeedGenerator` where `graph` draws from it.

  Returns:
    One description per op: its type and where the user's code made it (`RandomUniform at file:line (code)`),
    or its name in the graph where the trace does not say.
  """
  global_seed = _keras_global_seed_handles()
  found = [
    "keras.random.* without seed= (Keras' global SeedGenerator, no model's state)"
    for captured, _ in graph.captures
    if any(captured is handle for handle in global_seed)
  ][:1]
  pending, seen = [graph], {id(graph)}
  while pending:
    current = pending.pop()
    for op in current.get_operations():
      if op.type in STATEFUL_RANDOM_OPS:
        found.append(f"{op.type} {_where(op)}")
    for function in getattr(current, "_functions", {}).values():
      nested = getattr(function, "graph", None)
      if nested is not None and id(nested) not in seen:
        seen.add(id(nested))
        pending.append(nested)
  return found


def _keras_global_seed_handles() -> list:
  """The variable handles of Keras' global `SeedGenerator` (what `keras.random.*` without `seed=` draws from)."""
  try:
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
  except ImportError:  # Another Keras.
    return []
  generator = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
  if generator is None:
    return []
  variable = getattr(generator.state, "value", generator.state)
  return [getattr(v, "handle", None) for v in getattr(variable, "values", (variable,))]


def _where(op: tf.Operation) -> str:
  """'at file:line (code)' of the innermost frame of the user's code that made `op`, else 'named <op name>'."""
  try:
    frames = list(op.traceback or ())
  except (AttributeError, ValueError):
    frames = []
  for frame in reversed(frames):
    if is_user_file(frame.filename):
      code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
      return f"at {frame.filename}:{frame.lineno} ({code})"
  return f"named '{op.name}'"
