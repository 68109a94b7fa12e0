"""Holds: a process of a test stops at a chosen moment and stays there until the test releases or kills it.

A test that kills or signals a run "at a moment" makes the run hold there: the run's own code (the `HoldAt` action,
the task or the checkpointer of tests/resume_helpers.py and tests/fault_helpers.py) calls `hold(folder, name)`, which
writes the marker file `folder/name.held` and then waits until `folder/name.release` exists. The test waits for
the marker (`wait_held`), so it acts while the run is exactly at that moment whatever the load of the machine;
a log line written while the run goes on would race it.

A hold never ends by itself: a run the test means to kill must not move on because the test was slow. Only a
hold nobody ever releases or kills (the test process died) ends, after `CAP_SECS`, by ending its process with
`NEVER_RELEASED` and a line saying so: never by letting the run go on.

Standard library only: a process may hold before it has imported TensorFlow.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

CAP_SECS = 1800.0
NEVER_RELEASED = 86  # The exit status of a process whose hold was never released.


def hold(folder: str | os.PathLike, name: str) -> None:
  """Writes the marker `folder/name.held`, then waits until `folder/name.release` exists.

  Args:
    folder: The folder of the test's markers (outside any model_dir the test compares).
    name: The moment; `{pid}` in it becomes this process's id (several processes holding at once).
  """
  folder, name = Path(folder), name.format(pid=os.getpid())
  folder.mkdir(parents=True, exist_ok=True)
  # The log line first, in one write: once the marker is there the test may signal the process, and a signal
  # between print's text and its newline would glue the line to the run's last one.
  sys.stderr.write(f"HELD {name} (pid {os.getpid()})\n")
  sys.stderr.flush()
  partial = folder / f".{name}.held.{os.getpid()}"
  partial.write_text(f"{os.getpid()}\n")
  os.replace(partial, folder / f"{name}.held")  # Whole or absent.
  release = folder / f"{name}.release"
  deadline = time.monotonic() + CAP_SECS
  while not release.exists():
    if time.monotonic() > deadline:
      print(f"HOLD {name} NEVER RELEASED in {CAP_SECS:.0f}s: ending the process", file=sys.stderr, flush=True)
      os._exit(NEVER_RELEASED)
    time.sleep(0.01)


def release(folder: str | os.PathLike, name: str) -> None:
  """Lets the process held at `name` go on."""
  (Path(folder) / f"{name}.release").touch()


def wait_held(
  folder: str | os.PathLike,
  name: str,
  running: Callable[[], bool],
  log: Callable[[], str],
  timeout: float = 600,
) -> None:
  """Waits until a process holds at `name`; fails at once if it ended first, or after `timeout` seconds.

  Args:
    folder: The markers' folder.
    name: The moment (as given to `hold`, with `{pid}` filled in).
    running: Whether the process still runs.
    log: Its log, shown when it never holds.
    timeout: A safety net for a run that hangs before the moment (the wait is on the marker, not the clock).
  """
  marker = Path(folder) / f"{name}.held"
  deadline = time.monotonic() + timeout
  while not marker.exists():
    if not running():
      if marker.exists():
        return
      raise AssertionError(f"the process ended before holding at {name!r}; log tail:\n{log()[-4000:]}")
    if time.monotonic() > deadline:
      raise AssertionError(f"no hold at {name!r} after {timeout}s; log tail:\n{log()[-4000:]}")
    time.sleep(0.01)


def wait_delivered(pid: int, sig: int, timeout: float = 600) -> None:
  """Waits until the kernel has delivered `sig`, sent to process `pid`, to one of its threads.

  A Python handler runs only in the main thread, between bytecodes: a process held inside a compiled program (a
  `tf.py_function`) runs it only once the program returns. Once the signal is delivered, Python's C-level handler
  has recorded it, so the main thread runs the handler as soon as it runs Python again: releasing the hold after
  this can no longer let the run move on without having seen the signal.
  """
  bit = 1 << (sig - 1)
  deadline = time.monotonic() + timeout
  while True:
    try:
      status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
      return  # Gone: the caller's next check sees how it ended.
    pending = int(re.search(r"^ShdPnd:\s*([0-9a-fA-F]+)$", status, re.M).group(1), 16)
    if not pending & bit:
      return
    assert time.monotonic() < deadline, f"signal {sig} still pending in process {pid} after {timeout}s"
    time.sleep(0.005)


def hold_params(
  folder: str | os.PathLike, where: str = "train", step: int = 0, actions=(), name: str = ""
) -> list[str]:
  """Gin bindings of a training run that holds at `where` (see `resume_helpers.HoldAt`; the marker is named
  `name`, default `where`), its action after `actions` (gin references such as '@PacedLoops()')."""
  return [
    "import resume_helpers",
    f"Executor.actions = [{', '.join([*actions, '@HoldAt()'])}]",
    f"HoldAt.folder = {str(folder)!r}",
    f"HoldAt.where = {where!r}",
    f"HoldAt.step = {step}",
    f"HoldAt.name = {name!r}",
  ]
