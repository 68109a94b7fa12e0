"""An op that fails while a program runs, as one `RunError` line: program, task, split, step, op, reason, record.

The one place a TensorFlow error of a program's run (its compiled loop, its iterator, its decode post-processing)
becomes a `RunError`: a damaged record, a parse error, an assertion in the model, an out-of-memory. The program
says what it was doing (`what`: "the train loop of steps 41-50"); the error says the op, the reason and the Python
line that made the op; for a damaged record, the split's record files say which file and record it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from programs.core import op_errors, record_damage
from programs.core.errors import RunError

_REASON_CHARS = 400
_FRAMEWORK = (f"{os.sep}programs{os.sep}", f"{os.sep}executor{os.sep}")


@contextlib.contextmanager
def named(
  program: Any, what: str, splits: Sequence[str] | None = None, step: int | None = None
) -> Iterator[None]:
  """Turns an op's error in the block into a `RunError` naming `program` and `what` it was doing.

  Args:
    program: The program that runs (its `name`, `task`, `split` and `runtime` are read).
    what: What it was doing, e.g. "the train loop of steps 41-50".
    splits: The splits it was reading (where a damaged record is looked for); the program's split when None.
    step: The global step it started from; the runtime's step when None.
  """
  try:
    yield
  except tf.errors.OpError as e:
    raise run_error(program, e, what, splits, step) from e


def run_error(
  program: Any,
  error: tf.errors.OpError,
  what: str,
  splits: Sequence[str] | None = None,
  step: int | None = None,
) -> RunError:
  """The `RunError` of `error`, raised while `program` was doing `what` (see `named`)."""
  splits = [program.split] if splits is None else list(splits)
  step = program.runtime.step() if step is None else step
  node = op_errors.failed_node(error)
  pipeline = op_errors.input_pipeline_dataset(error)
  where = f" at op '{node}'" if node else ""
  if pipeline:
    where += f" in the input pipeline's {pipeline}"
  elif node and node.endswith(("IteratorGetNext", "IteratorGetNextAsOptional")):
    where += " reading the input"
  line = user_line(op_errors.defined_at(error))
  if line:
    where += f" (made at {line})"
  reason = op_errors.op_message(error)
  if len(reason) > _REASON_CHARS:
    reason = reason[:_REASON_CHARS] + "..."
  offset = op_errors.damaged_record_offset(error)
  record = None if offset is None else _damaged_record(program, splits, offset)
  read = ("splits " if len(splits) > 1 else "split ") + " and ".join(f"'{s}'" for s in splits)
  message = (
    f"{type(program).__name__} '{program.name}': {read} of task '{program.task.name}' failed in {what}"
    f"{where}: {type(error).__name__}: {reason}" + (f"; {record}" if record else "")
  )
  return RunError(message, program.name, step, program.task.name, tuple(splits), node, reason, record)


def _damaged_record(program: Any, splits: Sequence[str], offset: int) -> str:
  """Which file and record of `splits` is damaged at `offset`, or as much of it as is known."""
  sources = []
  for split in splits:
    try:
      source = record_damage.tagged(program.task.dataset(split, tf.distribute.InputContext()))
    except Exception:  # noqa: BLE001  (a message about the data must not fail on the data)
      source = None
    if source is not None:
      sources.append(source)
  if len(sources) == 1:
    return record_damage.describe(sources[0], offset)
  if sources:
    files = tuple(f for s in sources for f in s.files)
    return record_damage.describe(record_damage.ReadFiles(files, sources[0].compression), offset)
  return record_damage.describe(None, offset)


def user_line(frames: Sequence[tuple[str, int]]) -> str | None:
  """'file:line' of the user's code that made a failing op, from the Python stack that made it.

  The innermost frame of the user's, if this framework calls it (a task's method); not one that calls this framework
  (the script that started the run).
  """
  for name, line in reversed(frames):
    if is_user_file(name):
      return f"{name}:{line}"
    if _in_framework(name):
      return None
  return None


def is_user_file(name: str) -> bool:
  """Whether a source file is the user's: not Python's, a library's, its environment's scripts, this framework's.

  The framework's example tasks count as the user's.
  """
  if "-packages" in name or name.startswith(("<", sys.prefix, sys.base_prefix)) or os.sep + "python3" in name:
    return False
  return not _in_framework(name)


def _in_framework(name: str) -> bool:
  return any(part in name for part in _FRAMEWORK) and f"{os.sep}tasks{os.sep}" not in name


def failing_line(error: BaseException) -> str:
  """'file:line (code)' of the innermost frame of the error's traceback in the user's code (see `is_user_file`)."""
  for frame in reversed(traceback.extract_tb(error.__traceback__)):
    if is_user_file(frame.filename):
      return f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
  return "an unknown line"
