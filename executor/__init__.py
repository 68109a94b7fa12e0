"""A TensorFlow 2 executor: one runtime, a gin-configured schedule of on-device programs.

The one import style for users: `from executor import Task, KerasTask, Runtime, array_dataset, ...`. Where things
live (docs/architecture.md): `programs.core` is the bottom layer (Task, Runtime, data), `programs` the compiled
programs, `executor` the run around them and the command line, `executor.tasks` the shipped examples. Every name
of `__all__` has an entry in the API reference, docs/api.md.
"""

from executor import startup_log as _startup_log

# Before TensorFlow is imported: the `executor` command (and nothing else that imports this package) quiets
# TensorFlow's C++ start-up log.
_startup_log.quiet_the_command()

from executor.actions import Action, ActionContext  # noqa: E402
from executor.checkpoints import Checkpointer  # noqa: E402
from executor.executor import Executor  # noqa: E402
from executor.export import Exporter  # noqa: E402
from executor.multi_task import (  # noqa: E402
  MultiTaskProgramSchedule,
  RoundRobinSampler,
  StepScheduledSampler,
  WeightedSampler,
)
from executor.progress import Profiler, Progress  # noqa: E402
from executor.schedule import CycleResult, SimpleProgramSchedule  # noqa: E402
from executor.warm_start import WarmStart  # noqa: E402
from executor.watchers import BestCheckpoints, EarlyStopping  # noqa: E402
from programs import (  # noqa: E402
  DecodeProgram,
  EvalProgram,
  Program,
  TrainAndDecodeProgram,
  TrainProgram,
)
from programs.core import (  # noqa: E402
  ConfigError,
  InputError,
  KerasTask,
  RecordFiles,
  Runtime,
  Task,
  array_dataset,
  array_parser,
  default_strategy,
  mirrored_strategy,
  multi_worker_strategy,
  record_dataset,
  tpu_strategy,
  write_array_records,
)

__all__ = [
  "Action",
  "ActionContext",
  "BestCheckpoints",
  "Checkpointer",
  "ConfigError",
  "CycleResult",
  "DecodeProgram",
  "EarlyStopping",
  "EvalProgram",
  "Executor",
  "Exporter",
  "InputError",
  "KerasTask",
  "MultiTaskProgramSchedule",
  "Profiler",
  "Program",
  "Progress",
  "RoundRobinSampler",
  "Runtime",
  "SimpleProgramSchedule",
  "StepScheduledSampler",
  "Task",
  "TrainAndDecodeProgram",
  "TrainProgram",
  "WarmStart",
  "WeightedSampler",
  "array_dataset",
  "default_strategy",
  "mirrored_strategy",
  "multi_worker_strategy",
  "record_dataset",
  "RecordFiles",
  "array_parser",
  "write_array_records",
  "tpu_strategy",
]
