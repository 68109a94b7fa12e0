"""Shared fixtures: two logical CPU devices, a clean gin config and process state, event-file reading."""

import gc
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gin  # noqa: E402
import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Before any op runs: two logical CPUs, so mirrored tests run in-process.
from programs.core.runtime import configure_logical_cpus  # noqa: E402

configure_logical_cpus(2)


@pytest.fixture(autouse=True)
def clean_gin():
  """Each test starts and ends with an empty gin config."""
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(autouse=True)
def fresh_process_state():
  """Each test starts with what a new process has, whichever tests ran before it in this one (pytest-xdist picks).

  Keras names layers from scratch (a model built here then matches one a command trained). The garbage of the tests
  before is collected here and what they left alive is frozen out of the collector (`gc.freeze`): collections that
  ran at random points of later tests waited in the native destructors of earlier tests' iterators and walked
  every graph TensorFlow keeps alive, making in-process tests late in a worker 10-70x slower than alone. The absl
  logger keeps its level (TensorFlow's SavedModel saver, as `Task.export` calls it, leaves it at WARNING: the INFO
  lines of the tests after it would go).
  """
  keras.utils.clear_session(free_memory=False)
  gc.collect()
  gc.freeze()
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  yield
  absl_logger.setLevel(level)


@pytest.fixture(autouse=True)
def no_leftover_processes():
  """No executor process a test started (tests/faults_util.py) outlives it, held or not."""
  yield
  faults_util = sys.modules.get("faults_util")
  if faults_util is not None:
    faults_util.kill_all()


def read_scalars(logdir):
  """{tag: [(step, value), ...]} of every scalar in the event files of `logdir`."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()["tensors"]:
    events = acc.Tensors(tag)
    values = [tf.make_ndarray(e.tensor_proto) for e in events]
    # Scalars only: model_dir's own events also hold TensorBoard's HParams session (an empty tensor).
    if values and all(v.size == 1 and v.dtype.kind in "biuf" for v in values):
      out[tag] = [(e.step, float(v.reshape(()))) for e, v in zip(events, values)]
  return out


def served_scalars(model_dir, purge=True):
  """{run: {tag: [(step, wall_time, value), ...]}} as `tensorboard --logdir=model_dir` serves them.

  Read with the server's own loaders (`plugin_event_multiplexer`), which purge what a killed run wrote after the
  step it resumed from; `read_scalars`' legacy accumulator does not purge TF2 tensor summaries.
  """
  from tensorboard.backend.event_processing import plugin_event_multiplexer

  mux = plugin_event_multiplexer.EventMultiplexer(size_guidance={"tensors": 0}, purge_orphaned_data=purge)
  mux.AddRunsFromDirectory(str(model_dir))
  mux.Reload()
  out = {}
  for run, tags in mux.PluginRunToTagToContent("scalars").items():
    out[run] = {}
    for tag in tags:
      events = mux.Tensors(run, tag)
      out[run][tag] = [(e.step, e.wall_time, float(tf.make_ndarray(e.tensor_proto))) for e in events]
  return out


def read_texts(logdir):
  """{tag: [(step, text), ...]} of every text summary in `logdir`."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()["tensors"]:
    events = acc.Tensors(tag)
    if events and events[0].tensor_proto.dtype == tf.string.as_datatype_enum:
      out[tag] = [(e.step, tf.make_ndarray(e.tensor_proto).item().decode()) for e in events]
  return out


def ready_programs(task, programs, model_dir, strategy_fn=None):
  """Builds a runtime for `task` (default strategy unless `strategy_fn`), then prepares `programs`
  (validate, build, setup, compile) as the executor does; returns the runtime."""
  from programs.core.runtime import Runtime

  runtime = Runtime(strategy_fn) if strategy_fn is not None else Runtime()
  runtime.build([task])
  for p in programs:
    p.prepare(runtime, str(model_dir))
  return runtime


@pytest.fixture(scope="session")
def mirrored():
  """One 2-replica MirroredStrategy for the whole session.

  Collective ops keep process-wide instance keys, so, as in production (one
  runtime per process), tests share a single mirrored strategy.
  """
  from programs.core.runtime import mirrored_strategy

  strategy = mirrored_strategy(num_logical_cpus=2)
  return lambda: strategy


def pytest_terminal_summary(terminalreporter):
  """The docs' copyable code blocks per page, run as tests or not, when the docs tests were collected."""
  blocks = sys.modules.get("docs_blocks")
  if blocks is not None:
    terminalreporter.write_sep("-", "code blocks of README.md and docs/: run as tests / untested")
    for line in blocks.count_lines():
      terminalreporter.write_line(line)
