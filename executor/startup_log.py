"""Quiets TensorFlow's C++ start-up notices in the `executor` command's log.

TensorFlow's native libraries print notices to the process's stderr (file descriptor 2) while they load and when
the first device is set up, before absl's C++ log is initialised, so `TF_CPP_MIN_LOG_LEVEL` does not hide them:
the oneDNN notice (twice), "Could not find cuda drivers" (twice), an error-level "failed call to cuInit" on a
machine without a GPU, the CPU-instructions notice. `start_filter` points fd 2 at a pipe read by a thread that
drops exactly those lines (`NOISE`) and copies every other byte, in order, to the real stderr; `stop_filter`
puts the real stderr back once start-up is over (the CLI stops it as soon as the executor is built), so that
afterwards nothing at all passes through the filter.

Only the `executor` command does this (`quiet_the_command`): it must start before TensorFlow is imported, so
`executor/__init__.py` calls it first thing, and it acts for that command only (never for a program or notebook
that imports the package), and filters nothing when `--verbosity` (absl's flag, `-v`) is 1 or more, which shows
everything. This module imports nothing of TensorFlow.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import threading
from pathlib import Path

# Lines TensorFlow's native code prints at start-up that say nothing about the run. Real C++ warnings and errors
# (out of memory, a failed op, a check failure) do not match and pass through.
NOISE = re.compile(
  "|".join(
    [
      r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
      r"[IW]\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on",
      r"[IW]\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers",
      r"E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit: .*\(303\)",
      r"[IW]\d{4} [\d:. ]+\d+ cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized",
      r"To enable the following instructions: .* in other operations, rebuild TensorFlow",
      r"[EW]\d{4} [\d:. ]+\d+ cuda_(dnn|fft|blas)\.cc:\d+\] Unable to register cu\w+ factory",
      r"[EW]\d{4} [\d:. ]+\d+ computation_placer\.cc:\d+\] computation placer already registered",
    ]
  )
)

_filter: _Filter | None = None


class _Filter:
  """fd 2 redirected to a pipe; a thread copies what is not `NOISE` to the saved stderr."""

  def __init__(self):
    self.stderr = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    self.read = read
    self.dropped = 0
    self.thread = threading.Thread(target=self._copy, name="startup-log-filter", daemon=True)
    self.thread.start()

  def _copy(self) -> None:
    pending = b""
    while True:
      chunk = os.read(self.read, 65536)
      if not chunk:
        break
      pending += chunk
      *lines, pending = pending.split(b"\n")
      out = []
      for line in lines:
        if NOISE.match(line.decode("utf-8", "replace")):
          self.dropped += 1
        else:
          out.append(line + b"\n")
      if out:
        os.write(self.stderr, b"".join(out))
    if pending and not NOISE.match(pending.decode("utf-8", "replace")):
      os.write(self.stderr, pending)
    os.close(self.read)

  def stop(self) -> None:
    """Puts the real stderr back on fd 2 and waits until everything written before is copied."""
    sys.stderr.flush()
    os.dup2(self.stderr, 2)  # Closes the pipe's only writer (child processes may hold copies).
    self.thread.join(timeout=5)
    if not self.thread.is_alive():  # Else a child process still writes to the pipe: the thread copies on.
      os.close(self.stderr)


def command_wants_filter(argv: list[str] | None = None) -> bool:
  """Whether this process is the `executor` command without `--verbosity >= 1`.

  `argv` defaults to the interpreter's own command line (`sys.orig_argv`), which names the module of
  `python -m executor.cli.main` while that module's package is still being imported.
  """
  argv = list(getattr(sys, "orig_argv", sys.argv)) if argv is None else argv
  args = _command_args(argv)
  return args is not None and verbosity(args) < 1


def _command_args(argv: list[str]) -> list[str] | None:
  """The command's arguments when this process is the `executor` command, else None."""
  if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "executor.cli.main":
    return argv[argv.index("-m") + 2 :]
  if sys.argv and Path(sys.argv[0]).name == "executor":
    return sys.argv[1:]
  return None


def verbosity(args: list[str]) -> int:
  """The value of absl's `--verbosity` / `-v` flag in `args` (0 when absent or not an integer)."""
  value = "0"
  for i, arg in enumerate(args):
    for flag in ("--verbosity", "-v"):
      if arg == flag and i + 1 < len(args):
        value = args[i + 1]
      elif arg.startswith(flag + "="):
        value = arg[len(flag) + 1 :]
  try:
    return int(value)
  except ValueError:
    return 0


def quiet_the_command() -> None:
  """In the `executor` command only: hide TensorFlow's C++ INFO and WARNING log and start the filter.

  Also from here on, until the run takes its signals (`StopRequest`), a Ctrl-C ends the command with one line.

  A user's own `TF_CPP_MIN_LOG_LEVEL` wins; any other process that imports the package is left as it is.
  """
  args = _command_args(list(getattr(sys, "orig_argv", sys.argv)))
  if args is None:
    return
  interrupt_ends_start_up()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if verbosity(args) < 1:
    start_filter()


def start_filter() -> None:
  """Starts dropping TensorFlow's start-up notices from fd 2 (once per process); `stop_filter` ends it."""
  global _filter
  if _filter is None:
    _filter = _Filter()
    atexit.register(stop_filter)


def stop_filter() -> int:
  """Ends the filter, if one runs; returns the number of lines it dropped."""
  global _filter
  if _filter is None:
    return 0
  current, _filter = _filter, None
  current.stop()
  return current.dropped


def interrupt_ends_start_up() -> None:
  """In the `executor` command: a Ctrl-C before the run takes its signals ends the process with one line.

  Start-up imports TensorFlow and traces the programs (seconds); a `KeyboardInterrupt` there would print a
  traceback from inside whatever module was loading. Nothing of the run's state is written before the run takes its
  signals (`executor.preemption.StopRequest`, which hands SIGINT back to Python when the run ends), so ending at
  once loses nothing.
  """
  if threading.current_thread() is threading.main_thread() and (
    signal.getsignal(signal.SIGINT) is signal.default_int_handler
  ):
    signal.signal(signal.SIGINT, end_start_up)


def end_start_up(signum, frame) -> None:
  """The SIGINT handler of start-up: one line, exit 130."""
  stop_filter()
  print(
    "executor: interrupted during start-up (Ctrl-C): stopped before the first step",
    file=sys.stderr,
    flush=True,
  )
  raise SystemExit(130)


def quiet_python_logs() -> None:
  """Drops the INFO chatter of TensorFlow's, TensorBoard's and gin's internals from the log (not their warnings).

  TensorFlow logs saver internals ("Sharding callback duration") at INFO, TensorBoard's event reader each file
  it has read to its end ("No path found after ...", when the run reads its own events back); gin logs every place
  it probes for an included file, with an error-level "Path not found" for each miss, even when the file is then
  found (a file that is not found anywhere is one `executor: error:` line). `--verbosity=1` keeps them.
  """
  import logging as std_logging

  from absl import logging

  def keep(record: std_logging.LogRecord) -> bool:
    path = record.pathname.replace("\\", "/")
    if "/gin/resource_reader.py" in path:
      return False
    internal = "/tensorflow/" in path or "/tensorboard/" in path
    return not (internal and record.levelno < std_logging.WARNING)

  logging.get_absl_handler().addFilter(keep)
