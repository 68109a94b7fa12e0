"""`bench/resume.py`'s rows for a user's plain TFRecord pipeline, on two logical CPUs and on two workers.

The task (`PlainRecordSpirals`) reads the spirals' train split from TFRecord shards the plain tf.data way,
`TFRecordDataset(files).repeat().shuffle().map(parse).batch()`, and its `dataset()` takes no `start_example`: a
restart resumes from the iterator state each checkpoint holds (one per input pipeline). A run at step P is made by
writing, into a trained checkpoint, the counters of step P (`resume.set_position`) and the state of each
pipeline's iterator after P steps (built here under the run's pipeline seeds and advanced on the host, once per
P), so a restart restores what an uninterrupted run would hold.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import gin
import tensorflow as tf

from executor.tasks.spirals import SpiralsClassifier
from programs.core import input_state
from programs.core.data import StreamInputContext
from programs.core.records import write_array_records
from programs.core.runtime import Runtime
from programs.train_input import skip_batches

STRATEGIES = {  # name: (gin bindings, workers, replicas)
  "mirrored": (["Runtime.strategy_fn = @mirrored_strategy", "mirrored_strategy.num_logical_cpus = 2"], 1, 2),
  "2 workers": (["Runtime.strategy_fn = @multi_worker_strategy"], 2, 2),
}
BATCH = 16  # Global; the per-replica batch is 8.


@gin.configurable
class PlainRecordSpirals(SpiralsClassifier):
  """The spirals, whose train split is read from `train_files` by a plain pipeline without `start_example`."""

  def dataset(self, split, input_context):
    if split != "train":
      return super().dataset(split, input_context)
    files = self._train_files()[input_context.input_pipeline_id :: input_context.num_input_pipelines]
    per_replica = input_context.get_per_replica_batch_size(self.global_batch_size)
    ds = tf.data.TFRecordDataset(files).repeat().shuffle(1024).map(_parse)
    return ds.batch(per_replica, drop_remainder=True)


def _parse(record):
  """One `tf.train.Example` of `write_array_records(SpiralsClassifier().arrays("train"), ...)`."""
  spec = {"x": tf.io.FixedLenFeature([2], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
  features = tf.io.parse_single_example(record, spec)
  return {"x": features["x"], "y": tf.cast(features["y"], tf.int32)}


def write_gin(work: str, steps_per_loop: int) -> str:
  """Writes the spirals' train split as 4 shards and a gin file training `PlainRecordSpirals` on them."""
  shards = os.path.join(work, "plain_shards")
  write_array_records(SpiralsClassifier().arrays("train"), shards, 4)
  path = os.path.join(work, "plain_records.gin")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(path, "w") as f:
    f.write(
      f"include '{os.path.join(root, 'gin', 'spirals.gin')}'\n"
      "import plain_records\n"
      "Executor.task = @PlainRecordSpirals()\n"
      f"PlainRecordSpirals.train_files = '{shards}/train-*.tfrecord'\n"
      f"PlainRecordSpirals.global_batch_size = {BATCH}\n"
      f"TrainProgram.steps_per_loop = {steps_per_loop}\n"
      "SimpleProgramSchedule.eval_programs = []\n"  # Restart time only.
    )
  return path


def iterator_states(checkpoint: str, gin_file: str, strategy: str, steps: int) -> list[bytes]:
  """Each input pipeline's iterator state after `steps` steps of the run whose checkpoint is `checkpoint`."""
  _, workers, replicas = STRATEGIES[strategy]
  with gin.unlock_config():
    gin.parse_config_file(gin_file, skip_unknown=True)
  task = PlainRecordSpirals()
  gin.clear_config()
  runtime = Runtime()  # For the run's pipeline seeds only.
  runtime.build([])
  runtime.resume_input_seed(checkpoint)
  states = []
  for pipeline in range(workers):
    context = StreamInputContext(workers, pipeline, replicas, workers)
    iterator = iter(runtime.pipeline(task, "train", context, 0))
    skip_batches(iterator, tf.constant(steps * replicas // workers, tf.int64))
    states.append(input_state.serialize(iterator))
  return states


def cluster_env(env: dict[str, str], workers: int) -> list[dict[str, str]]:
  """One environment per worker process of a cluster on 127.0.0.1 (free ports); one, unchanged, without one."""
  if workers == 1:
    return [env]
  sockets = [socket.socket() for _ in range(workers)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
  for s in sockets:
    s.close()
  config = {"cluster": {"worker": addresses}}
  return [
    dict(env, TF_CONFIG=json.dumps({**config, "task": {"type": "worker", "index": i}}))
    for i in range(workers)
  ]


def start_others(cmd: list[str], envs: list[dict[str, str]]) -> list[subprocess.Popen]:
  """Starts workers 1, 2, ... of `cmd` (worker 0, the chief, is timed by the caller)."""
  return [
    subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for env in envs[1:]
  ]


def wait_all(procs: list[subprocess.Popen], timeout: float = 600) -> None:
  """Waits for the other workers; kills any still running after `timeout` seconds."""
  for p in procs:
    try:
      p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()
