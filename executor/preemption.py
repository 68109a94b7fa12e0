"""Clean stops: SIGTERM and a first Ctrl-C finish the current loop, save and exit 0."""

from __future__ import annotations

import signal
import threading

from absl import logging

from executor.startup_log import end_start_up


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
      signal.signal(sig, signal.default_int_handler if handler is end_start_up else handler)
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
