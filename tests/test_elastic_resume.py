"""A run resumes on another replica or worker count from its input position in examples.

Every pair of the issue: 1 -> 2 logical CPUs, 2 -> 1, 2 workers -> 1 worker, 1 -> 2 workers, for `array_dataset`
and `record_dataset` inputs (and a user's plain tf.data pipeline where it can resume exactly). A run trains K
steps on N replicas and stops (its final checkpoint), then resumes on M to 2K. The example ids each step read
(recorded by `elastic_helpers.StepIds`) must be, step by step, those of a run on N never stopped: no example
twice, none skipped. The final checkpoint must hold the reference's state (weights, Adam slots and iterations, the EMA,
the float16 loss scale and its counter), and the global batch stays as configured.

Runs on one device or the session's two logical CPUs run in this process; two workers run as two processes on
127.0.0.1.
"""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time

import gin
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO
from elastic_helpers import numbered_examples, read_step_ids, write_numbered_records
from test_multi_worker import free_ports

from executor.cli.main import run
from programs.core.data import StreamInputContext

K = 6  # Steps before the restart; the runs end at 2K.
CONFIG = """
import elastic_helpers

Executor.task = @NumberedExamples()
NumberedExamples.global_batch_size = 8
NumberedExamples.ema_decay = 0.9
Executor.schedule = @SimpleProgramSchedule
SimpleProgramSchedule.train_program = @TrainProgram
SimpleProgramSchedule.train_executions_per_eval = 1
SimpleProgramSchedule.eval_programs = []
TrainProgram.steps_per_loop = 3
Executor.actions = [@StepIds()]
Checkpointer.save_interval_steps = 1000
Runtime.precision = 'mixed_float16'
Runtime.loss_scale_growth_steps = 4
Runtime.initial_loss_scale = 2.0
"""
TWO_CPUS = ["Runtime.strategy_fn = @elastic_mirrored_strategy"]
_SESSION = {}


@gin.register
def elastic_mirrored_strategy() -> tf.distribute.Strategy:
  """The session's mirrored strategy (a second one in this process would collide with it)."""
  return _SESSION["mirrored"]()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return Runs(tmp_path_factory.mktemp("elastic"))


class Runs:
  """Executor runs of one config over a numbered source, on a topology; first halves kept to resume from."""

  def __init__(self, root):
    self.root = root
    self.gin = root / "elastic.gin"
    self.gin.write_text(CONFIG)
    self.files = write_numbered_records(str(root / "records"), 52)
    self._cache = {}

  def params(self, source):
    return [f"NumberedExamples.source = '{source}'", f"NumberedExamples.files = '{self.files}'"]

  def train(self, model_dir, where, source, steps):
    """Trains `model_dir` to `steps` on `where` ('one', 'two_cpus', 'two_workers'); returns its log."""
    params = [*self.params(source), f"Executor.max_steps = {steps}", f"StepIds.path = '{model_dir}.ids'"]
    if where == "two_workers":
      return _two_workers(model_dir, self.gin, params, self.root)
    params += TWO_CPUS if where == "two_cpus" else []
    return _in_process(model_dir, self.gin, params)

  def first_half(self, where, source):
    """A run stopped at step K on `where` (trained once per pair), copied for a resume."""
    key = (where, source)
    if key not in self._cache:
      model_dir = self.root / f"first_{where}_{source}"
      self.train(model_dir, where, source, K)
      self._cache[key] = model_dir
    copy = self.root / f"resume_{time.monotonic_ns()}"
    shutil.copytree(self._cache[key], copy)
    shutil.copy(f"{self._cache[key]}.ids", f"{copy}.ids")
    return copy

  def reference(self, where, source):
    """A run never stopped, to 2K (trained once)."""
    key = ("reference", where, source)
    if key not in self._cache:
      model_dir = self.root / f"reference_{where}_{source}"
      self.train(model_dir, where, source, 2 * K)
      self._cache[key] = model_dir
    return self._cache[key]


