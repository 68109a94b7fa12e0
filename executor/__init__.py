"""A TensorFlow 2 executor: one runtime, a gin-configured schedule of on-device programs."""

from core import optimizers as _optimizers  # noqa: F401  (registers Keras configurables)
from core.errors import ConfigError
from core.runtime import Runtime, default_strategy, mirrored_strategy, multi_worker_strategy, tpu_strategy
from core.task import Task
from executor.actions import Action
from executor.checkpoints import Checkpointer
from executor.executor import Executor
from executor.progress import Profiler, Progress
from executor.schedule import SimpleProgramSchedule
from executor.warm_start import WarmStart
from executor.watchers import BestCheckpoints, EarlyStopping

__all__ = [
  "Action",
  "BestCheckpoints",
  "Checkpointer",
  "EarlyStopping",
  "Profiler",
  "Progress",
  "WarmStart",
  "ConfigError",
  "Executor",
  "Runtime",
  "SimpleProgramSchedule",
  "Task",
  "default_strategy",
  "mirrored_strategy",
  "multi_worker_strategy",
  "tpu_strategy",
]
