"""What every mode of the executor shares: its parts, the programs it started, and the host work around them.

`ExecutorBase` is the executor below its modes: `executor.py` constructs it (`Executor.__init__`, the gin
configurable) and adds the modes; the modules the modes are made of (`startup.py`, `continuous.py`, `dry_run.py`,
`export.py`) work on an `ExecutorBase`, so imports point one way: executor.py -> those modules -> this one.
"""

from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

from executor import checkpoint_files
from executor.actions import Action
from executor.checkpoints import Checkpointer
from executor.command_record import CommandRecord
from executor.preemption import StopRequest, worker_losses
from executor.rollback import Rollbacks
from executor.schedule import CycleResult, SimpleProgramSchedule
from executor.warm_start import WarmStart
from programs.core.analysis import unique_variables
from programs.core.errors import ConfigError
from programs.core.metric_writers import MultiWriter
from programs.core.runtime import Runtime
from programs.core.task import Task
from programs.program import Program


class ExecutorBase:
  """The parts of a run (set by `Executor.__init__`) and what every mode does with them.

  Attributes:
    model_dir: Where checkpoints, summaries and analysis go.
    max_steps: Where training ends.
    runtime: The runtime (strategy, global step).
    schedule: The schedule of programs.
    tasks: The tasks of the schedule.
    checkpointer: Saves and restores the run's state.
    warm_start: Initialises a fresh run, or None.
    actions: What runs around the cycles while training.
    eval_timeout_secs: Continuous evaluation ends after this long without a new checkpoint.
    eval_poll_secs: How often continuous evaluation looks for one.
    rollbacks: The rollback count of a run with `non_finite_policy='rollback'`.
    executor_writer: The executor's own summaries (set at start-up).
    programs: The programs the running mode started.
    stop: Set by a signal, an action or a program to end the run after the current loop.
    command_record: How the command configured the run (set by the CLI): a training run's chief writes it.
  """

  model_dir: str
  max_steps: int
  runtime: Runtime
  schedule: SimpleProgramSchedule
  tasks: list[Task]
  checkpointer: Checkpointer
  warm_start: WarmStart | None
  actions: list[Action]
  eval_timeout_secs: float
  eval_poll_secs: float
  rollbacks: Rollbacks
  executor_writer: MultiWriter | None
  programs: list[Program]
  stop: StopRequest
  command_record: CommandRecord | None = None

  @property
  def variables(self) -> list[tf.Variable]:
    """The model variables of every task (shared ones once)."""
    return unique_variables([v for task in self.tasks for v in task.variables])

  def optimizers(self) -> dict:
    """{checkpoint item path: optimizer} of every task (`Task.checkpoint_optimizers`)."""
    prefix = (lambda t: f"{t.name}_") if len(self.tasks) > 1 else (lambda t: "")
    return {f"{prefix(t)}{item}": o for t in self.tasks for item, o in t.checkpoint_optimizers().items()}

  def eval_programs(self) -> list[Program]:
    """The schedule's eval and decode programs (what the evaluation modes run); fails when there are none."""
    if not self.schedule.eval_programs:
      raise ConfigError("evaluation needs eval or decode programs (SimpleProgramSchedule.eval_programs)")
    return list(self.schedule.eval_programs)

  def run_evals(self) -> CycleResult:
    """Runs every eval and decode program once on the current weights.

    Returns once their host work (decode post-processing) is done and every writer is flushed: what the
    evaluation wrote is on disk, so a continuous evaluator may record the checkpoint as evaluated.
    """
    cycle = self.cycle(steps_left=None, evals_only=True)
    self._finish_outputs()
    return cycle

  def cycle(
    self, steps_left: int | None, extra: dict[str, float] | None = None, evals_only: bool = False
  ) -> CycleResult:
    """Runs one cycle of the schedule (or its evals only) and writes the executor's timings of it."""
    start = time.perf_counter()
    if evals_only:
      cycle = self.schedule.run_evals(None)
    else:
      cycle = self.schedule.run(
        steps_left, should_stop=self.should_stop, after_train_loop=self._after_train_loop
      )
    cycle.step = self.runtime.step()
    cycle.programs = {p.name: p for p in self.programs}
    scalars = {f"{kind}_secs": secs for kind, secs in cycle.secs.items()}
    scalars["cycle_secs"] = time.perf_counter() - start + sum((extra or {}).values())
    scalars.update(extra or {})
    self.executor_writer.scalars(scalars, cycle.step)
    return cycle

  def _after_train_loop(self, result) -> None:
    for action in self.actions:
      action.after_train_loop(result)

  def settle(self) -> None:
    """Makes complete on disk what a checkpoint of the current step promises (the checkpointer's `before_save`).

    Waits for the asynchronous decode post-processing (its records and scalars) and flushes every writer, so a
    run killed after the save has nothing of the saved step left to redo, and a failed post-processing (a full
    disk) fails the save instead of being lost.
    """
    for program in self.programs:
      if program.busy():
        logging.info(
          "The checkpoint of step %d waits for %s's post-processing", self.runtime.step(), program.name
        )
    self._finish_outputs()

  def _finish_outputs(self) -> None:
    """Waits for every program's host work, then flushes every writer."""
    for program in self.programs:
      program.wait()
    for writer in self.writers():
      writer.flush()

  def restart_writers(self, step: int) -> None:
    """Every writer starts a session resumed from `step`: what was written after it is forgotten.

    Pending host work (a decode of a step past `step`, on a rollback) is finished first, so none of it lands
    after the cut. See `MetricWriter.restart`.
    """
    for program in self.programs:
      program.wait()
    for writer in self.writers():
      writer.restart(step)

  def writers(self) -> list[MultiWriter]:
    """The writers of the programs (and their parts) and the executor's."""
    writers = [part.writer for p in self.programs for part in p.parts() if part.writer is not None]
    return writers + ([self.executor_writer] if self.executor_writer is not None else [])

  def kept_steps(self) -> set[int]:
    """Steps of the kept checkpoints and of those actions keep (best checkpoints): their outputs stay."""
    steps = {checkpoint_files.step_of(path) for path in self.checkpointer.checkpoints()}
    for action in self.actions:
      steps.update(action.kept_steps())
    return steps

  def _worker_losses(self):
    """A worker lost mid-run ends this one with one `WorkerLostError` (see `executor.preemption`)."""
    return worker_losses(
      self.runtime, lambda: self.checkpointer.latest if self.checkpointer.directory else None
    )

  def should_stop(self) -> bool:
    """Whether a stop was asked for (signal, action, another worker); the same answer on every worker."""
    return self.runtime.any_worker(self.stop())
