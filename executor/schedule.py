"""Schedules: which programs run, in what order, in one cycle."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import gin

from programs.core.errors import ConfigError
from programs.core.results import ProgramResult
from programs.core.runtime import HostCounter
from programs.core.task import Task
from programs.program import Program
from programs.train import TrainProgram

# Polled after every train loop: end the cycle there?
StopCheck = Callable[[], bool]
# Called with each train loop's result (progress, profiling).
OnTrainLoop = Callable[[ProgramResult], None]


def never_stop() -> bool:
  """The default `StopCheck`: no stop."""
  return False


def ignore_result(result: ProgramResult) -> None:
  """The default `OnTrainLoop`: nothing."""


@dataclasses.dataclass
class CycleResult:
  """What one cycle of a schedule did.

  Attributes:
    secs: Seconds per program kind (`train`, `eval`, `decode`).
    results: Each program's result, by program name (the last train run's).
    step: The global step after the cycle (set by the executor).
    programs: The programs that ran, by name (set by the executor).
  """

  secs: dict[str, float]
  results: dict[str, ProgramResult]
  step: int = 0
  programs: dict[str, Program] = dataclasses.field(default_factory=dict)

  def metrics(self, program: str) -> dict[str, float] | None:
    """The final metrics of `program` in this cycle, or None if it did not run.

    A decode's final metrics are those after its host post-processing (waited for here).
    """
    if program not in self.results:
      return None
    return self.programs[program].final_metrics(self.results[program])


@gin.configurable
class SimpleProgramSchedule:
  """Runs the train program N times, then every eval and decode program.

  The executor calls the configured program factories with the task, so a
  gin file binds classes (`@TrainProgram`, `@eval_test/EvalProgram`), not
  instances, and every program shares the one task.
  """

  def __init__(
    self,
    task: Task,
    train_program: Callable[..., Program] = TrainProgram,
    train_executions_per_eval: int = 1,
    eval_programs: Sequence[Callable[..., Program]] = (),
  ):
    """Creates the programs.

    Args:
      task: The task every program runs.
      train_program: Factory of the train program, called with `task=`.
      train_executions_per_eval: Train loops per cycle; 0 evaluates and decodes
        the restored checkpoint once and ends.
      eval_programs: Factories of the eval and decode programs.
    """
    if train_executions_per_eval < 0:
      raise ConfigError(
        f"SimpleProgramSchedule.train_executions_per_eval must be >= 0, got {train_executions_per_eval}"
      )
    self.task = task
    self.train_executions_per_eval = train_executions_per_eval
    self.train_program = train_program(task=task) if train_executions_per_eval else None
    self.cycle: HostCounter | None = None
    self.loops_done: HostCounter | None = None
    self.eval_programs = [factory(task=task) for factory in eval_programs]
    names = [p.name for p in self.programs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
      raise ConfigError(
        f"SimpleProgramSchedule: two programs write to the same folder {duplicates}; "
        "give them distinct `name`s"
      )

  def build(self, runtime) -> None:
    """Creates the schedule's state (cycles done, train loops done in this one), before restore."""
    self.cycle = HostCounter()
    self.loops_done = HostCounter()

  def checkpoint_items(self) -> dict:
    """Schedule state saved with the run: a run stopped mid-cycle resumes mid-cycle."""
    return {"schedule_cycle": self.cycle, "schedule_loops_done": self.loops_done}

  def run_evals(
    self,
    cycle: int | None,
    secs: dict[str, float] | None = None,
    results: dict[str, ProgramResult] | None = None,
  ) -> CycleResult:
    """Runs the eval and decode programs due in `cycle` (all of them when None)."""
    secs = {"eval": 0.0, "decode": 0.0} if secs is None else secs
    results = {} if results is None else results
    for program in self.eval_programs:
      if cycle is not None and not program.runs_in_cycle(cycle):
        continue
      start = time.perf_counter()
      results[program.name] = program.run()
      secs[program.kind] = secs.get(program.kind, 0.0) + time.perf_counter() - start
    return CycleResult(secs=secs, results=results)

  @property
  def programs(self) -> list[Program]:
    """Every program of the schedule, train first."""
    return ([self.train_program] if self.train_program else []) + self.eval_programs

  @property
  def trains(self) -> bool:
    """False for an evaluate-once schedule."""
    return self.train_program is not None

  def run(
    self,
    steps_left: int | None = None,
    should_stop: StopCheck = never_stop,
    after_train_loop: OnTrainLoop = ignore_result,
  ) -> CycleResult:
    """Runs one cycle.

    Args:
      steps_left: Training stops once this many steps ran (None: no limit).
      should_stop: Polled after every train loop; when true, the cycle ends
        there (a clean stop: no eval or decode follows).
      after_train_loop: Called with each train loop's result (progress,
        profiling).
    """
    secs = {"train": 0.0, "eval": 0.0, "decode": 0.0}
    results: dict[str, ProgramResult] = {}
    for _ in range(self.loops_done.value, self.train_executions_per_eval):
      if steps_left is not None and steps_left <= 0:
        break
      start = time.perf_counter()
      result = self.train_program.run(steps_left)
      secs["train"] += time.perf_counter() - start
      results[self.train_program.name] = result
      after_train_loop(result)
      if steps_left is not None:
        steps_left -= result.steps
      self.loops_done.value += 1
      if should_stop():  # The rest of this cycle runs after a restart.
        return CycleResult(secs=secs, results=results)
    self.loops_done.value = 0
    cycle = self.cycle.value
    self.cycle.value += 1
    self.run_evals(cycle if self.trains else None, secs, results)
    return CycleResult(secs=secs, results=results)
