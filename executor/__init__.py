"""A TensorFlow 2 executor: one runtime, a gin-configured schedule of on-device programs."""

import os as _os

# TensorFlow's C++ INFO lines drown the executor's own log; a user's setting wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from executor import optimizers as _optimizers  # noqa: F401  (registers Keras configurables)
from executor.checkpoints import Checkpointer
from executor.errors import ConfigError
from executor.executor import Executor
from executor.runtime import Runtime, default_strategy, mirrored_strategy, multi_worker_strategy, tpu_strategy
from executor.schedule import SimpleProgramSchedule
from executor.task import Task

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
