"""The train program's input: one iterator over the train split, positioned in examples, resumed after a restore.

A train split is read without end by one iterator per worker that lives as long as the run: a plain
`tf.data.Iterator` over the worker's input pipeline (`Runtime.worker_dataset`), whose batches the loop hands to
the worker's replicas (`Runtime.per_replica`), on one device, several, or several workers alike. Where it is after
a restart comes from the checkpoint, in one of three ways, best first:
- the task's `dataset()` takes `start_example`: the pipeline opens at the restored position in constant time, on
  any number of replicas and workers (the position counts examples over all of them);
- else, where tf.data can save the iterator (no generator or `py_function`), each checkpoint holds every
  pipeline's state (`programs.core.input_state`) and a restore on the same pipelines and per-replica batch puts
  it back, with no replay;
- else the batches already read are replayed (`skip`), and the log says why and what that costs.
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
    self._local = runtime.reads_worker_pipelines
    self._read_by = input_state.ReadBy(runtime.num_replicas, runtime.num_workers, runtime.num_workers)
    self._saved = input_state.SavedInput()
    # Every pipeline's iterator state, for a dataset that takes no start_example (None: replayed, or not needed).
    self._states: input_state.PipelineStates | None = None
    self._saveable = False
    self.reset()
    if not takes_start(task.dataset, split):
      why = input_state.unsaveable(self.iterator)
      self._saveable = why is None
      if why is not None:
        logging.warning(
          "Program %s: %s.dataset() takes no start_example and %s, so a resumed run replays its input",
          name,
          type(task).__name__,
          why,
        )

  @property
  def read_fn(self):
    """How the loop reads a step's batches from `iterator` (None: a distributed iterator's `next`)."""
    return self.runtime.per_replica if self._local else None

  def checkpoint_items(self, prefix: str) -> dict[str, Any]:
    """`{<prefix>_input: what read the input and, where they can be saved, its iterators' states}`."""
    return {f"{prefix}_input": self._saved}

  def reset(self) -> None:
    """Restarts the input where `position` says (after a restore or a rollback).

    A pipeline whose iterator state is saved is rebuilt from its start and advanced in place (the same pipeline,
    so that the state saved later fits it); any other opens at the position or replays with `skip`.
    """
    self._open(int(self.position.numpy()))

  def _open(self, position: int, because: str = "") -> None:
    if self._states is not None:
      self._states.pending = None
    replay = self.runtime.replay_batches(self.task, position)
    if replay:
      self._warn_replay(position, replay, because)
    in_place = self._saveable
    start = 0 if in_place else position
    if self._local:
      self.dataset = self.runtime.worker_dataset(self.task, self.split, start, self._read_by.stream_pipelines)
    else:
      self.dataset = self.runtime.distribute_dataset(self.task, self.split, start_example=start)
    self.iterator = iter(self.dataset)
    if in_place and replay:
      skip_batches(self.iterator, tf.constant(replay, tf.int64))
    self._at = position

  @property
  def _per_replica_batch(self) -> int:
    return self.task.global_batch_size // self.runtime.num_replicas

  def restored(self) -> None:
    """After a restore: reads on from the restored position (from the saved iterator state where there is one)."""
    self._attach()
    if self._resume_saved_iterator():
      return
    if int(self.position.numpy()) != self._at or self._read_by.stream_pipelines != self.runtime.num_workers:
      self.reset()

  def _attach(self) -> None:
    """Attaches the saved children to the checkpoint item: a checkpoint that holds them restores them now."""
    if getattr(self._saved, "read_by", None) is not None:
      return
    self._saved.read_by = self._read_by
    if self._read_by.restored is not None:
      replicas, workers, self._read_by.stream_pipelines = self._read_by.restored
      if (replicas, workers) != (self.runtime.num_replicas, self.runtime.num_workers):
        logging.info(
          "Program %s: resumed on %d replicas from a run on %d (%d worker(s), from %d); the global batch stays "
          "%d examples, %d per replica, and the input reads on from example %d",
          self.name,
          self.runtime.num_replicas,
          replicas,
          self.runtime.num_workers,
          workers,
          self.task.global_batch_size,
          self._per_replica_batch,
          int(self.position.numpy()),
        )
    if self._saveable:
      self._states = input_state.PipelineStates(
        lambda: self.iterator,
        lambda: int(self.position.numpy()),
        self._per_replica_batch,
        self.runtime.num_workers,
        self.runtime.worker_index,
        self.runtime.all_workers,
      )
      self._saved.pipelines = self._states

  def _resume_saved_iterator(self) -> bool:
    """Resumes from the restored checkpoint's iterator state, if it had one; False if it had none."""
    if self._states is None:
      return False
    saved, self._states.pending = self._states.pending, None
    position = int(self.position.numpy())
    if saved is None:
      self._states.on_first_save = self._log_state_size
      if position:
        self._open(position, "the checkpoint holds no input iterator state")
      return position > 0
    pipeline = self.runtime.worker_index
    why = _unusable(saved, self.runtime.num_workers, pipeline, self._per_replica_batch, position)
    if why:
      self._open(position, why)
      return True
    self.dataset = self.runtime.worker_dataset(self.task, self.split, 0, self._read_by.stream_pipelines)
    self.iterator = iter(self.dataset)
    try:
      input_state.restore(self.iterator, saved.states[pipeline])
    except tf.errors.OpError as e:  # The pipeline changed since the save (another op, another structure).
      self._open(
        position,
        f"the saved input iterator state does not fit {type(self.task).__name__}.dataset() "
        f"({input_state.op_message(e)[:300]})",
      )
      return True
    self._at = position
    logging.info(
      "Program %s: the input resumes at example %d from its saved iterator state (%d bytes), with no replay",
      self.name,
      position,
      len(saved.states[pipeline]),
    )
    return True

  def _log_state_size(self, size: int) -> None:
    logging.info(
      "Program %s: checkpoints save the input iterator's state (%d bytes), so a resumed run does not replay",
      self.name,
      size,
    )

  def _warn_replay(self, position: int, batches: int, because: str) -> None:
    context = tf.distribute.InputContext(num_replicas_in_sync=self.runtime.num_replicas)
    secs = replay_secs_per_batch(self.task.dataset(self.split, context)) * batches
    cause = because or f"{type(self.task).__name__}.dataset() takes no start_example"
    logging.warning(
      "Program %s: %s, so resuming at example %d replays %d batches per input pipeline (about %.0f s at the "
      "rate just measured, and growing with the run); take start_example and start there "
      "(executor.array_dataset does) to resume in constant time",
      self.name,
      cause,
      position,
      batches,
      secs,
    )


def _unusable(saved: input_state.Saved, pipelines: int, pipeline: int, batch: int, position: int) -> str:
  """Why this worker cannot resume from `saved` (another pipeline count, batch or position), or ''."""
  if len(saved.states) != pipelines:
    return (
      f"the saved input iterator states are of {len(saved.states)} input pipeline(s), not {pipelines} (a "
      "pipeline's state cannot be split or merged)"
    )
  if saved.per_replica_batch != batch:
    return (
      f"the saved input iterator state is of batches of {saved.per_replica_batch} example(s) per replica, "
      f"not {batch}"
    )
  if saved.positions[pipeline] != position or not saved.states[pipeline]:
    return (
      f"the saved input iterator state of pipeline {pipeline} is of example {saved.positions[pipeline]}, "
      f"not {position} (a copy written apart from a save)"
    )
  return ""


@tf.function
def skip_batches(iterator, batches):
  """Reads and drops `batches` batches of `iterator` on the host (a replay that keeps the pipeline as it is)."""
  i = tf.constant(0, tf.int64)
  while i < batches:
    iterator.get_next()
    i += 1
