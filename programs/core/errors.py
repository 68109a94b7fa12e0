"""Errors the executor raises for bad input, with messages that name the culprit, and the checks of gin values."""

from __future__ import annotations

import math
import numbers


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


class RunError(Exception):
  """An op failed while a program ran: its data (a damaged record, a parse error), its model (an assertion), memory.

  Raised where a program's compiled loop (or its iterator, or its decode post-processing) failed, in place of
  TensorFlow's error (its `__cause__`). The message is one line naming the program, its task and split, the step,
  the op and the reason, and for a damaged record its file and position where they can be known; the CLI prints
  it without a traceback (with one at `--verbosity=1`). Nothing of the failed state is saved: the latest checkpoint
  and every output of its step stay as they were.

  Attributes:
    program: The name of the program that failed.
    step: The global step it started from (the train loop's first step is `step + 1`).
    task: The name of its task.
    splits: The splits it was reading.
    op: The failing op (its node name), when TensorFlow names it.
    reason: What TensorFlow says went wrong, without its decorations.
    record: The damaged record's file and position (or the files it is in), when the error is a damaged record.
  """

  def __init__(
    self,
    message: str,
    program: str | None = None,
    step: int | None = None,
    task: str | None = None,
    splits: tuple[str, ...] = (),
    op: str | None = None,
    reason: str | None = None,
    record: str | None = None,
  ):
    super().__init__(message)
    self.program, self.step, self.task, self.splits = program, step, task, splits
    self.op, self.reason, self.record = op, reason, record
