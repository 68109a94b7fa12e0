"""Starting a run: the runtime built, the programs prepared, the checkpoint checked and restored; closing it.

What every mode of the `Executor` does before its first program runs, in this order: build the runtime (every
variable), validate the programs, refuse a checkpoint that does not fit (before anything is written), create
model_dir and lock it (training), prepare every program (build, set up, trace), attach and restore the checkpoint,
apply a warm start to a fresh run, describe the run (model analysis, operative config, compile times, how the
command configured it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import tensorflow as tf
from absl import logging

from executor import checkpoint_files, command_record, compatibility, hparams
from executor.lock import ModelDirLock
from executor.model_dir import check_directories, describe_run
from programs.core.errors import ConfigError
from programs.core.files import remove_dead_temp_files, write_atomically
from programs.core.metric_writers import METRICS_FILE, program_writer
from programs.core.summaries import program_logdir
from programs.program import Program

if TYPE_CHECKING:
  from executor.base import ExecutorBase


@contextlib.contextmanager
def started(
  executor: ExecutorBase,
  programs: Sequence[Program],
  trains: bool,
  restore: bool | str = True,
  checkpoint_dir: str | None = None,
  lock: bool | None = None,
) -> Iterator[None]:
  """The runtime built, `programs` prepared, the checkpoint restored; everything closed on the way out.

  Args:
    executor: The executor whose mode starts.
    programs: The programs this mode runs.
    trains: Whether the mode writes training state (then model_dir is locked and a warm start may apply).
    restore: True: model_dir's latest checkpoint; a path: that checkpoint; False: none (the mode restores).
    checkpoint_dir: Where the checkpoints are: model_dir's `checkpoints/` when None.
    lock: Hold model_dir's lock for the run (a second one is refused); None: when training.
  """
  if executor.programs:
    raise RuntimeError("an Executor runs one mode, once")
  executor.programs = list(programs)
  executor.runtime.build(executor.tasks)
  for program in executor.programs:
    program.validate(executor.runtime)
  if restore:
    checkpoint = (
      restore if isinstance(restore, str) else _newest_with_files(checkpoint_dir or _checkpoints(executor))
    )
    compatibility.check(checkpoint, executor.model_dir, executor.variables, executor.optimizers())
    if checkpoint:  # Before any input pipeline is built: they are built with the seeds of the run resumed.
      executor.runtime.resume_input_seed(checkpoint)
      for task in executor.tasks:  # Before any trace: what traces capture as constants (vocabularies).
        task.restore_before_trace(checkpoint, f"{task.name}_" if len(executor.tasks) > 1 else "")
  elif checkpoint_dir:
    # A continuous evaluator restores each checkpoint itself: the newest must fit the model.
    watched = _newest_with_files(checkpoint_dir)
    compatibility.check(watched, os.path.dirname(checkpoint_dir), executor.variables, executor.optimizers())
  if trains and executor.warm_start is not None:
    executor.warm_start.resolve()
  # Nothing was written before this point; only the chief writes into model_dir.
  chief = executor.runtime.is_chief
  folders = [os.path.join(executor.model_dir, name) for name in ("checkpoints", "executor")] + [
    program_logdir(executor.model_dir, p.name) for p in executor.programs
  ]
  if trains:
    folders.append(os.path.join(executor.model_dir, hparams.BEST))
  files = [os.path.join(f, METRICS_FILE) for f in folders[1:]]
  if trains:
    files.append(os.path.join(executor.model_dir, command_record.FILE))
  check_directories(folders, files=files)
  # A model_dir this start-up creates is removed if start-up is refused (a bad dataset, metric or checkpoint is
  # found only once the programs are traced or the checkpoint read): a refused run leaves nothing behind.
  created = chief and not os.path.lexists(executor.model_dir)
  starting = True
  try:
    if chief:
      os.makedirs(executor.model_dir, exist_ok=True)
    # An evaluation writes no train state, so it may share a busy model_dir.
    held = ModelDirLock(executor.model_dir) if (trains if lock is None else lock) and chief else None
    with held or contextlib.nullcontext(), executor.stop:
      try:
        if chief:  # What killed runs left: their temporary files (and, under the lock, TF's save leftovers).
          removed = remove_dead_temp_files(executor.model_dir)
          if trains and held is not None:
            removed += checkpoint_files.remove_leftovers(checkpoint_dir or _checkpoints(executor))
          if removed:
            logging.info(
              "Removed %d temporary files of killed runs: %s", len(removed), ", ".join(removed[:5])
            )
        executor.schedule.build(executor.runtime)
        compile_secs = {
          f"compile_secs/{p.name}": p.prepare(executor.runtime, executor.model_dir) for p in executor.programs
        }
        for program in executor.programs:
          for part in program.parts():
            part.keep_steps = executor.kept_steps
        # Metric names are known once traced: a watcher's typo fails before the restore and any step.
        if trains:
          names = {p.name: p.metric_names() for p in executor.programs}
          for action in executor.actions:
            action.validate_start(executor.model_dir, names)
        _attach_checkpointer(executor, checkpoint_dir, trains)
        restored = executor.checkpointer.restore(None if restore is True else restore) if restore else None
        for program in executor.programs:
          program.restored()
        starting = False  # From here on the run writes its records.
        if restored is None and trains and executor.warm_start is not None:
          report = executor.warm_start.apply(executor.variables)
          if chief:
            write_atomically(os.path.join(executor.model_dir, "warm_start.txt"), report.text())
        executor.executor_writer = program_writer(executor.model_dir, "executor", enabled=chief)
        step = executor.runtime.step()
        # The session resumes from the restored step: what a killed run wrote after it is forgotten.
        if trains:
          executor.restart_writers(step)
        if chief:
          describe_run(
            executor.model_dir,
            executor.variables,
            executor.executor_writer,
            step,
            prefix="" if trains else "eval_",
          )
        if chief and trains:
          hparams.write_hparams(executor.model_dir, hparams.gin_hparams(), step)
          if executor.command_record is not None:
            executor.command_record.write(executor.model_dir)
        executor.executor_writer.scalars(compile_secs, step)
        yield
        for program in executor.programs:
          program.wait()
      finally:
        for program in executor.programs:
          program.close()
        if executor.executor_writer is not None:
          executor.executor_writer.close()
        executor.checkpointer.wait()
  except ConfigError:
    if created and starting:
      shutil.rmtree(executor.model_dir, ignore_errors=True)
    raise


def _attach_checkpointer(executor: ExecutorBase, checkpoint_dir: str | None, trains: bool) -> None:
  items = dict(executor.schedule.checkpoint_items())
  items.update(executor.runtime.checkpoint_items())
  for task in executor.tasks:
    prefix = f"{task.name}_" if len(executor.tasks) > 1 else ""
    items.update({prefix + k: v for k, v in task.checkpoint_items().items()})
  for program in executor.programs:
    items.update(program.checkpoint_items())
  if trains:
    items.update(executor.rollbacks.checkpoint_items())
    for action in executor.actions:
      items.update(action.checkpoint_items())
  if trains:
    executor.checkpointer.before_save = executor.settle
  executor.checkpointer.attach(
    checkpoint_dir or os.path.join(executor.model_dir, "checkpoints"),
    executor.runtime.step_counter,
    items,
    executor.variables,
    is_chief=executor.runtime.is_chief,
    agree=executor.runtime.any_worker,
  )


def _checkpoints(executor: ExecutorBase) -> str:
  return os.path.join(executor.model_dir, "checkpoints")


def _newest_with_files(directory: str) -> str | None:
  """The checkpoint a restore would try first (None: a fresh start).

  Raises:
    ConfigError: the pointer promises checkpoints whose files are all gone; raised before anything is written.
  """
  candidates = checkpoint_files.restore_candidates(directory)
  present = [c for c in candidates if tf.io.gfile.exists(f"{c}.index")]
  if candidates and not present:
    raise checkpoint_files.nothing_restorable(directory, [f"{c}: its files are missing" for c in candidates])
  return present[0] if present else None
