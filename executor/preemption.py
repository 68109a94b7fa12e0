"""Stops: SIGTERM and a first Ctrl-C finish the current loop, save and exit 0; a lost worker ends the others.

On several workers a stop is agreed on (`ExecutorBase.should_stop`), so every worker leaves the loop at the same
step and saves the same checkpoint. A worker that is killed or stops answering cannot agree to anything: the
collective ops of the others fail (when its connections drop, or after `multi_worker_strategy.peer_timeout_secs`),
and `worker_losses` turns that failure into one `WorkerLostError` naming the worker, the step and the checkpoint the
same command on every worker resumes from.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Callable, Iterator

import tensorflow as tf
from absl import logging

from executor.startup_log import end_start_up
from programs.core.runtime import Runtime


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


# The exit status of a run that lost a worker: EX_TEMPFAIL, "try again", as a script that restarts the cluster may.
WORKER_LOST_STATUS = 75

# How TensorFlow names a task in its errors: '/job:worker/replica:0/task:1', '/job:worker/task:1'.
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
# What the errors of a lost peer say: its connections dropped, its heartbeats stopped, a collective gave up on it.
_PEER_LOST = re.compile(
  r"Collective ops is aborted|Collective has timed out|stopped sending heartbeats|CoordinationService"
  r"|Connection reset by peer|Connection refused|Socket closed|failed to connect|from remote target /job:"
)
_PEER_ERRORS = (
  tf.errors.UnavailableError,
  tf.errors.DeadlineExceededError,
  tf.errors.AbortedError,
  tf.errors.CancelledError,
  tf.errors.FailedPreconditionError,
)
_REASON_CHARS = 200


class WorkerLostError(RuntimeError):
  """A worker of a multi-worker run was killed or stopped answering, so this one cannot go on.

  Nothing was saved after the latest checkpoint; the same command on every worker resumes from it. The CLI prints
  the message as one line, with exit status `WORKER_LOST_STATUS`.

  Attributes:
    worker: The lost worker ('worker 1 (host:port)'), or None when TensorFlow's error does not name it.
    step: The global step this worker had reached (the loop that failed started there).
    checkpoint: The latest checkpoint, or None.
    reason: What TensorFlow said, shortened.
  """

  def __init__(self, message: str, worker: str | None, step: int, checkpoint: str | None, reason: str):
    super().__init__(message)
    self.worker, self.step, self.checkpoint, self.reason = worker, step, checkpoint, reason


def _chain(error: BaseException) -> Iterator[BaseException]:
  seen = []
  while error is not None and error not in seen:
    seen.append(error)
    yield error
    error = error.__cause__ or error.__context__


def peer_failure(error: BaseException) -> tf.errors.OpError | None:
  """The TensorFlow error in `error`'s chain that says a peer of a multi-worker run is gone, or None."""
  for e in _chain(error):
    if isinstance(e, _PEER_ERRORS) and _PEER_LOST.search(e.message or ""):
      return e
  return None


def lost_worker(error: tf.errors.OpError, cluster: dict, task: tuple[str, int]) -> str | None:
  """'worker 1 (host:port)': the lost task `error` names, with its address from `cluster`; None if unknown.

  The last other task the message names (a task that reports a lost one names itself first: 'Error reported from
  /job:worker/task:2: The following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1');
  without one, a failed heartbeat names the coordination service's leader, the chief (or worker 0).
  """
  message = error.message or ""
  named = [(job, int(index)) for job, index in _TASK.findall(message) if (job, int(index)) != task]
  if not named and "CoordinationService/Heartbeat" in message:
    named = [("chief" if "chief" in cluster else "worker", 0)]
  if not named:
    return None
  job, index = named[-1]
  addresses = cluster.get(job, [])
  return f"{job} {index}" + (f" ({addresses[index]})" if index < len(addresses) else "")


def failure_reason(error: tf.errors.OpError) -> str:
  """What TensorFlow says of a lost peer, on one short line: 'UnavailableError: Collective ops is aborted by: ...'."""
  lines = [line.strip() for line in (error.message or "").splitlines() if line.strip()]
  reason = next((line for line in lines if _PEER_LOST.search(line)), lines[0] if lines else "")
  reason = re.sub(r"\s*\[type\.googleapis\.com/.*$|\{\{.*?\}\}\s*|\s*\[Op:.*$", "", reason).rstrip(":")
  rpc = next((line for line in lines if line.startswith("RPC: ")), None)
  if rpc and rpc not in reason:
    reason += f" ({rpc})"
  if len(reason) > _REASON_CHARS:
    reason = reason[:_REASON_CHARS] + "..."
  return f"{type(error).__name__}: {reason}"


@contextlib.contextmanager
def worker_losses(runtime: Runtime, latest: Callable[[], str | None]) -> Iterator[None]:
  """Turns the failure of a collective op whose peer is gone into one `WorkerLostError` (multi-worker runs only).

  Args:
    runtime: The runtime (its cluster names the workers; its step is where this worker stopped).
    latest: The latest checkpoint.
  """
  try:
    yield
  except Exception as error:
    found = peer_failure(error) if runtime.num_workers > 1 else None
    if found is None:
      raise
    resolver = runtime.strategy.cluster_resolver
    worker = lost_worker(found, resolver.cluster_spec().as_dict(), (resolver.task_type, resolver.task_id))
    checkpoint, step, reason = latest(), runtime.step(), failure_reason(found)
    resume = (
      f"the latest checkpoint is '{checkpoint}': run the same command on every worker to resume from it"
      if checkpoint
      else "there is no checkpoint yet: the same command on every worker starts the run again"
    )
    raise WorkerLostError(
      f"{worker or 'a worker'} stopped answering ({reason}), so {resolver.task_type} {resolver.task_id} stopped "
      f"at step {step} without saving; {resume}",
      worker,
      step,
      checkpoint,
      reason,
    ) from error
