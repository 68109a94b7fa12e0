"""Rolling back a run whose loss went non-finite: the last good checkpoint, read on past the batches that diverged."""

from __future__ import annotations

from collections.abc import Callable

from absl import logging

from executor.checkpoints import Checkpointer
from programs.core.metric_writers import MetricWriter
from programs.core.runtime import HostCounter
from programs.train import NonFiniteLossError


class Rollbacks:
  """Rolls back on a `NonFiniteLossError` of a train program with `non_finite_policy='rollback'`.

  The count of rollbacks is saved with the run, so `TrainProgram.max_rollbacks` bounds the rollbacks of the whole
  run, across restarts, not of one process.
  """

  def __init__(self):
    self.count = HostCounter()

  def checkpoint_items(self) -> dict:
    """The rollback count."""
    return {"rollbacks": self.count}

  def __call__(
    self,
    error: NonFiniteLossError,
    checkpointer: Checkpointer,
    writer: MetricWriter,
    restart_writers: Callable[[int], None] = lambda step: None,
  ) -> None:
    """Restores the last good checkpoint, keeping the input position and the count; re-raises when not allowed.

    `restart_writers(step)` then makes the writers forget what the diverged steps wrote.

    Raises:
      NonFiniteLossError: the program does not roll back, or has rolled back `max_rollbacks` times, or there is
        no checkpoint to roll back to.
    """
    train = error.program
    if train is None or train.non_finite_policy != "rollback":
      raise error
    done = self.count.value
    if done >= train.max_rollbacks:
      raise NonFiniteLossError(f"{error} ({done} rollbacks already: giving up)") from error
    if checkpointer.latest is None:
      raise NonFiniteLossError(f"{error} (no checkpoint to roll back to)") from error
    position = int(train.input_position.numpy())
    step = checkpointer.restore()
    # The restore brought back the count and position of the checkpoint: this run's go on.
    self.count.value = done + 1
    train.input_position.assign(position)
    train.reset_input()
    logging.warning(
      "%s. Rolled back to step %d (rollback %d of at most %d); reading on from input position %d",
      error,
      step,
      self.count.value,
      train.max_rollbacks,
      position,
    )
    restart_writers(step)
    writer.scalars({"rollbacks": self.count.value}, step)
