"""The bottom layer: what programs, the executor and users' tasks build on.

The Task contract, the Runtime (strategy and variables), metric and result types, errors, the summary writer, EMA
and model analysis. Nothing here imports `programs` or `executor`.
"""

import os as _os

# TensorFlow's C++ INFO lines drown the executor's own log; a user's setting wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from core import startup_log as _startup_log  # noqa: E402

# The `executor` command drops the C++ notices TF_CPP_MIN_LOG_LEVEL cannot hide (see core/startup_log.py); it
# must start before TensorFlow is imported, that is here.
if _startup_log.command_wants_filter():
  _startup_log.start_filter()

from core import optimizers as _optimizers  # noqa: E402,F401  (registers Keras configurables)
from core.errors import ConfigError  # noqa: E402
from core.keras_task import KerasTask  # noqa: E402
from core.runtime import Runtime, default_strategy, mirrored_strategy, multi_worker_strategy, tpu_strategy  # noqa: E402
from core.task import Task  # noqa: E402

__all__ = [
  "ConfigError",
  "KerasTask",
  "Runtime",
  "Task",
  "default_strategy",
  "mirrored_strategy",
  "multi_worker_strategy",
  "tpu_strategy",
]
