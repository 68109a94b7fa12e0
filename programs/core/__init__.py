"""The bottom layer: what programs, the executor and users' tasks build on.

The Task contract, the Runtime (strategy and variables), metric and result types, errors, the summary writer, EMA,
model analysis and input pipelines. Nothing here imports the rest of `programs` or `executor`. Users import these
names from `executor` (`from executor import Task, Runtime`).
"""

from programs.core import optimizers as _optimizers  # noqa: F401  (registers Keras configurables)
from programs.core.data import array_dataset
from programs.core.errors import ConfigError
from programs.core.keras_task import KerasTask
from programs.core.metric_writers import JsonlWriter, MetricWriter, MultiWriter
from programs.core.records import InputError, RecordFiles, array_parser, record_dataset, write_array_records
from programs.core.runtime import (
  Runtime,
  default_strategy,
  mirrored_strategy,
  multi_worker_strategy,
  tpu_strategy,
)
from programs.core.task import Task

__all__ = [
  "ConfigError",
  "InputError",
  "JsonlWriter",
  "KerasTask",
  "MetricWriter",
  "MultiWriter",
  "Runtime",
  "Task",
  "array_dataset",
  "record_dataset",
  "RecordFiles",
  "array_parser",
  "write_array_records",
  "default_strategy",
  "mirrored_strategy",
  "multi_worker_strategy",
  "tpu_strategy",
]
