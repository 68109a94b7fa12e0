"""What `serving_default` of a `Task` takes: the batch fields its predictions read, never a label passed through.

A decode step gets the whole batch (features and labels) and often passes fields through into its records (the
label, an example index). A serving signature takes the model's inputs alone, so the decode step is traced once on
every field of the batch and each of its outputs is traced back to the fields it reads:

- an output that is a field passed through unchanged (the caller has it) is left out;
- the signature takes `Task.serving_inputs` when the task declares them, else the fields the other outputs read;
- an output that reads a field the signature does not take is left out.

The fields left out are fed zeros of their shape, which no output left in reads. A declared field that is not in
the batch, or a signature left with no input or no output, is refused with one line naming what to declare.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from programs.core.errors import ConfigError
from programs.core.signatures import ServingFn, identifier, signature_function

ConcreteFunction = tf.types.experimental.ConcreteFunction


def fields_read(function: ConcreteFunction, names: Sequence[str]) -> dict[str, set[str]]:
  """`{output: the argument names it depends on}` of a concrete function `signature_function` made.

  A walk back over the graph from each output through every op's inputs and control inputs. An op of control flow
  or a call takes everything its body captures as inputs, so a field may be counted that an output does not
  really read, never the other way round.
  """
  arguments = {t.ref(): name for t, name in zip(function.graph.inputs, names)}
  reads = {}
  for output, tensor in function.structured_outputs.items():
    found, seen, stack = set(), set(), [tensor.op]
    while stack:
      op = stack.pop()
      if op.name in seen:
        continue
      seen.add(op.name)
      for t in op.inputs:
        if t.ref() in arguments:
          found.add(arguments[t.ref()])
        stack.append(t.op)
      stack.extend(op.control_inputs)
    reads[output] = found
  return reads


def passed_through(function: ConcreteFunction, names: Sequence[str]) -> set[str]:
  """The outputs of a concrete function `signature_function` made that are one of its arguments unchanged."""
  arguments = {t.ref() for t in function.graph.inputs[: len(names)]}
  out = set()
  for output, tensor in function.structured_outputs.items():
    while tensor.op.type == "Identity":
      tensor = tensor.op.inputs[0]
    if tensor.ref() in arguments:
      out.add(output)
  return out


def serving_default(
  fn: ServingFn, spec: Any, names: Sequence[str], declared: Sequence[str] | None, where: str
) -> ConcreteFunction:
  """`fn` over the batch fields it serves (see the module docstring), returning the outputs it can serve.

  Args:
    fn: The task's serving function (its `decode_step` by default): a batch in, `{name: tensor}` out.
    spec: The element spec of the batches, with a polymorphic batch dimension.
    names: The signature name of each leaf of `spec` (`signatures.input_names`).
    declared: `Task.serving_inputs`, or None: the fields read by the outputs that are not passed through.
    where: Names the task and split in messages, e.g. "task 'spirals_classifier' (split 'test')".

  Raises:
    ConfigError: a declared field is not in the batch; no field or no output is left to serve.
  """
  full = signature_function(fn, spec, names)
  reads = fields_read(full, names)
  computed = [o for o in reads if o not in passed_through(full, names)]
  fields = ", ".join(names)
  if declared is not None:
    unknown = [f for f in declared if f not in names]
    if unknown:
      raise ConfigError(
        f"{where}: serving_inputs names {', '.join(map(repr, unknown))}, not a field of its batches ({fields})"
      )
    served = [n for n in names if n in declared]
  else:
    wanted = set().union(*(reads[o] for o in computed))
    served = [n for n in names if n in wanted]
  outputs = [o for o in computed if reads[o] <= set(served)]
  if not served or not outputs:
    read = sorted(set().union(*(reads[o] for o in computed)))
    why = (
      f"{', '.join(computed)} read {', '.join(read)}"
      if read
      else "its outputs pass fields through or read none"
    )
    raise ConfigError(
      f"{where}: serving_default has no output to serve from {', '.join(served) or 'no field'} ({why}); set "
      f"serving_inputs to the fields of the batch ({fields}) its predictions read, or override serving_functions"
    )
  logging.info(
    "%s: serving_default takes %s and returns %s%s",
    where,
    ", ".join(served),
    ", ".join(outputs),
    f" (left out: {', '.join(sorted(set(reads) - set(outputs)))})" if len(outputs) < len(reads) else "",
  )
  leaves = tf.nest.flatten(spec)
  kept = set(outputs)

  def serve(values):
    given = dict(zip(served, values))
    size = tf.shape(values[0])[0]
    batch = [given[n] if n in given else _zeros(s, size) for n, s in zip(names, leaves)]
    return {k: v for k, v in fn(tf.nest.pack_sequence_as(spec, batch)).items() if identifier(k) in kept}

  return signature_function(serve, [s for n, s in zip(names, leaves) if n in served], served)


def _zeros(spec: tf.TensorSpec, batch_size: tf.Tensor) -> tf.Tensor:
  """Zeros in place of a field the signature does not take (read by no output it returns)."""
  shape = [batch_size, *[d if d is not None else 0 for d in spec.shape[1:]]]
  return tf.zeros(tf.stack(shape), spec.dtype)
