"""Record files: an indexed, shuffled TFRecord pipeline that resumes at any example exactly and in O(one file)."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO
from faults_util import assert_same_state, checkpoint_dir, checkpoint_state, start
from holds import hold_params

from programs.core.data import StreamInputContext
from programs.core.records import (
  INDEX_NAME,
  InputError,
  array_parser,
  record_counts,
  record_dataset,
  resume_reads,
  write_array_records,
  write_index,
)

ONE = tf.distribute.InputContext(1, 0, 1)


@pytest.fixture
def id_files(tmp_path):
  """Four indexed shards of unequal sizes (7, 13, 1, 9) holding the ids 0..29 in file order."""
  (tmp_path / "data").mkdir()
  sizes = [7, 13, 1, 9]
  files = []
  for i in range(len(sizes)):
    path = str(tmp_path / "data" / f"s{i}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for k in range(sum(sizes[:i]), sum(sizes[: i + 1])):
        writer.write(str(k).encode())
    files.append(path)
  write_index(files)
  return files


def ids(files, start, batches, context=ONE, batch=4, parse=None, **kwargs):
  parse = parse or (lambda r: tf.strings.to_number(r, tf.int64))
  ds = record_dataset(files, parse, context, batch, True, seed=3, start_example=start, **kwargs)
  return np.concatenate([b.numpy() for b in ds.take(batches)])


@pytest.mark.parametrize(
  "layout",
  [{}, {"block_size": 7, "lanes": 3}, {"block_size": 30, "lanes": 1}],
  ids=["default", "3lanes", "1lane"],
)
def test_every_epoch_is_a_new_permutation_and_a_restart_reads_on_exactly(id_files, layout):
  stream = ids(id_files, 0, 24, **layout)  # 96 examples: three epochs and some.
  epochs = [stream[e * 30 : (e + 1) * 30] for e in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(30))
  assert not np.array_equal(epochs[0], epochs[1])
  for position in (5, 29, 31, 63):
    np.testing.assert_array_equal(
      ids(id_files, position, 3, **layout), stream[position : position + 12], err_msg=str(position)
    )


def test_a_restart_at_a_huge_position_reads_at_most_a_file_per_lane(tmp_path):
  """Work count, not wall-clock: the records a restart reads and drops do not grow with the position."""
  arrays = {"id": np.arange(2000)}
  files = write_array_records(arrays, str(tmp_path / "data"), 8)
  parse = lambda r: array_parser(arrays)(r)["id"]  # noqa: E731
  largest = max(record_counts(files))
  bound = 4 * largest + 64  # 4 lanes: at most one file each, plus one block.
  for position in (0, 10**4 * 64 + 17, 10**6 * 64 + 5, 10**12 + 3):
    assert resume_reads(files, position, block_size=64, lanes=4) <= bound, position
  # ... and it is exact there: it agrees with the stream opened a few batches earlier.
  far = ids(files, 10**12 + 3, 2, block_size=64, lanes=4, parse=parse)
  earlier = ids(files, 10**12 + 3 - 8, 4, block_size=64, lanes=4, parse=parse)
  np.testing.assert_array_equal(far, earlier[8:16])


def test_two_pipelines_read_disjoint_files_and_together_all(id_files):
  # Pipeline 0 of 2 reads files 0 and 2 (ids 0..6, 20), pipeline 1 files 1 and 3; an epoch of each is all of them.
  epochs = []
  for pipeline, size in ((0, 8), (1, 22)):
    context = tf.distribute.InputContext(2, pipeline, 2)
    epochs.append(set(ids(id_files, 0, size, context=context, batch=2).tolist()))
  assert epochs[0] == {*range(7), 20}
  assert epochs[1] == set(range(30)) - epochs[0]


def _steps(files, streams, pipelines, replicas, start, steps, batch=12):
  """The sorted ids each step reads over `pipelines` pipelines of a stream of `streams`, from step `start`."""
  read = [[] for _ in range(steps)]
  for pipeline in range(pipelines):
    context = StreamInputContext(pipelines, pipeline, replicas, streams)
    ds = record_dataset(
      files, lambda r: r, context, batch, True, 3, start * batch // pipelines, block_size=6, lanes=2
    )
    batches = iter(ds)
    for step in range(steps):
      for _ in range(replicas // pipelines):  # Each of the pipeline's replicas takes a batch, in order.
        read[step] += next(batches).numpy().tolist()
  return [sorted(r) for r in read]


@pytest.mark.parametrize(
  "streams, pipelines, replicas",
  [(2, 1, 2), (2, 3, 6), (1, 2, 2), (4, 2, 2)],
)
def test_a_stream_of_some_pipelines_read_on_others_reads_every_step_as_before(
  id_files, streams, pipelines, replicas
):
  """A run resumed on another worker count reads, step by step, the examples of the run it resumes."""
  before = _steps(id_files, streams, streams, streams, 0, 12)
  assert _steps(id_files, streams, pipelines, replicas, 5, 7) == before[5:]


def test_unindexed_changed_and_damaged_files_are_refused_naming_them(tmp_path, id_files):
  stray = str(tmp_path / "data" / "stray.tfrecord")
  with tf.io.TFRecordWriter(stray) as writer:
    writer.write(b"1")
  with pytest.raises(InputError, match="stray.tfrecord: not in .*records.index.json"):
    ids([*id_files, stray], 0, 1)
  with open(id_files[1], "ab") as f:
    f.write(b"junk" * 8)  # A record header and length that do not check out.
  with pytest.raises(InputError, match="s1.tfrecord: changed since it was indexed"):
    ids(id_files, 0, 1)
  index = tmp_path / "data" / INDEX_NAME
  before = index.read_bytes()
  for garbled in ('"records": -5', '"records": "many"', '"records": true'):
    index.write_text(re.sub(r'"records": \d+', garbled, before.decode(), count=1))
    with pytest.raises(InputError, match="damaged record index; rebuild it"):
      ids(id_files, 0, 1)
  index.unlink()
  index.mkdir()  # A folder where the index is.
  with pytest.raises(InputError, match="damaged record index; rebuild it"):
    ids(id_files, 0, 1)
  index.rmdir()
  index.write_bytes(before)
  result = subprocess.run(
    [sys.executable, "-m", "executor.cli.main", "index", id_files[1]],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("executor:")]
  assert errors == [errors[0]] and "s1.tfrecord: damaged record file" in errors[0], result.stderr[-2000:]
  assert index.read_bytes() == before  # Nothing written on bad input.


# ------------------------------------------------------------------ kill -9, bit-exact, through the CLI


def _final_state(model_dir, step):
  return checkpoint_state(os.path.join(checkpoint_dir(model_dir), f"ckpt-{step}"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_kill_9_then_resume_on_record_files_ends_bit_exact(tmp_path, strategy):
  data = tmp_path / "data"
  prepare = [sys.executable, "-m", "executor.tasks.spirals", str(data), "5"]
  subprocess.run(prepare, check=True, capture_output=True, cwd=REPO)
  params = [f"SpiralsClassifier.train_files = '{data}/train-*-of-00005.tfrecord'", "Executor.max_steps = 120"]
  if strategy == "mirrored":
    params += ["Runtime.strategy_fn = @mirrored_strategy", "mirrored_strategy.num_logical_cpus = 2"]
  reference = start(tmp_path / "reference", *params, log=tmp_path / "log_ref")
  assert reference.finish() == 0, reference.tail()
  holds = tmp_path / "holds"
  killed = start(tmp_path / "run", *params, *hold_params(holds, "train", 50), log=tmp_path / "log_a")
  killed.wait_held(holds, "train")  # Mid-run: past the checkpoint of step 40.
  killed.kill()
  resumed = start(tmp_path / "run", *params, log=tmp_path / "log_b")
  assert resumed.finish() == 0, resumed.tail()
  assert re.search(r"Restored .*ckpt-\d+ at step [1-9]", resumed.log), (
    resumed.tail()
  )  # Mid-run, not from scratch.
  assert "replays" not in resumed.log
  assert_same_state(_final_state(tmp_path / "run", 120), _final_state(tmp_path / "reference", 120))


@pytest.mark.slow
def test_two_workers_killed_then_resumed_on_record_files_end_bit_exact(tmp_path):
  from test_multi_worker import Cluster

  data = tmp_path / "data"
  prepare = [sys.executable, "-m", "executor.tasks.spirals", str(data), "5"]
  subprocess.run(prepare, check=True, capture_output=True, cwd=REPO)
  params = [f"SpiralsClassifier.train_files = '{data}/train-*-of-00005.tfrecord'", "Executor.max_steps = 120"]
  reference = Cluster(tmp_path / "reference", tmp_path, *params)
  assert reference.wait() == [0, 0], reference.log(0)[-3000:]
  holds = tmp_path / "holds"
  # Both workers held after the train loop of step 80, between the checkpoints of steps 60 and 120.
  cluster = Cluster(tmp_path / "run", tmp_path, *params, *hold_params(holds, "train", 80, name="train-{pid}"))
  cluster.wait_held(holds, "train-{pid}")
  cluster.procs[1].send_signal(signal.SIGKILL)
  cluster.kill()  # The survivor would wait for its peer forever.
  assert tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")).endswith("ckpt-60")
  cluster = Cluster(tmp_path / "run", tmp_path, *params)
  assert cluster.wait() == [0, 0], cluster.log(0)[-3000:]
  assert "at step 60" in cluster.log(0)
  assert_same_state(_final_state(tmp_path / "run", 120), _final_state(tmp_path / "reference", 120))


def test_a_run_on_unindexed_files_stops_with_one_line_naming_the_file_before_writing_anything(tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  (data / "train-0.tfrecord").write_bytes(b"\0" * 64)
  model_dir = tmp_path / "run"
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "executor.cli.main",
      "--gin_file=gin/spirals.gin",
      f"--model_dir={model_dir}",
      f"--gin_param=SpiralsClassifier.train_files = '{data}/*.tfrecord'",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("executor:")]
  assert len(errors) == 1 and f"{data}/train-0.tfrecord: not in {data}/records.index.json" in errors[0], (
    errors
  )
  assert not model_dir.exists()
