"""The train program's input: one iterator over the train split, positioned in examples, resumed after a restore.

A train split is read without end by one iterator that lives as long as the run. Where it is after a restart
comes from the checkpoint, in one of three ways, best first:
- the task's `dataset()` takes `start_example`: the pipeline opens at the restored position in constant time;
- else, where tf.data can save the iterator (one device, no generator or `py_function`), each checkpoint holds
  its state (`programs.core.input_state`) and a restore puts it back, with no replay;
- else the batches already read are replayed (`skip`), and the log says what that costs.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from programs.core import input_state
from programs.core.data import replay_secs_per_batch, takes_start
from programs.core.runtime import Runtime
from programs.core.task import Task


class TrainInput:
  """The iterator a train program's loop reads, and the checkpoint state that puts it back where it was.

  Args:
    name: The program's name (for the log).
    task: The task whose `dataset(split, ...)` is read.
    split: The train split.
    runtime: The built runtime.
    position: The program's counter of examples read over all replicas (advanced on device by the loop's tail).
  """

  def __init__(self, name: str, task: Task, split: str, runtime: Runtime, position: tf.Variable):
    self.name, self.task, self.split, self.runtime, self.position = name, task, split, runtime, position
    self.dataset: Any = None
    self.iterator: Any = None
    self._at = 0  # The position the current iterator opened at.
    # The iterator's saved state, for a dataset that takes no start_example (None: replayed, or not needed).
    self._checkpoint: input_state.InputCheckpoint | None = None
    self._state: input_state.IteratorState | None = None
    self.reset()
    if not takes_start(task.dataset, split):
      why = input_state.unsaveable(self.iterator)
      if why is None:
        self._checkpoint = input_state.InputCheckpoint()
      else:
        logging.warning(
          "Program %s: %s.dataset() takes no start_example and %s, so a resumed run replays its input",
          name,
          type(task).__name__,
          why,
        )

  def checkpoint_items(self, prefix: str) -> dict[str, Any]:
    """`{<prefix>_input_iterator: state}` where the iterator's state is saved, else nothing."""
    return {f"{prefix}_input_iterator": self._checkpoint} if self._checkpoint is not None else {}

  def reset(self) -> None:
    """Restarts the input where `position` says (after a restore or a rollback).

    A pipeline whose iterator state is saved is rebuilt from its start and advanced in place (the same pipeline,
    so that the state saved later fits it); any other opens at the position or replays with `skip`.
    """
    position = int(self.position.numpy())
    if self._state is not None:
      self._state.pending = None
    replay = self.runtime.replay_batches(self.task, position)
    if replay:
      self._warn_replay(position, replay)
    in_place = self._checkpoint is not None
    self.dataset = self.runtime.distribute_dataset(
      self.task, self.split, start_example=0 if in_place else position
    )
    self.iterator = iter(self.dataset)
    if in_place and replay:
      _advance(self.iterator, tf.constant(replay, tf.int64))
    self._at = position

  def restored(self) -> None:
    """After a restore: reads on from the restored position (from the saved iterator state where there is one)."""
    if self._resume_saved_iterator():
      return
    if int(self.position.numpy()) != self._at:
      self.reset()

  def _resume_saved_iterator(self) -> bool:
    """Attaches the iterator state to the checkpoint and resumes from it if the restored checkpoint had one."""
    if self._checkpoint is None:
      return False
    if self._state is None:
      # Attached after the restore: a checkpoint without it restores cleanly, one with it restores it now.
      self._state = input_state.IteratorState(lambda: self.iterator)
      self._checkpoint.state = self._state
    state, self._state.pending = self._state.pending, None
    if state is None:
      self._state.on_first_save = self._log_state_size
      return False
    position = int(self.position.numpy())
    self.dataset = self.runtime.distribute_dataset(self.task, self.split)
    self.iterator = iter(self.dataset)
    try:
      input_state.restore(self.iterator, state)
    except tf.errors.OpError as e:  # The pipeline changed since the save (another op, another structure).
      logging.warning(
        "Program %s: the saved input iterator state does not fit %s.dataset() (%s); replaying instead",
        self.name,
        type(self.task).__name__,
        input_state.op_message(e)[:300],
      )
      self.reset()
      return True
    self._at = position
    logging.info(
      "Program %s: the input resumes at example %d from its saved iterator state (%d bytes), with no replay",
      self.name,
      position,
      input_state.size_bytes(state),
    )
    return True

  def _log_state_size(self, size: int) -> None:
    logging.info(
      "Program %s: checkpoints save the input iterator's state (%d bytes), so a resumed run does not replay",
      self.name,
      size,
    )

  def _warn_replay(self, position: int, batches: int) -> None:
    probe = self.task.dataset(
      self.split, tf.distribute.InputContext(num_replicas_in_sync=self.runtime.num_replicas)
    )
    secs = replay_secs_per_batch(probe) * batches
    logging.warning(
      "Program %s: %s.dataset() takes no start_example, so resuming at example %d replays %d batches per input "
      "pipeline (about %.0f s at the rate just measured, and growing with the run); take start_example and "
      "start there (executor.array_dataset does) to resume in constant time",
      self.name,
      type(self.task).__name__,
      position,
      batches,
      secs,
    )


@tf.function
def _advance(iterator, batches):
  """Reads and drops `batches` batches of `iterator` on the host (a replay that keeps the pipeline as it is)."""
  i = tf.constant(0, tf.int64)
  while i < batches:
    iterator.get_next()
    i += 1
