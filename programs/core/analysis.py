"""The model analysis: parameters per variable, totals, bytes."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import tensorflow as tf


def variable_name(variable: tf.Variable) -> str:
  """A readable, stable name: the Keras path when there is one."""
  return getattr(variable, "path", None) or variable.name.split(":")[0]


def unique_variables(variables: Iterable[tf.Variable]) -> list[tf.Variable]:
  """`variables` without repeats (shared variables are listed once)."""
  seen, out = set(), []
  for v in variables:
    key = id(getattr(v, "value", v)) if not isinstance(v, tf.Variable) else id(v)
    if key not in seen:
      seen.add(key)
      out.append(v)
  return out


def model_analysis(variables: Iterable[tf.Variable]) -> tuple[str, int]:
  """Returns (report text, total parameters) of `variables`.

  One line per variable (name, shape, dtype, parameters), a subtotal per
  top-level module, the total and the bytes.
  """
  rows, subtotals = [], {}
  total = total_bytes = 0
  for v in sorted(unique_variables(variables), key=variable_name):
    name = variable_name(v)
    shape = tuple(int(d) for d in v.shape)
    count = int(np.prod(shape, dtype=np.int64))
    dtype = tf.as_dtype(v.dtype)
    rows.append((name, str(list(shape)), dtype.name, count))
    module = name.split("/")[0]
    subtotals[module] = subtotals.get(module, 0) + count
    total += count
    total_bytes += count * dtype.size
  width = max([len(r[0]) for r in rows] + [8])
  lines = [f"{'variable':<{width}}  {'shape':<16} {'dtype':<8} {'params':>12}"]
  lines += [f"{n:<{width}}  {s:<16} {d:<8} {c:>12,}" for n, s, d, c in rows]
  lines.append("")
  lines += [f"subtotal {m}: {c:,}" for m, c in sorted(subtotals.items())]
  lines.append(f"total parameters: {total:,}")
  lines.append(f"total bytes: {total_bytes:,}")
  return "\n".join(lines) + "\n", total