def _in_process(model_dir, gin_file, params):
  """Trains in this process; returns the run's log."""
  absl_logger = logging.getLogger("absl")
  handler, level = logging.FileHandler(f"{model_dir}.log"), absl_logger.level
  absl_logger.addHandler(handler)
  absl_logger.setLevel(logging.INFO)
  try:
    run(str(model_dir), [str(gin_file)], params, deterministic=True)
  finally:
    absl_logger.removeHandler(handler)
    absl_logger.setLevel(level)
    handler.close()
  with open(f"{model_dir}.log") as f:
    return f.read()


def _two_workers(model_dir, gin_file, params, tmp):
  """Trains on two worker processes (worker 0 the chief); returns both logs, joined."""
  workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
  procs, logs = [], []
  for index in range(2):
    log = open(f"{model_dir}.worker{index}.{time.monotonic_ns()}.log", "w+")  # noqa: SIM115
    env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
      TMPDIR=str(tmp / f"tmp{index}"),
      TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}),
    )
    os.makedirs(env["TMPDIR"], exist_ok=True)
    args = [
      sys.executable,
      "-m",
      "executor.cli.main",
      f"--gin_file={gin_file}",
      f"--model_dir={model_dir}",
      "--deterministic",
      *[f"--gin_param={p}" for p in [*params, "Runtime.strategy_fn = @multi_worker_strategy"]],
    ]
    procs.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log))
    logs.append(log)
  try:
    codes = [p.wait(timeout=300) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  text = []
  for log in logs:
    log.seek(0)
    text.append(log.read())
    log.close()
  assert codes == [0, 0], "\n".join(t[-3000:] for t in text)
  return "\n".join(text)


def _state(model_dir):
  """{key: value} of the latest checkpoint, but for what says which run wrote it (replicas, iterator states)."""
  path = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  reader = tf.train.load_checkpoint(path)
  keys = [
    k for k, _ in tf.train.list_variables(path) if not k.startswith(("train_input/", "_CHECKPOINTABLE"))
  ]
  return path, {k: reader.get_tensor(k) for k in keys if "save_counter" not in k}


def _assert_same_run(model_dir, reference):
  """The same examples step by step, and the same final state (floats to float16 compute's rounding)."""
  got, want = read_step_ids(f"{model_dir}.ids"), read_step_ids(f"{reference}.ids")
  assert sorted(got) == list(range(1, 2 * K + 1))
  for step in sorted(want):
    assert got[step] == want[step], f"step {step} read {got[step]}, a run never stopped {want[step]}"
  (path, state), (_, expected) = _state(model_dir), _state(reference)
  assert path.endswith(f"ckpt-{2 * K}") and state.keys() == expected.keys()
  for key, value in expected.items():
    if value.dtype.kind in "f":
      np.testing.assert_allclose(state[key], value, rtol=2e-2, atol=1e-3, err_msg=key)
    else:
      np.testing.assert_array_equal(state[key], value, err_msg=key)
  assert int(state["train_global_batch_size/.ATTRIBUTES/VARIABLE_VALUE"]) == 8
  assert int(state["train_input_position/.ATTRIBUTES/VARIABLE_VALUE"]) == 2 * K * 8


RESUMED = r"Program train: resumed on {m} replicas from a run on {n} \({w} worker\(s\), from {v}\)"
TOPOLOGY = {"one": (1, 1), "two_cpus": (2, 1), "two_workers": (2, 2)}
PAIRS = [("one", "two_cpus"), ("two_cpus", "one"), ("two_workers", "one"), ("one", "two_workers")]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["arrays", "records"])
@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_a_run_resumes_on_another_replica_or_worker_count_reading_on_exactly(runs, mirrored, pair, source):
  _SESSION["mirrored"] = mirrored
  before, after = pair
  model_dir = runs.first_half(before, source)
  log = runs.train(model_dir, after, source, 2 * K)
  (m, w), (n, v) = TOPOLOGY[after], TOPOLOGY[before]
  assert re.search(RESUMED.format(m=m, n=n, w=w, v=v), log), log[-3000:]
  assert "replays" not in log
  # `array_dataset` reads the same examples each step on any count: a run on one device is the reference of all.
  _assert_same_run(model_dir, runs.reference("one" if source == "arrays" else before, source))


