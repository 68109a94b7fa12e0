"""The executor: restore, compile, cycle the schedule, save, stop.

Where the work happens, top down:
  executor.cli.main                  the command line: --mode picks one of the modes below
  Executor                           this file: the modes
    .train                           the train loop, here
    .evaluate                        here; .evaluate_continuously: continuous.py; .dry_run: dry_run.py;
    .export, .load_model             export.py
    every mode starts in startup.py  (runtime built, programs prepared, checkpoint restored)
    and shares base.py               (ExecutorBase: one cycle of the schedule, writers, stops)
      -> SimpleProgramSchedule.run   executor/schedule.py
        -> TrainProgram.run          programs/train.py
        -> EvalProgram.run           programs/eval.py
        -> DecodeProgram.run         programs/decode.py
          -> compiled loop function  programs/loop.py (the on-device loop)
Imports point down this list: the modules of the modes take an `ExecutorBase`, never this file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import gin
import tensorflow as tf
from absl import logging

from executor import checkpoint_files, hparams
from executor import export as exporting
from executor.actions import Action, ActionContext
from executor.base import ExecutorBase
from executor.checkpoints import Checkpointer
from executor.continuous import evaluate_continuously
from executor.dry_run import dry_run
from executor.keras_callbacks import callback_actions
from executor.model_dir import check_model_dir
from executor.preemption import StopRequest
from executor.progress import Progress
from executor.rollback import Rollbacks
from executor.schedule import CycleResult, SimpleProgramSchedule
from executor.startup import started
from executor.warm_start import WarmStart
from programs.core.errors import ConfigError, check_value
from programs.core.metric_writers import MultiWriter
from programs.core.runtime import Runtime
from programs.core.task import Task
from programs.program import Program
from programs.train import NonFiniteLossError


@gin.configurable
class Executor(ExecutorBase):
  """Runs one task's schedule of programs over one runtime: train, evaluate once, or evaluate continuously.

  Construction instantiates (and so validates) the task, the programs and the actions; nothing touches the disk
  or the devices until a mode runs. Each Executor runs one mode, once.
  """

  def __init__(
    self,
    model_dir: str,
    task: Task | None = None,
    schedule: Callable[..., SimpleProgramSchedule] = SimpleProgramSchedule,
    runtime: Runtime | None = None,
    checkpointer: Checkpointer | None = None,
    max_steps: int = 1000,
    warm_start: WarmStart | None = None,
    actions: Sequence[Action] = (),
    eval_timeout_secs: float = 3600.0,
    eval_poll_secs: float = 5.0,
  ):
    """Builds the objects of a run.

    Args:
      model_dir: Where checkpoints, summaries and analysis go.
      task: The task (bind `Executor.task = @MyTask()` in gin); None with a
        schedule that holds its own tasks (`MultiTaskProgramSchedule`).
      schedule: Factory of the schedule, called with `task=` (or with no
        argument when `task` is None).
      runtime: The runtime; a default one (default strategy) when None.
      checkpointer: The checkpointer; a default one when None.
      max_steps: Training ends when the global step reaches this; continuous
        evaluation ends after the checkpoint of this step.
      warm_start: Initialises a run whose model_dir has no checkpoint yet.
      actions: What the run does around its cycles while training
        (`EarlyStopping`, `BestCheckpoints`, `Profiler`, your own `Action`s),
        called in this order, after what a `KerasTask`'s `callbacks` become
        (`executor/keras_callbacks.py`). A `Progress` action is added first unless the
        list has one.
      eval_timeout_secs: Continuous evaluation ends after this long without
        a new checkpoint.
      eval_poll_secs: How often continuous evaluation looks for one.
    """
    check_model_dir(model_dir)
    check_value("Executor.max_steps", max_steps, integer=True, minimum=0)
    check_value("Executor.eval_timeout_secs", eval_timeout_secs, minimum=0)
    check_value("Executor.eval_poll_secs", eval_poll_secs, minimum=0)
    if task is not None and not isinstance(task, Task):
      raise ConfigError(f"Executor.task must be a Task instance (e.g. @MyTask()), got {task!r}")
    self.model_dir = model_dir
    self.max_steps = max_steps
    self.runtime = runtime or Runtime()
    self.schedule = schedule(task=task) if task is not None else schedule()
    self.tasks: list[Task] = list(getattr(self.schedule, "tasks", [task]))
    if not all(isinstance(t, Task) for t in self.tasks):
      raise ConfigError(
        "Executor.task is required (e.g. Executor.task = @MyTask()) unless the schedule has its tasks"
      )
    self.checkpointer = checkpointer or Checkpointer()
    self.warm_start = warm_start
    self.actions = list(actions)
    for action in self.actions:
      if not isinstance(action, Action):
        raise ConfigError(
          f"Executor.actions holds {action!r}, which is not an Action (e.g. @EarlyStopping())"
        )
      action.validate([p.name for p in self.schedule.programs])
    # A KerasTask's Keras callbacks, as the executor's own actions (or refused here, in one line), first: an
    # EarlyStopping that restores the best weights does so before any other action's end (an export).
    self.actions = callback_actions(self.tasks, self.schedule, self.actions, model_dir) + self.actions
    if not any(isinstance(a, Progress) for a in self.actions):
      self.actions.insert(0, Progress())
    self.eval_timeout_secs, self.eval_poll_secs = eval_timeout_secs, eval_poll_secs
    self.rollbacks = Rollbacks()
    self.executor_writer: MultiWriter | None = None
    self.programs: list[Program] = []
    self.stop = StopRequest()

  # ----- Modes ------------------------------------------------------------------

  def run(self) -> int:
    """The mode the configuration says: `train`, or `evaluate` once for a schedule without train loops.

    `SimpleProgramSchedule.train_executions_per_eval = 0` is the older spelling of `--mode=eval`. Returns the
    global step at the end.
    """
    if self.schedule.trains:
      return self.train()
    self.evaluate()
    return self.runtime.step()

  def train(self) -> int:
    """Trains to `max_steps` from the latest checkpoint (or a warm start); returns the final global step.

    SIGTERM or a first Ctrl-C ends the run after the current train loop, with a checkpoint; the return is then
    normal.
    """
    if not self.schedule.trains:
      raise ConfigError(
        "the schedule has no train loops (SimpleProgramSchedule.train_executions_per_eval = 0): evaluate instead"
      )
    with started(self, self.schedule.programs, trains=True):
      self._train_loop()
    return self.runtime.step()

  def evaluate(self, checkpoint_path: str | None = None) -> dict[str, dict[str, float]]:
    """Runs every eval and decode program once on a checkpoint; returns their metrics by program.

    Args:
      checkpoint_path: The checkpoint to evaluate; model_dir's latest when None. Nothing of the training state
        is written, so the model_dir may be one a training run is using.
    """
    if checkpoint_path and not tf.io.gfile.exists(f"{checkpoint_path}.index"):
      raise ConfigError(
        f"--checkpoint_path '{checkpoint_path}': no checkpoint there ('{checkpoint_path}.index')"
      )
    if checkpoint_path:
      try:
        tf.train.list_variables(checkpoint_path)
      except (tf.errors.OpError, ValueError) as e:
        what = " ".join(str(e).split())[:300]
        raise ConfigError(f"--checkpoint_path '{checkpoint_path}' cannot be read ({what})") from None
    else:
      directory = os.path.join(self.model_dir, "checkpoints")
      if not checkpoint_files.restore_candidates(directory):
        raise ConfigError(
          f"no checkpoint to evaluate in '{directory}': is --model_dir '{self.model_dir}' the training run's? "
          "(or name one with --checkpoint_path)"
        )
    with started(self, self.eval_programs(), trains=False, restore=checkpoint_path or True):
      cycle = self.run_evals()
    return {name: cycle.metrics(name) for name in cycle.results}

  def evaluate_continuously(self, watch_dir: str) -> int:
    """Evaluates every new checkpoint of a training run's model_dir once; see `executor/continuous.py`."""
    return evaluate_continuously(self, watch_dir)

  def dry_run(
    self, mode: str = "train", checkpoint_path: str | None = None, watch_dir: str | None = None
  ) -> str:
    """Checks and compiles what `mode` would run and returns the plan, writing nothing; see `executor/dry_run.py`."""
    return dry_run(self, mode, checkpoint_path, watch_dir)

  def load_model(self, checkpoint_path: str | None = None) -> Task:
    """The task built, with the weights of a checkpoint (model_dir's latest when None), for notebooks and scripts.

    Nothing is written. Build the executor from the run's config, e.g. after
    `gin.parse_config_file(os.path.join(model_dir, 'operative_config.gin'))`; with several tasks, returns the
    first (all are restored: `self.tasks`).
    """
    exporting.restore_tasks(self, checkpoint_path)
    return self.tasks[0]

  def export(self, checkpoint_path: str | None = None, export_dir: str | None = None) -> str:
    """Writes a SavedModel of a checkpoint (model_dir's latest when None); returns its path.

    Args:
      checkpoint_path: The checkpoint to export.
      export_dir: The SavedModel goes to `export_dir/<step>`; `model_dir/export` when None.
    """
    exporting.restore_tasks(self, checkpoint_path)
    return exporting.export(self, export_dir)

  # ----- Training -----------------------------------------------------------------------

  def _train_loop(self) -> None:
    context = ActionContext(
      self.model_dir,
      self.runtime.step(),
      self.max_steps,
      self.runtime.is_chief,
      self.checkpointer,
      export=lambda export_dir: exporting.export(self, export_dir),
    )
    try:
      for action in self.actions:
        action.start(context)
      while self.runtime.step() < self.max_steps and not self.should_stop():
        for action in self.actions:
          action.before_cycle(self.runtime.step())
        start = time.perf_counter()
        self.checkpointer.maybe_save()
        checkpoint_secs = time.perf_counter() - start
        try:
          cycle = self.cycle(self.max_steps - self.runtime.step(), extra={"checkpoint_secs": checkpoint_secs})
        except NonFiniteLossError as error:
          self.rollbacks(error, self.checkpointer, self.executor_writer, self.restart_writers)
          continue
        self._after_cycle(cycle)
    finally:
      for action in self.actions:
        action.close()
    start = time.perf_counter()
    self.checkpointer.save()
    self.checkpointer.wait()
    if self.runtime.is_chief:
      self.settle()  # Every eval and decode scalar on disk, then the best of each.
      hparams.write_best(self.model_dir, self.runtime.step())
    how = f"stopped by {self.stop.reason or 'another worker'}" if self.should_stop() else "done"
    logging.info(
      "Final checkpoint at step %d in %.2fs (%s)", self.runtime.step(), time.perf_counter() - start, how
    )

  def _after_cycle(self, cycle: CycleResult) -> None:
    """Programs' own stop reasons (a quality target reached), then every action's."""
    reasons = [program.stop_reason() for program in self.programs]
    reasons += [action(cycle) for action in self.actions]
    for reason in reasons:
      if reason:
        self.stop.request(reason)
