"""What leaves a run: the task with restored weights, and SavedModels of its inference.

`executor export --model_dir=DIR` and the `Exporter` action write `export_dir/<step>/`, a SavedModel whose
`serving_default` signature runs the task's inference (`Task.serving_functions`, or Keras' own export for a
`KerasTask`) over the decode split's batches, on the EMA weights when the decode program uses them. Each export is
written to a temporary folder beside its place, then renamed: a reader sees a whole SavedModel or none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from typing import TYPE_CHECKING

import gin
import tensorflow as tf
from absl import logging

from executor import compatibility
from executor.actions import Action, ActionContext
from executor.model_dir import check_directories
from executor.schedule import CycleResult
from executor.watchers import _MetricWatch
from programs.core.errors import ConfigError
from programs.core.files import write_atomically
from programs.core.saved_names import adopt_saved_names
from programs.core.task import Task
from programs.eval import SplitProgram

if TYPE_CHECKING:
  from executor.base import ExecutorBase

EXPORT_DIR = "export"
RECORD = "exports.json"  # The exports the Exporter wrote, in model_dir: the only ones its rotation deletes.
_TEMP = re.compile(r"^\.export-(?P<step>\d+)\.(?P<pid>\d+)\.tmp$")


def restore_tasks(executor: ExecutorBase, checkpoint_path: str | None = None) -> int:
  """Builds the executor's tasks and reads the weights of a checkpoint into them; returns its global step.

  Only what the tasks hold (model, optimizer, EMA) and the global step are read; nothing is written.

  Args:
    executor: An executor not yet started.
    checkpoint_path: The checkpoint; the latest of `model_dir/checkpoints` when None.

  Raises:
    ConfigError: there is no checkpoint, or it does not fit the tasks' model.
  """
  directory = os.path.join(executor.model_dir, "checkpoints")
  path = checkpoint_path or tf.train.latest_checkpoint(directory)
  if path is None:
    raise ConfigError(f"model_dir '{executor.model_dir}' has no checkpoint in '{directory}'")
  if not tf.io.gfile.exists(f"{path}.index"):
    raise ConfigError(f"--checkpoint_path '{path}': no checkpoint there ('{path}.index')")
  runtime = executor.runtime
  if runtime.global_step is None:
    runtime.build(executor.tasks)
  compatibility.check(path, executor.model_dir, executor.variables, executor.optimizers())
  items = {}
  for task in executor.tasks:
    prefix = f"{task.name}_" if len(executor.tasks) > 1 else ""
    task.restore_before_trace(path, prefix)  # What an export's traces capture as constants (vocabularies).
    items.update({prefix + k: v for k, v in task.checkpoint_items().items()})
  adopt_saved_names(items, path)  # A model built after others in this process: Keras' names moved on.
  tf.train.Checkpoint(global_step=runtime.step_counter, **items).read(path).expect_partial()
  logging.info("Restored the weights of %s (step %d)", path, runtime.step())
  return runtime.step()


def serving_program(executor: ExecutorBase) -> SplitProgram:
  """The program whose split (and EMA choice) an export serves: the first decode program, else any with a split."""
  programs = [p for p in executor.schedule.programs if isinstance(p, SplitProgram)]
  decodes = [p for p in programs if p.kind == "decode"]
  if not decodes and not programs:
    raise ConfigError(
      "export needs a decode or eval program in the schedule: its split is the input signature"
    )
  return (decodes or programs)[0]


def export(executor: ExecutorBase, export_dir: str | None = None) -> str:
  """Writes a SavedModel of the current weights of the executor's task to `export_dir/<step>`; returns its path.

  The weights are the EMA's when the serving program (`serving_program`) runs with `use_ema`. An export of a
  step already exported is not redone; a folder of its step holding no SavedModel is refused, never trusted.
  """
  program = serving_program(executor)
  task: Task = program.task
  export_dir = export_dir or os.path.join(executor.model_dir, EXPORT_DIR)
  step = executor.runtime.step()
  final = os.path.join(export_dir, str(step))
  if os.path.lexists(final):
    if os.path.islink(final) or not os.path.isfile(os.path.join(final, "saved_model.pb")):
      raise ConfigError(
        f"'{final}' is in the way of the export of step {step}: it holds no SavedModel (no saved_model.pb); "
        "move it away"
      )
    logging.info("Step %d is exported already: %s", step, final)
    return final
  created = _missing_folders(export_dir)
  os.makedirs(export_dir, exist_ok=True)
  remove_dead_exports(export_dir)
  temp = os.path.join(export_dir, f".export-{step}.{os.getpid()}.tmp")
  shutil.rmtree(temp, ignore_errors=True)
  weights = task.ema.averaged() if program.use_ema and task.ema is not None else contextlib.nullcontext()
  try:
    with weights:
      signatures = task.export(temp, program.split)
    os.rename(temp, final)
  except BaseException:
    shutil.rmtree(temp, ignore_errors=True)
    for folder in created:  # A refused export (nothing to serve) leaves no empty folder behind.
      with contextlib.suppress(OSError):
        os.rmdir(folder)
    raise
  finally:
    shutil.rmtree(temp, ignore_errors=True)
  logging.info(
    "Exported step %d (%s weights, split '%s') to %s: signatures %s",
    step,
    "EMA" if program.use_ema else "live",
    program.split,
    final,
    ", ".join(signatures),
  )
  return final


def _missing_folders(path: str) -> list[str]:
  """The folders `os.makedirs(path)` would create, deepest first."""
  missing = []
  path = os.path.abspath(path)
  while not os.path.lexists(path):
    missing.append(path)
    path = os.path.dirname(path)
  return missing


def exports(export_dir: str) -> list[str]:
  """The finished exports in `export_dir`, oldest step first."""
  if not os.path.isdir(export_dir):
    return []
  steps = sorted(int(n) for n in os.listdir(export_dir) if n.isdigit())
  return [os.path.join(export_dir, str(s)) for s in steps]


def remove_dead_exports(export_dir: str) -> None:
  """Deletes the temporary folders of exports whose process is gone (killed mid-export)."""
  for name in os.listdir(export_dir):
    match = _TEMP.match(name)
    if match and not _alive(int(match.group("pid"))):
      shutil.rmtree(os.path.join(export_dir, name), ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


@gin.configurable
class Exporter(Action):
  """An action that exports SavedModels while training: at the end, every N saves, at each new best metric.

  Exports go to `export_dir/<step>/` (default `model_dir/export`); the newest `keep` stay, older ones are deleted.
  The best value and the saves counted are checkpointed: a resumed run exports only on a real improvement.
  """

  def __init__(
    self,
    at_end: bool = True,
    every_n_saves: int | None = None,
    program: str | None = None,
    metric: str = "loss",
    mode: str = "min",
    keep: int = 3,
    export_dir: str | None = None,
  ):
    """Configures when to export.

    Args:
      at_end: Export when training ends (also on a clean stop).
      every_n_saves: Export after every this many checkpoint saves (None: not by saves).
      program: With a program name (e.g. 'eval_test'), also export each time its `metric` improves.
      metric: The metric watched with `program`.
      mode: 'min' or 'max': which way `metric` improves.
      keep: Exports kept; the oldest are deleted.
      export_dir: Where the exports go; `model_dir/export` when None.
    """
    if every_n_saves is not None and (isinstance(every_n_saves, bool) or every_n_saves < 1):
      raise ConfigError(f"Exporter.every_n_saves must be an integer >= 1 or None, got {every_n_saves!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
      raise ConfigError(f"Exporter.keep must be an integer >= 1, got {keep!r}")
    if mode not in ("min", "max"):
      raise ConfigError(f"Exporter.mode must be 'min' or 'max', got {mode!r}")
    if program is not None and (not isinstance(program, str) or not program):
      raise ConfigError(f"Exporter.program must be a program name or None, got {program!r}")
    self.at_end, self.every_n_saves, self.keep, self.export_dir = at_end, every_n_saves, keep, export_dir
    self.watch = _MetricWatch(program, metric, mode, "Exporter") if program else None
    self.state: tf.Module | None = None
    self._context: ActionContext | None = None
    self._saves_seen: set[str] = set()
    self._directory = self._record = ""

  def validate(self, program_names):
    if self.watch is not None:
      self.watch.check(list(program_names))

  def validate_start(self, model_dir, metric_names):
    """Refuses a metric typo, an export folder that is a link or a file, and a damaged record of exports."""
    if self.watch is not None:
      self.watch.check_metric(metric_names)
    self._directory = self.export_dir or os.path.join(model_dir, EXPORT_DIR)
    self._record = os.path.join(model_dir, RECORD)
    check_directories([self._directory], files=[self._record])
    self._written()

  def checkpoint_items(self):
    """The best value so far and the saves since the last export, so a resumed run goes on counting."""
    if self.state is None:
      self.state = tf.Module(name="exporter")
      self.state.best = tf.Variable(float("nan"), dtype=tf.float64, trainable=False, name="best")
      self.state.saves = tf.Variable(0, dtype=tf.int64, trainable=False, name="saves")
    return {"exporter": self.state}

  def start(self, context: ActionContext) -> None:
    self._context = context
    self._directory = self.export_dir or os.path.join(context.model_dir, EXPORT_DIR)
    self._record = os.path.join(context.model_dir, RECORD)
    self._saves_seen = set(context.checkpointer.checkpoints())

  def __call__(self, cycle: CycleResult) -> None:
    due = False
    if self.every_n_saves is not None:
      current = set(self._context.checkpointer.checkpoints())
      self.state.saves.assign_add(len(current - self._saves_seen))
      self._saves_seen |= current
      if int(self.state.saves.numpy()) >= self.every_n_saves:
        self.state.saves.assign(0)
        due = True
    if self.watch is not None:
      value = self.watch.value(cycle)
      if value is not None and self.watch.better(value, float(self.state.best.numpy())):
        self.state.best.assign(value)
        due = True
    if due:
      self._export()

  def close(self) -> None:
    # Called from the run's `finally`: a run that fails (an exception on its way out) exports nothing.
    if self.at_end and self._context is not None and sys.exc_info()[0] is None:
      self._export()

  def _written(self) -> list[str]:
    """The exports this model_dir's runs wrote (the record `model_dir/exports.json`), oldest first.

    Raises:
      ConfigError: the record is not a JSON list of paths.
    """
    if not os.path.lexists(self._record):
      return []
    try:
      with open(self._record) as f:
        written = json.load(f)
    except (OSError, ValueError) as e:
      raise ConfigError(f"Exporter: '{self._record}' is unreadable ({e}): fix or remove it") from None
    if not isinstance(written, list) or not all(isinstance(p, str) for p in written):
      raise ConfigError(f"Exporter: '{self._record}' must hold a JSON list of export paths, got {written!r}")
    return written

  def _export(self) -> None:
    context = self._context
    if context is None or not context.is_chief or context.export is None:
      return
    before = {os.path.abspath(p) for p in exports(self._directory)}
    path = os.path.abspath(context.export(self.export_dir))
    written = self._written()
    if path not in before and path not in written:
      written.append(path)
    # Only exports a run of this model_dir wrote rotate out: a user's or another run's folders stay, and a link
    # is never followed. Paths are absolute: a resume from another working folder still finds its own.
    ours = [
      p for p in map(os.path.abspath, exports(self._directory)) if p in written and not os.path.islink(p)
    ]
    old = ours[: -self.keep]
    written = [p for p in written if p not in old]
    write_atomically(self._record, json.dumps(written, indent=1))
    for folder in old:
      shutil.rmtree(folder, ignore_errors=True)
