"""Several tasks over shared variables: a seeded sampler picks the task each cycle runs."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import gin
import numpy as np

from executor.schedule import (
  CycleResult,
  SimpleProgramSchedule,
)
from programs.core.errors import ConfigError
from programs.core.runtime import HostCounter
from programs.core.task import Task
from programs.program import Program


@gin.configurable
class RoundRobinSampler:
  """Tasks in turn: 0, 1, ..., n-1, 0, ..."""

  def sample(self, cycle: int, step: int, num_tasks: int) -> int:
    """The index of the task of cycle `cycle`."""
    return cycle % num_tasks


@gin.configurable
class WeightedSampler:
  """Tasks drawn with fixed probabilities, from a seed and the cycle number.

  Each draw depends only on (seed, cycle), so a resumed run (whose cycle
  counter is checkpointed) draws the same sequence.
  """

  def __init__(self, probabilities: Sequence[float] = (), seed: int = 0):
    """Configures the draw.

    Args:
      probabilities: One per task (normalised); empty means uniform.
      seed: Seed of the draws.
    """
    self.probabilities = list(probabilities)
    self.seed = seed

  def _probabilities(self, step: int, num_tasks: int) -> np.ndarray:
    return _normalised(self.probabilities, num_tasks, "WeightedSampler.probabilities")

  def sample(self, cycle: int, step: int, num_tasks: int) -> int:
    """The index of the task of cycle `cycle`."""
    rng = np.random.default_rng([self.seed, cycle])
    return int(rng.choice(num_tasks, p=self._probabilities(step, num_tasks)))


@gin.configurable
class StepScheduledSampler(WeightedSampler):
  """Probabilities that change with the global step (a curriculum).

  `boundaries[i]` is the step from which `probabilities[i + 1]` applies;
  `probabilities[0]` applies before the first boundary.
  """

  def __init__(
    self, boundaries: Sequence[int] = (), probabilities: Sequence[Sequence[float]] = ((),), seed: int = 0
  ):
    """Configures the curriculum.

    Args:
      boundaries: Increasing global steps.
      probabilities: One list per interval: len(boundaries) + 1 of them.
      seed: Seed of the draws.
    """
    super().__init__((), seed)
    if len(probabilities) != len(boundaries) + 1 or list(boundaries) != sorted(boundaries):
      raise ConfigError(
        "StepScheduledSampler: boundaries must increase and probabilities have one more entry than boundaries, "
        f"got {list(boundaries)} and {len(probabilities)} entries"
      )
    self.boundaries = list(boundaries)
    self.schedule = [list(p) for p in probabilities]

  def _probabilities(self, step: int, num_tasks: int) -> np.ndarray:
    interval = bisect.bisect_right(self.boundaries, step)
    return _normalised(self.schedule[interval], num_tasks, f"StepScheduledSampler.probabilities[{interval}]")


def _normalised(probabilities: list[float], num_tasks: int, what: str) -> np.ndarray:
  if not probabilities:
    return np.full(num_tasks, 1.0 / num_tasks)
  p = np.asarray(probabilities, dtype=np.float64)
  if len(p) != num_tasks or (p < 0).any() or p.sum() <= 0:
    raise ConfigError(f"{what} must hold {num_tasks} non-negative weights, got {probabilities}")
  return p / p.sum()


@gin.configurable
class MultiTaskProgramSchedule:
  """Several tasks, each with its own simple schedule; one of them runs per cycle.

  Tasks share variables by sharing Keras layers (see `executor/tasks/shared.py`), so a
  task's train program updates the shared variables and its own, nothing
  else. Programs write to per-task folders, `<task>/train`, `<task>/eval_test`,
  and so on. The sampler's choice depends on the checkpointed cycle counter
  (and the global step), so a resumed run picks the same sequence.
  """

  def __init__(
    self,
    tasks: Sequence[Task] = gin.REQUIRED,
    schedules: Sequence[Callable[..., SimpleProgramSchedule]] | None = None,
    sampler: RoundRobinSampler | WeightedSampler | None = None,
  ):
    """Creates every task's schedule.

    Args:
      tasks: The tasks (distinct names).
      schedules: One schedule factory per task, called with `task=` (scoped gin
        bindings configure each: `@a/SimpleProgramSchedule`); default: a
        `SimpleProgramSchedule` per task.
      sampler: Picks the task of each cycle; default round robin.
    """
    tasks = list(tasks)
    names = [t.name for t in tasks]
    if len(set(names)) != len(names) or not tasks:
      raise ConfigError(f"MultiTaskProgramSchedule.tasks need distinct names, got {names}")
    schedules = list(schedules) if schedules is not None else [SimpleProgramSchedule] * len(tasks)
    if len(schedules) != len(tasks):
      raise ConfigError(
        f"MultiTaskProgramSchedule: {len(tasks)} tasks but {len(schedules)} schedules; give one per task"
      )
    self.tasks = tasks
    self.sampler = sampler or RoundRobinSampler()
    self.schedules = [factory(task=task) for factory, task in zip(schedules, tasks)]
    for task, schedule in zip(tasks, self.schedules):
      for program in schedule.programs:
        program.name = f"{task.name}/{program.name}"
    self.cycle: HostCounter | None = None
    self.history: list[str] = []

  @property
  def trains(self) -> bool:
    """False when no task trains (evaluate once)."""
    return any(s.trains for s in self.schedules)

  @property
  def programs(self) -> list[Program]:
    """Every program of every task."""
    return [p for s in self.schedules for p in s.programs]

  @property
  def eval_programs(self) -> list[Program]:
    """Every eval and decode program of every task."""
    return [p for s in self.schedules for p in s.eval_programs]

  def build(self, runtime) -> None:
    """Creates the cycle counters (before restore)."""
    for schedule in self.schedules:
      schedule.build(runtime)
    self.cycle = HostCounter()
    self._runtime = runtime

  def checkpoint_items(self) -> dict:
    """The sampler's position and every task schedule's state."""
    items = {"multi_task_cycle": self.cycle}
    for task, schedule in zip(self.tasks, self.schedules):
      items.update({f"{task.name}_{k}": v for k, v in schedule.checkpoint_items().items()})
    return items

  def run(self, steps_left: int | None = None, **hooks) -> CycleResult:
    """Runs one cycle of the task the sampler picks.

    `hooks` (`should_stop`, `after_train_loop`) are as for `SimpleProgramSchedule.run`.
    """
    cycle = self.cycle.value
    index = self.sampler.sample(cycle, self._runtime.step(), len(self.tasks))
    self.cycle.value += 1
    self.history.append(self.tasks[index].name)
    return self.schedules[index].run(steps_left, **hooks)

  def run_evals(self, cycle: int | None) -> CycleResult:
    """Runs every task's eval and decode programs."""
    secs, results = {"eval": 0.0, "decode": 0.0}, {}
    for schedule in self.schedules:
      schedule.run_evals(cycle, secs, results)
    return CycleResult(secs=secs, results=results)
