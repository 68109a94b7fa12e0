"""Actions: what the executor does around the train loops and cycles of a run, beyond running them.

An action is an item of the gin list `Executor.actions`. The executor calls every action at fixed points of a
training run, so a user adds behaviour (a metric watcher, an export, a notification) without touching the executor:

    validate(program_names)      at construction, before anything is touched
    validate_start(model_dir, metric_names)   once the programs are traced, before the restore and the first cycle
    checkpoint_items()           before the restore: state saved with the run
    start(context)               after the restore, before the first cycle
    before_cycle(step)           before each cycle
    after_train_loop(result)     after each train loop (a `ProgramResult`)
    __call__(cycle)              after each cycle (a `CycleResult`); may return a reason to stop
    close()                      at the end of the run, also after an error

Every method has a default that does nothing. Actions run only while training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from executor.checkpoints import Checkpointer
from executor.schedule import CycleResult
from programs.core.results import ProgramResult


@dataclasses.dataclass(frozen=True)
class ActionContext:
  """What an action may use once the run has started.

  Attributes:
    model_dir: The run's directory.
    step: The global step the run starts (or resumes) at.
    max_steps: Where the run ends.
    is_chief: Whether this process writes files (only the chief writes into `model_dir`).
    checkpointer: The run's checkpointer (`write_copy` writes the current state elsewhere).
    export: Writes a SavedModel of the current weights into the folder given (None: `model_dir/export`) and
      returns its path (see `executor/export.py`).
  """

  model_dir: str
  step: int
  max_steps: int
  is_chief: bool
  checkpointer: Checkpointer
  export: Callable[[str | None], str] | None = None


class Action:
  """Base class of the executor's actions; override the methods you need (hooks in order: docs/actions.md)."""

  def validate(self, program_names: Sequence[str]) -> None:
    """Fails (ConfigError) when the action refers to a program the schedule does not have."""

  def validate_start(self, model_dir: str, metric_names: Mapping[str, set[str] | None]) -> None:
    """Fails (ConfigError) when a metric the action watches or a file of model_dir it reads is wrong.

    Called once the programs are traced, before the restore and before the run writes its records.

    Args:
      model_dir: The run's directory.
      metric_names: {program name: its metric names, or None where they are known only after a run}.
    """

  def checkpoint_items(self) -> dict[str, Any]:
    """Trackable state saved with the run and restored at start (created here, before the restore)."""
    return {}

  def start(self, context: ActionContext) -> None:
    """Called once, after the restore and before the first cycle."""

  def before_cycle(self, step: int) -> None:
    """Called before each cycle, with the global step."""

  def after_train_loop(self, result: ProgramResult) -> None:
    """Called after each train loop with its result."""

  def __call__(self, cycle: CycleResult) -> str | None:
    """Called after each cycle; returns why training should stop, or None to go on."""
    return None

  def close(self) -> None:
    """Called at the end of the run (also when it fails)."""

  def kept_steps(self) -> Sequence[int]:
    """Steps of the checkpoints the action keeps, whose outputs (decode records) must be kept too."""
    return ()
