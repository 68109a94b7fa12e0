"""A TensorFlow 2 executor: one runtime, a gin-configured schedule of on-device programs."""

from core import optimizers as _optimizers  # noqa: F401  (registers Keras configurables)
from core.errors import ConfigError
from core.runtime import Runtime, default_strategy, mirrored_strategy, multi_worker_strategy, tpu_strategy
from core.task import Task
from executor.checkpoints import Checkpointer
from executor.executor import Executor
from executor.schedule import SimpleProgramSchedule

__all__ = [
  "Checkpointer",
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
