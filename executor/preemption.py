"""Clean stops: SIGTERM and a first Ctrl-C finish the current loop, save and exit 0."""

from __future__ import annotations

import signal
import sys
import threading

from absl import logging


class StopRequest:
  """Turns SIGTERM and the first SIGINT into a flag the main loop polls.

  A second SIGINT raises `KeyboardInterrupt` at once. Handlers are installed
  only in the main thread, and the previous ones are restored on exit.
  """

  def __init__(self):
    self.requested = False
    self.reason = ""
    self._previous: dict[int, object] = {}

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      # Start-up is over: a later Ctrl-C is Python's again (the CLI says what it stopped).
      signal.signal(sig, signal.default_int_handler if handler is _end_start_up else handler)
    self._previous.clear()

  def request(self, reason: str) -> None:
    """Asks for a clean stop from inside the program (early stopping, ...)."""
    if not self.requested:
      self.requested = True
      self.reason = reason
      logging.info("Stopping: %s", reason)

  def __call__(self) -> bool:
    return self.requested

  def _handle(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested = True
    self.reason = name
    logging.warning("%s received: finishing the current loop, then saving and exiting", name)


def interrupt_ends_start_up() -> None:
  """In the `executor` command: a Ctrl-C before the run takes its signals ends the process with one line.

  Start-up imports TensorFlow and traces the programs (seconds); a `KeyboardInterrupt` there would print a
  traceback from inside whatever module was loading. Nothing of the run's state is written before the run takes its
  signals, so ending at once loses nothing.
  """
  if threading.current_thread() is threading.main_thread() and (
    signal.getsignal(signal.SIGINT) is signal.default_int_handler
  ):
    signal.signal(signal.SIGINT, _end_start_up)


def _end_start_up(signum, frame) -> None:
  from executor import startup_log

  startup_log.stop_filter()
  print(
    "executor: interrupted during start-up (Ctrl-C): stopped before the first step",
    file=sys.stderr,
    flush=True,
  )
  raise SystemExit(130)
