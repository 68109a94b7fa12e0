"""Errors the executor raises for bad input, with messages that name the culprit, and the checks of gin values."""

from __future__ import annotations

import math
import numbers
import os
import traceback


class ConfigError(ValueError):
  """Bad user input: a gin file, a binding, a path, a split or a value.

  Raised before any state on disk changes. The message names the thing at
  fault; the CLI prints it without a stack trace.
  """


def check_value(
  binding: str,
  value,
  integer: bool = False,
  minimum: float | None = None,
  maximum: float | None = None,
  below: float | None = None,
  above: float | None = None,
  optional: bool = False,
):
  """Returns `value` if it is a number in range, else raises a ConfigError naming the gin binding.

  One check for every numeric gin value: a bool is no number, `40.5` or `1e3` is no integer, NaN is in no range.

  Args:
    binding: The gin binding at fault, e.g. 'Executor.max_steps'.
    value: The value given.
    integer: Whether it must be an integer (a Python or NumPy int, not a float, not a bool).
    minimum: The smallest value allowed.
    maximum: The largest value allowed.
    below: The value must be strictly less than this.
    above: The value must be strictly greater than this.
    optional: None is allowed (and returned).

  Raises:
    ConfigError: naming the binding, what it must be and what it got.
  """
  if value is None and optional:
    return None
  kind = "an integer" if integer else "a number"
  bounds = [f">= {minimum}"] if minimum is not None else []
  bounds += [f"<= {maximum}"] if maximum is not None else []
  bounds += [f"< {below}"] if below is not None else []
  bounds += [f"> {above}"] if above is not None else []
  want = kind + (" " + " and ".join(bounds) if bounds else "") + (" or None" if optional else "")
  ok = isinstance(value, numbers.Integral if integer else numbers.Real) and not isinstance(value, bool)
  if ok:
    ok = (
      not math.isnan(value)
      and (minimum is None or value >= minimum)
      and (maximum is None or value <= maximum)
    )
    ok = ok and (below is None or value < below) and (above is None or value > above)
  if not ok:
    raise ConfigError(f"{binding} must be {want}, got {value!r}")
  return value


def describe_spec(spec) -> str:
  """What an element spec holds, as `element spec name: dtype[shape], ...`, nested names joined by '/'."""
  return "element spec " + ", ".join(
    f"{name}: {s.dtype.name}{s.shape}" if hasattr(s, "dtype") else f"{name}: {s}"
    for name, s in _leaves(spec, "")
  )


def _leaves(spec, path: str) -> list:
  """(path, leaf) of a nested spec: dict keys and tuple indices, joined by '/'."""
  if isinstance(spec, dict):
    items = [(str(k), v) for k, v in spec.items()]
  elif isinstance(spec, (tuple, list)):
    items = [(str(i), s) for i, s in enumerate(spec)]
  else:
    return [(path or "0", spec)]
  return [leaf for key, item in items for leaf in _leaves(item, f"{path}/{key}" if path else key)]


def failing_line(error: BaseException) -> str:
  """'file:line (code)' of the innermost frame of the error outside TensorFlow, Keras and this framework's core.

  A task's own file counts as the user's code, the example tasks' included.
  """
  framework = (f"{os.sep}programs{os.sep}", f"{os.sep}executor{os.sep}")
  frames = traceback.extract_tb(error.__traceback__)
  for frame in reversed(frames):
    name = frame.filename
    if "-packages" in name or name.startswith("<") or os.sep + "python3" in name:
      continue
    if any(part in name for part in framework) and f"{os.sep}tasks{os.sep}" not in name:
      continue
    return f"{name}:{frame.lineno} ({(frame.line or '').strip()})"
  return "an unknown line"