@pytest.mark.slow
@pytest.mark.parametrize(
  "pair", [("one", "two_cpus"), ("two_cpus", "one")], ids=["one-two_cpus", "two_cpus-one"]
)
def test_a_plain_pipeline_on_another_batch_per_replica_falls_back_to_replay_in_one_line(runs, mirrored, pair):
  _SESSION["mirrored"] = mirrored
  before, after = pair
  model_dir = runs.first_half(before, "plain")
  log = runs.train(model_dir, after, "plain", 2 * K)
  old, new = (8, 4) if before == "one" else (4, 8)
  because = (
    f"Program train: the saved input iterator state is of batches of {old} example(s) per replica, not {new}, "
    f"so resuming at example {K * 8} replays {K * 8 // new} batches per input pipeline"
  )
  assert because in log, log[-3000:]
  # One pipeline's stream, in batches of either size: the replay reads on exactly.
  _assert_same_run(model_dir, runs.reference(before, "plain"))


@pytest.mark.slow
def test_two_workers_resume_from_their_saved_iterator_states_and_fall_back_on_one(runs):
  """Each worker's pipeline state is in the chief's checkpoint: two workers read on with no replay; one worker
  cannot use two pipelines' states and says so."""
  model_dir = runs.first_half("two_workers", "plain")
  keys = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(model_dir / "checkpoints"))))
  assert keys["train_input/pipelines/.ATTRIBUTES/ITERATOR_STATES"] == [2]
  log = runs.train(model_dir, "two_workers", "plain", 2 * K)
  resumed = re.findall(
    rf"the input resumes at example {K * 8} from its saved iterator state \(\d+ bytes\)", log
  )
  assert len(resumed) == 2 and "replays" not in log, log[-3000:]  # One line per worker.
  _assert_same_run(model_dir, runs.reference("two_workers", "plain"))
  model_dir = runs.first_half("two_workers", "plain")
  log = runs.train(model_dir, "one", "plain", 2 * K)
  because = (
    r"the saved input iterator states are of 2 input pipeline\(s\), not 1 \(a pipeline's state cannot be split "
    rf"or merged\), so resuming at example {K * 8} replays {K} batches per input pipeline"
  )
  assert re.search(because, log), log[-3000:]


# (pipelines the stream started with, pipelines now, replicas now) of each pair's run before and after.
KERAS_PAIRS = {
  "one-two_cpus": ((1, 1, 1), (1, 1, 2)),
  "two_cpus-one": ((1, 1, 2), (1, 1, 1)),
  "two_workers-one": ((2, 2, 2), (2, 1, 1)),
  "one-two_workers": ((1, 1, 1), (1, 2, 2)),
}


@pytest.mark.parametrize("data", ["arrays", "records"])
@pytest.mark.parametrize("pair", KERAS_PAIRS)
def test_a_keras_task_reads_on_from_the_right_global_example_on_another_count(tmp_path, pair, data):
  """The input a `KerasTask` gives each worker's pipeline, read per replica as the train loop does."""
  import keras

  from programs.core.keras_task import KerasTask
  from programs.core.records import RecordFiles, array_parser, write_array_records

  arrays = numbered_examples(52)
  x, y = np.concatenate([arrays["id"][:, None].astype(np.float32), arrays["x"]], 1), arrays["y"]
  if data == "records":
    files = write_array_records({"x": x, "y": y}, str(tmp_path / "records"), 4)
    parse = array_parser({"x": x, "y": y})
    source = RecordFiles(files, lambda r: tuple(parse(r).values()))
  else:
    source = (x, y)
  task = KerasTask(
    lambda: keras.Sequential([keras.layers.Dense(1)]), lambda split: source, global_batch_size=8
  )

  def step_ids(streams, pipelines, replicas, first, steps):
    read = [[] for _ in range(steps)]
    for pipeline in range(pipelines):
      context = StreamInputContext(pipelines, pipeline, replicas, streams)
      batches = iter(task.dataset("train", context, start_example=first * 8 // pipelines))
      for step in range(steps):
        for _ in range(replicas // pipelines):
          read[step] += next(batches)[0][:, 0].numpy().astype(int).tolist()
    return [sorted(r) for r in read]

  before, after = KERAS_PAIRS[pair]
  uninterrupted = step_ids(*before, 0, 2 * K)
  assert step_ids(*before, 0, K) + step_ids(*after, K, K) == uninterrupted
