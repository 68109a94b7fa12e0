"""Checkpoints of the whole training state in `model_dir/checkpoints`.

What a checkpoint holds: the global step, every task's `checkpoint_items()`
(model and optimizer by default), each program's state (the train input
position, ...), and an index of the model variables under readable names
(`variables/<name>`), which warm starts map from.

Atomicity comes from TensorFlow's `CheckpointManager`: the `checkpoint` file
that names the latest checkpoint is rewritten (atomically) only after the
checkpoint's files are complete, also for asynchronous saves. A crash mid-save
leaves the pointer on the previous checkpoint.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import tensorflow as tf
from absl import logging

from executor import checkpoint_files
from programs.core.analysis import unique_variables, variable_name
from programs.core.errors import ConfigError, check_value
from programs.core.files import temp_path
from programs.core.input_state import SavedInput
from programs.core.runtime import HostCounter
from programs.core.saved_names import NamedChildren, adopt_saved_names


class NonFiniteCheckpointError(FloatingPointError):
  """A checkpoint was not written because variables hold NaN or Inf."""


class VariableIndex(NamedChildren):
  """Checkpoint dependency naming each model variable by its readable name."""

  def __init__(self, variables: Sequence[tf.Variable]):
    self._by_name = {}
    for v in unique_variables(variables):
      name = variable_name(v)
      if name in self._by_name:
        raise ValueError(
          f"Two different variables are named '{name}': give their layers or models distinct names"
        )
      self._by_name[name] = v

  def named_children(self) -> dict[str, tf.Variable]:
    return dict(self._by_name)


@gin.configurable
class Checkpointer:
  """Restores the newest readable checkpoint at start and saves by policy.

  Saves happen when `save_interval_steps` steps or `save_interval_secs`
  seconds passed since the last save, at the end of a run and on a clean stop.
  """

  def __init__(
    self,
    save_interval_steps: int | None = 1000,
    save_interval_secs: float | None = None,
    max_to_keep: int = 5,
    keep_checkpoint_every_n_hours: float | None = None,
    async_save: bool = False,
    check_finite: bool = True,
  ):
    """Configures the save policy.

    Args:
      save_interval_steps: Save when this many steps passed since the last save
        (None: no step-based saves).
      save_interval_secs: Save when this many seconds passed since the last save
        (None: no time-based saves).
      max_to_keep: Checkpoints kept; older ones are deleted.
      keep_checkpoint_every_n_hours: Also keep one checkpoint per this many
        hours, beyond `max_to_keep`.
      async_save: Write checkpoints in a background thread. The next save, a
        restore and the end of the run wait for it; its errors are raised in
        the main loop.
      check_finite: Refuse to write a checkpoint whose variables hold NaN/Inf.
    """
    check_value("Checkpointer.max_to_keep", max_to_keep, integer=True, minimum=1)
    check_value(
      "Checkpointer.save_interval_steps", save_interval_steps, integer=True, minimum=1, optional=True
    )
    check_value("Checkpointer.save_interval_secs", save_interval_secs, above=0, optional=True)
    check_value(
      "Checkpointer.keep_checkpoint_every_n_hours", keep_checkpoint_every_n_hours, above=0, optional=True
    )
    self.save_interval_steps, self.save_interval_secs = save_interval_steps, save_interval_secs
    self.max_to_keep, self.keep_checkpoint_every_n_hours = max_to_keep, keep_checkpoint_every_n_hours
    self.async_save, self.check_finite = async_save, check_finite
    if async_save:
      from executor import keras_async_save

      keras_async_save.install()  # Else every async save of Keras variables after the first fails.
    self.directory: str | None = None
    self._manager: tf.train.CheckpointManager | None = None
    self._variables: list[tf.Variable] = []
    self._last_saved_step = 0
    self._last_saved_time = time.monotonic()
    # Called before each save: makes complete what a checkpoint of the step promises (the executor's `settle`).
    self.before_save: Callable[[], None] | None = None

  def attach(
    self,
    directory: str,
    global_step: HostCounter | tf.Variable,
    items: Mapping[str, Any],
    variables: Sequence[tf.Variable] = (),
    is_chief: bool = True,
    agree: Callable[[bool], bool] = lambda flag: flag,
  ) -> None:
    """Binds the checkpointer to the state it saves and restores.

    Every item saves and restores itself (host counters are trackables too), so nothing is synced around a save.

    Args:
      directory: Folder of the checkpoints (every worker restores from it).
      global_step: The global step that numbers the checkpoints: the runtime's `step_counter` (read on the
        host) or a variable.
      items: Named trackables (task items, program state, host counters).
      variables: Model variables, also indexed under readable names and
        checked for NaN/Inf before each save.
      is_chief: Only the chief writes into `directory`. Every worker must
        save at the same steps (saving may run collective ops), so the others
        write to a temporary folder in `directory` that is removed at once.
      agree: Makes a flag the same on every worker (true if true on any), so
        time-based saves happen everywhere or nowhere.
    """
    self.directory = directory
    self.is_chief = is_chief
    self._agree = agree
    if isinstance(global_step, HostCounter):
      self._step = lambda: global_step.value
    else:
      self._step = lambda: int(global_step.numpy())
    self._variables = unique_variables([v for v in variables if tf.as_dtype(v.dtype).is_floating])
    self._items = {"global_step": global_step, "variables": VariableIndex(variables), **items}
    self._checkpoint = tf.train.Checkpoint(**self._items)
    # Host counters keep their value in Python between saves; each save first writes it where a save reads it.
    descendants = tf.train.TrackableView(self._checkpoint).descendants()
    self._counters = [t for t in descendants if isinstance(t, HostCounter)]
    # Train inputs, whose iterator states a save gathers from every worker first.
    self._inputs = [t for t in descendants if isinstance(t, SavedInput)]
    self._manager = None
    if is_chief:
      checkpoint_files.repair_pointer(directory)  # The manager cannot start on a garbled pointer.
      checkpoint_files.check_inside(directory)
      self._manager = tf.train.CheckpointManager(
        self._checkpoint,
        directory,
        max_to_keep=self.max_to_keep,
        keep_checkpoint_every_n_hours=self.keep_checkpoint_every_n_hours,
      )

  @property
  def latest(self) -> str | None:
    """Path prefix of the newest checkpoint, or None."""
    return tf.train.latest_checkpoint(self.directory)

  def checkpoints(self) -> list[str]:
    """Every checkpoint the directory's state file lists, oldest first."""
    return checkpoint_files.listed(self.directory) or []

  def restore(self, path: str | None = None) -> int | None:
    """Restores `path`, or else the newest checkpoint that can be read.

    A newest checkpoint that cannot be read (truncated, corrupt, missing) is
    skipped with a warning naming it, and the one before is restored; the
    candidates are the checkpoints the pointer lists and those whose files
    are in the folder.

    Returns:
      The restored global step, or None when there is no checkpoint.

    Raises:
      ConfigError: `path` was given and cannot be read, or no checkpoint in the
        directory can be read (a `ValueError`).
    """
    self.wait()
    candidates = [path] if path else checkpoint_files.restore_candidates(self.directory)
    if not candidates:
      logging.info("No checkpoint in %s: fresh start", self.directory)
      return None
    failures = []
    for candidate in candidates:
      try:
        status = self._restorer(candidate).restore(candidate)
        status.assert_existing_objects_matched()
        # State this run does not have (an evaluator restoring a trainer's input position) is fine.
        status.expect_partial()
      except Exception as e:  # A corrupt file fails in many ways (OpError, IndexError, ...).  # noqa: BLE001
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not tf.io.gfile.exists(f"{candidate}.index"):
          message = "its files are missing"
        if path:  # The one asked for: no other is tried, and the error names it.
          raise ConfigError(f"checkpoint '{path}' cannot be read ({message})") from None
        logging.warning("Skipping checkpoint %s: it cannot be read (%s)", candidate, message)
        failures.append(f"{candidate}: {message}")
        continue
      step = self._last_saved_step = self._step()
      self._last_saved_time = time.monotonic()
      logging.info("Restored %s at step %d", candidate, step)
      return step
    raise checkpoint_files.nothing_restorable(self.directory, failures)

  def _restorer(self, path: str) -> tf.train.Checkpoint:
    """What restores `path`: every item, or those it holds when this run has state added since it was written.

    State the checkpoint has no item for (an action or callback added to the run, state a later release saves)
    starts fresh, and the log says which; the model and optimizer a run needs were checked before
    (`compatibility`), so nothing the checkpoint should have restored is missed.
    """
    adopt_saved_names(self._items, path)  # A model built after others in this process: Keras' names moved on.
    added = sorted(set(self._items) - checkpoint_files.saved_items(path))
    if not added:
      return self._checkpoint
    logging.info(
      "Checkpoint %s holds no %s (added to the run since it was written): %s fresh",
      path,
      ", ".join(added),
      "it starts" if len(added) == 1 else "they start",
    )
    return tf.train.Checkpoint(**{name: item for name, item in self._items.items() if name not in added})

  def due(self) -> bool:
    """Whether the save policy asks for a save now: the same answer on every worker.

    Steps are the same on every worker; clocks are not, so a time-based save is agreed on (`agree`).
    """
    step = self._step()
    if step == self._last_saved_step:
      return False
    if self.save_interval_steps is not None and step - self._last_saved_step >= self.save_interval_steps:
      return True
    if self.save_interval_secs is None:
      return False
    return self._agree(time.monotonic() - self._last_saved_time >= self.save_interval_secs)

  def maybe_save(self) -> bool:
    """Saves if the policy says so; returns whether it saved."""
    return self.due() and self.save() is not None

  def save(self) -> str | None:
    """Saves now, unless this step is saved already; returns the path written.

    `before_save` runs first, so a checkpoint promises its step's outputs complete (decode records, summaries).

    Raises:
      NonFiniteCheckpointError: variables hold NaN/Inf; nothing was written.
    """
    step = self._step()
    if step == self._last_saved_step and self.latest is not None:
      return None
    if self.before_save is not None:
      self.before_save()
    if self.check_finite:
      self._check_finite(step)
    self._sync_counters(all_workers=True)
    if self.is_chief:
      path = self._manager.save(checkpoint_number=step, options=self._save_options())
    else:
      # Inside model_dir (nothing outside it is written), named as a temporary file: a dead worker's is removed
      # at the next start.
      scratch = temp_path(os.path.join(self.directory, "worker_checkpoint"))
      os.makedirs(scratch)
      try:
        path = self._checkpoint.write(os.path.join(scratch, f"ckpt-{step}"))
      finally:
        shutil.rmtree(scratch, ignore_errors=True)
    self._last_saved_step = step
    self._last_saved_time = time.monotonic()
    logging.info("Saved %s%s", path, " (writing in the background)" if self.async_save else "")
    return path

  def write_copy(self, prefix: str) -> str:
    """Writes the current state to `prefix` (outside the kept series); returns the path."""
    self._sync_counters(all_workers=False)
    return self._checkpoint.write(prefix)

  def _sync_counters(self, all_workers: bool) -> None:
    for counter in self._counters:
      counter.sync()
    for saved_input in self._inputs:
      saved_input.sync(all_workers)

  def _save_options(self) -> tf.train.CheckpointOptions:
    """Options of each write.

    A subclass may add write callbacks: they run after the files are complete
    and before the latest-checkpoint pointer moves.
    """
    return tf.train.CheckpointOptions(enable_async=self.async_save)

  def wait(self) -> None:
    """Waits for a background save; raises its error, if any."""
    if self._manager is not None and self.async_save:
      self._manager.sync()
      # The helper keeps a background error until the next call into it.
      helper = getattr(self._checkpoint, "_async_checkpointer_impl", None)
      if helper is not None:
        helper._check_async_thread_error()

  def _check_finite(self, step: int) -> None:
    if not self._variables:
      return
    finite = _all_finite(self._variables).numpy()
    bad = [variable_name(v) for v, ok in zip(self._variables, finite) if not ok]
    if bad:
      shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
      raise NonFiniteCheckpointError(
        f"Not saving the checkpoint of step {step}: {shown} hold NaN or Inf; "
        f"the latest checkpoint stays {self.latest}"
      )


@tf.function
def _all_finite(variables):
  return tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in variables])
