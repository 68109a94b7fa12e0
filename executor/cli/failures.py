"""What the command line says when a run is stopped by its storage, a lost worker or a second Ctrl-C.

A full disk or a read-only `model_dir` surfaces wherever the next write
happens (a checkpoint written by TensorFlow, a decode record, a summary), as
an `OSError` or a `tf.errors.OpError`, possibly while another error is being
handled. `storage_error` finds the first such error in the chain and says,
on one line, what happened, the path and where the run will resume from.
"""

from __future__ import annotations

import errno
import os
import re

_KINDS = {  # errno: (what happened, what to do)
  errno.ENOSPC: ("the disk is full", "make room"),
  errno.EDQUOT: ("the disk quota is exceeded", "make room"),
  errno.EROFS: ("the file system is read-only", "make it writable"),
}
_TEXTS = {
  "No space left on device": errno.ENOSPC,
  "Disk quota exceeded": errno.EDQUOT,
  "Read-only file system": errno.EROFS,
}
# TensorFlow's messages: "{{function_node ...}} /path/to/file; No space left on device [Op:SaveV2]".
_TF_PATH = re.compile(r"(?:^|\s)(/[^;\n]*?)\s*;\s*(?:" + "|".join(_TEXTS) + ")")


def _chain(error: BaseException):
  """`error` and the errors it was raised from or while handling, the first one raised first."""
  chain = []
  while error is not None and error not in chain:
    chain.append(error)
    error = error.__cause__ or error.__context__
  return reversed(chain)


def _classify(error: BaseException) -> tuple[int, str | None] | None:
  if isinstance(error, OSError) and error.errno in _KINDS:
    return error.errno, error.filename
  text = str(error)
  for needle, code in _TEXTS.items():
    if needle in text and type(error).__module__.startswith("tensorflow"):
      match = _TF_PATH.search(text.rsplit("}}", 1)[-1])
      return code, match.group(1) if match else None
  return None


def latest_checkpoint(model_dir: str | None) -> str:
  """'<path>' of model_dir's latest checkpoint, or 'none'."""
  if not model_dir:
    return "none"
  from executor import checkpoint_files

  directory = os.path.join(model_dir, "checkpoints")
  found = checkpoint_files.listed(directory) or []
  return f"'{found[-1]}'" if found else "none"


def ended(error: BaseException, model_dir: str | None) -> tuple[str, int] | None:
  """The one line and exit status of a run ended by a lost worker (75) or its storage (1); None for another error."""
  from executor.preemption import WORKER_LOST_STATUS, WorkerLostError

  if isinstance(error, WorkerLostError):
    return " ".join(str(error).split()), WORKER_LOST_STATUS
  message = storage_error(error, model_dir)
  return None if message is None else (message, 1)


def storage_error(error: BaseException, model_dir: str | None) -> str | None:
  """One line for a run stopped by a full or read-only disk; None for any other error."""
  for e in _chain(error):
    found = _classify(e)
    if found is not None:
      code, path = found
      what, remedy = _KINDS[code]
      where = f" writing '{path}'" if path else ""
      return (
        f"{what} ({os.strerror(code)}){where}; the latest checkpoint is "
        f"{latest_checkpoint(model_dir)}: {remedy} and run the same command to resume from it"
      )
  return None


def interrupted(model_dir: str | None) -> str:
  """The line of a run ended at once by a second Ctrl-C."""
  return (
    "interrupted by a second Ctrl-C: stopped at once, without saving; the latest checkpoint is "
    f"{latest_checkpoint(model_dir)} (the same command resumes from it)"
  )
