"""Errors raised during a run: one `executor: error:` line naming where, exit 2, and nothing lost.

A run of the spirals task on indexed record files trains 40 steps (a checkpoint, its decode records and eval
scalars at step 40); each case copies it, breaks its data or its model, and runs it on to step 60 through the
command line. The run must end with one line naming the program, the split, the step, the op and (for a damaged
record) the file and record; the checkpoint of step 40 must be byte for byte what it was, with its step's decode
records and eval scalars; a restart once the input is fixed resumes from it.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import read_scalars
from faults_util import (
  Executor,
  assert_decodes_complete,
  assert_pointer_on_a_complete_checkpoint,
  executor_args,
  kill_all,
  run_all,
)
from test_faults import disk_state

from executor import ConfigError, array_dataset, record_dataset
from executor.tasks.spirals import make_spirals
from programs.core import record_damage
from programs.core.records import INDEX_NAME, InputError, array_parser, write_array_records

TEST_EXAMPLES = 256
DAMAGED_TRAIN_RECORD = 400  # The middle of a train shard of 800 records.
DAMAGED_TEST_RECORD = 128  # The middle of the one test shard.
TRAIN_SHARD = "train-00002-of-00005.tfrecord"
TEST_SHARD = "test-00000-of-00001.tfrecord"


@pytest.fixture(autouse=True)
def _no_leftover_processes():
  yield
  kill_all()


def write_data(directory):
  """The spirals splits as indexed record files: train in 5 shards of 800 records, test in one of 256."""
  for split, n, seed, shards in (("train", 4000, 1, 5), ("test", TEST_EXAMPLES, 1001, 1)):
    x, y = make_spirals(n, 3, 0.03, seed)
    write_array_records({"x": x, "y": y}, str(directory), shards, name=split)


def record_params(data, *params):
  """Gin bindings of a spirals run on the record files in `data` (every eval and decode reads all 256)."""
  return [
    "import run_error_tasks",
    "Executor.task = @RecordSpirals()",
    f"RecordSpirals.train_files = '{data}/train-*'",
    f"RecordSpirals.test_files = '{data}/test-*'",
    "EvalProgram.num_batches = None",
    "DecodeProgram.num_batches = None",
    *params,
  ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A run of 40 steps on record files: checkpoints 20 and 40, decodes and evals at both."""
  root = tmp_path_factory.mktemp("records_run")
  write_data(root / "data")
  executor = Executor(
    executor_args(root / "run", *record_params(root / "data", "Executor.max_steps = 40")), root / "log"
  )
  assert executor.finish() == 0, executor.tail()
  return root


def copy_run(trained, tmp_path):
  for name in ("run", "data"):
    shutil.copytree(trained / name, tmp_path / name)
  return tmp_path / "run", tmp_path / "data"


def record_size(path) -> int:
  """Bytes of each record of an indexed shard of fixed-size records (`write_array_records` of fixed-shape arrays)."""
  entry = json.loads((path.parent / INDEX_NAME).read_text())["files"][path.name]
  return entry["bytes"] // entry["records"]


def damage(path, record, part=17, size=None):
  """Flips a byte of `record` (its data, 17 bytes past its start, by default) in place: the size is the same, so
  the index still holds. Returns the file's bytes before."""
  before = path.read_bytes()
  data = bytearray(before)
  data[record * (size or record_size(path)) + part] ^= 0xFF
  path.write_bytes(bytes(data))
  return before


def damaged_at(shard, record):
  return lambda data: damage(data / shard, record)


TRAIN = "TrainProgram 'train': split 'train' of task 'record_spirals' failed in the train loop of steps 41-50"
# name: (damage of the data, bindings, flags, what the line says (`{data}` and `{R}`: the data folder, the bytes of a
# record), the step of the checkpoint the run started from and still has)
CASES = {
  "damaged_train_record": (
    damaged_at(TRAIN_SHARD, DAMAGED_TRAIN_RECORD),
    [],
    [],
    [
      TRAIN,
      "at op 'while/IteratorGetNext' reading the input: DataLossError: corrupted record at",
      f"record {DAMAGED_TRAIN_RECORD} (counting from 0), at byte {{R}} of '{{data}}/{TRAIN_SHARD}', is damaged",
    ],
  ),
  "damaged_eval_record": (
    damaged_at(TEST_SHARD, DAMAGED_TEST_RECORD),
    [],
    [],
    [
      "EvalProgram 'eval_test': split 'test' of task 'record_spirals' failed in the eval at step 60 (batches from 1",
      "IteratorGetNextAsOptional' reading the input: DataLossError",
      f"record {DAMAGED_TEST_RECORD} (counting from 0), at byte {{R}} of '{{data}}/{TEST_SHARD}', is damaged",
    ],
  ),
  "damaged_eval_record_in_eval_mode": (
    damaged_at(TEST_SHARD, DAMAGED_TEST_RECORD),
    [],
    ["--mode=eval"],
    [
      "EvalProgram 'eval_test': split 'test' of task 'record_spirals' failed in the eval at step 40",
      f"record {DAMAGED_TEST_RECORD} (counting from 0), at byte {{R}} of '{{data}}/{TEST_SHARD}', is damaged",
    ],
  ),
  "damaged_decode_record_in_eval_mode": (
    damaged_at(TEST_SHARD, DAMAGED_TEST_RECORD),
    ["SimpleProgramSchedule.eval_programs = [@DecodeProgram]"],
    ["--mode=eval"],
    [
      "DecodeProgram 'decode_test': split 'test' of task 'record_spirals' failed in the decode at step 40",
      f"record {DAMAGED_TEST_RECORD} (counting from 0), at byte {{R}} of '{{data}}/{TEST_SHARD}', is damaged",
    ],
  ),
  "damaged_decode_record_of_train_and_decode": (
    damaged_at(TEST_SHARD, DAMAGED_TEST_RECORD),
    [
      "SimpleProgramSchedule.train_program = @TrainAndDecodeProgram",
      "TrainAndDecodeProgram.steps_per_loop = 10",
      "SimpleProgramSchedule.eval_programs = []",
    ],
    [],
    [
      "TrainAndDecodeProgram 'train': splits 'train' and 'test' of task 'record_spirals' failed in the train loop "
      "of steps 41-50 or the decode after it",
      f"record {DAMAGED_TEST_RECORD} (counting from 0), at byte {{R}} of '{{data}}/{TEST_SHARD}', is damaged",
    ],
  ),
  "parse_asks_for_a_missing_feature": (
    None,
    ["RecordSpirals.missing_feature = 'z'"],
    [],
    [
      TRAIN,
      "at op 'ParseExample/ParseExampleV2' in the input pipeline's",
      "InvalidArgumentError: Feature: z (data type: float) is required but could not be found",
    ],
  ),
  "assertion_in_the_model": (
    None,
    ["RecordSpirals.max_abs_feature = 0.0"],
    [],
    [
      TRAIN,
      "assert_less/Assert/AssertGuard/Assert' (made at ",
      "run_error_tasks.py:",
      "InvalidArgumentError: assertion failed: [a feature beyond max_abs_feature]",
    ],
  ),
  "out_of_memory": (
    None,
    ["RecordSpirals.huge_allocation = True"],
    [],
    [
      TRAIN,
      "at op 'while/zeros' (made at ",
      "ResourceExhaustedError: OOM when allocating tensor with shape[1048576,1048576,1024]",
    ],
  ),
  "failure_while_a_decode_is_post_processed": (
    None,
    [
      "RecordSpirals.fail_after_step = 60",
      "RecordSpirals.hold_first_decode = True",
      "RecordSpirals.marker = '{tmp}/failing'",
      "Checkpointer.save_interval_steps = 40",  # No save at 60: its decode is pending when the next loop fails.
    ],
    [],
    [
      "TrainProgram 'train': split 'train' of task 'record_spirals' failed in the train loop of steps 61-70",
      "InvalidArgumentError: assertion failed: [a step past]",
    ],
  ),
  "assertion_in_the_decode_post_processing": (
    None,
    ["RecordSpirals.postprocess_check = True"],
    [],
    [
      "DecodeProgram 'decode_test': split 'test' of task 'record_spirals' failed in the post-processing of step 60",
      "InvalidArgumentError: a label 0 in the decode",
    ],
  ),
}


def kept_state(model_dir):
  """What a failure must leave as it was: the checkpoints and the decode records, byte for byte."""
  state = disk_state(model_dir)
  return {k: v for k, v in state.items() if k.startswith("checkpoints") or "decoder_out_" in k}


def assert_nothing_lost(model_dir, kept_before, metrics_before):
  """The checkpoint of step 40 and every output of its step are there as they were; nothing is cut short; every
  decode whose scalars were written has all its records."""
  kept = kept_state(model_dir)
  assert {k: v for k, v in kept.items() if k.startswith("checkpoints")} == {
    k: v for k, v in kept_before.items() if k.startswith("checkpoints")
  }  # No checkpoint of the failed state.
  assert all(kept.get(k) == v for k, v in kept_before.items())
  assert assert_pointer_on_a_complete_checkpoint(model_dir) == 40
  decoded = assert_decodes_complete(model_dir, records=TEST_EXAMPLES)
  assert 40 in decoded
  assert {step for step, _ in read_scalars(model_dir / "decode_test")["accuracy"]} <= set(decoded)
  assert 40 in [step for step, _ in read_scalars(model_dir / "eval_test")["accuracy"]]
  for path, text in metrics_before.items():  # Appended to, never cut.
    assert path.read_bytes().startswith(text), path
  return decoded


def start_failing_run(trained, tmp_path, name, verbosity=None):
  breaks, params, flags, expected = CASES[name]
  model_dir, data = copy_run(trained, tmp_path)
  originals = breaks(data) if breaks is not None else None
  kept = kept_state(model_dir)
  metrics = {p: p.read_bytes() for p in model_dir.glob("*/metrics.jsonl")}
  flags = [*flags, *([f"--verbosity={verbosity}"] if verbosity is not None else [])]
  params = [p.format(tmp=tmp_path) for p in params]
  args = executor_args(model_dir, *record_params(data, *params, "Executor.max_steps = 80"), flags=flags)
  shard = data / (TRAIN_SHARD if "train_record" in name else TEST_SHARD)
  record = DAMAGED_TRAIN_RECORD if "train_record" in name else DAMAGED_TEST_RECORD
  expected = [e.format(data=data, R=record * record_size(shard)) for e in expected]
  return Executor(args, tmp_path / "log"), (model_dir, data, kept, metrics, expected, originals)


def check_failed_run(executor, state, traceback=False):
  model_dir, _, kept, metrics, expected, _ = state
  assert executor.returncode == 2, executor.tail()
  last = executor.log.strip().splitlines()[-1]
  assert last.startswith("executor: error: ") and not [e for e in expected if e not in last], (
    last,
    [e for e in expected if e not in last],
  )
  assert ("Traceback" in executor.log) == traceback, executor.tail()
  return assert_nothing_lost(model_dir, kept, metrics)


@pytest.mark.parametrize("names", [list(CASES)[i : i + 3] for i in range(0, len(CASES), 3)])
def test_an_op_failing_mid_run_is_one_line_exit_2_and_nothing_is_lost(trained, tmp_path, names):
  started = {}
  for name in names:  # Three runs at a time share the two cores.
    (tmp_path / name).mkdir()
    started[name] = start_failing_run(trained, tmp_path / name, name)
  for name, (executor, state) in started.items():
    executor.finish()
    decoded = check_failed_run(executor, state)
    if name == "failure_while_a_decode_is_post_processed":  # Finished after the failure, then the line.
      assert 60 in decoded and (tmp_path / name / "failing").read_text() == "failing at step 61\n"


def test_a_damaged_record_mid_shard_named_then_the_fixed_input_resumes_from_the_checkpoint(trained, tmp_path):
  executor, state = start_failing_run(trained, tmp_path, "damaged_train_record", verbosity=1)
  executor.finish()
  check_failed_run(executor, state, traceback=True)  # `--verbosity=1` shows the traceback, the line last.
  assert "DataLossError: Graph execution error" in executor.log
  model_dir, data, *_, original = state
  (data / TRAIN_SHARD).write_bytes(original)
  resumed = Executor(
    executor_args(model_dir, *record_params(data, "Executor.max_steps = 60")), tmp_path / "log2"
  )
  assert resumed.finish() == 0, resumed.tail()
  assert re.search(r"Restored .*ckpt-40 at step 40", resumed.log), resumed.tail()
  assert assert_pointer_on_a_complete_checkpoint(model_dir) == 60


# ------------------------------------------------------------------------ refused at construction: nothing written

EMPTY = {
  "array_train_split": (
    ["RecordSpirals.train_files = ''", "SpiralsClassifier.num_train_examples = 0"],
    "TrainProgram 'train': split 'train' of task 'record_spirals': array_dataset: the split is empty",
  ),
  "array_test_split": (
    ["RecordSpirals.test_files = ''", "SpiralsClassifier.num_test_examples = 0"],
    "EvalProgram 'eval_test': split 'test' of task 'record_spirals': array_dataset: the split is empty",
  ),
  "record_train_split": (
    ["RecordSpirals.train_files = '{data}/empty/train-*'"],
    "TrainProgram 'train': split 'train' of task 'record_spirals': record_dataset: the split is empty",
  ),
  "record_test_split": (
    ["RecordSpirals.test_files = '{data}/empty/train-*'"],
    "EvalProgram 'eval_test': split 'test' of task 'record_spirals': record_dataset: the split is empty",
  ),
}


def test_empty_splits_are_one_line_exit_2_before_anything_on_disk_changes(trained, tmp_path):
  model_dir, data = copy_run(trained, tmp_path)
  write_array_records(
    {"x": np.zeros([0, 2], np.float32), "y": np.zeros([0], np.int32)}, str(data / "empty"), 1
  )
  before = disk_state(tmp_path)
  runs = []
  for name, (params, _) in EMPTY.items():  # Each on the run, the first on a fresh model_dir too.
    params = [p.format(data=data) for p in params]
    for where in (model_dir, tmp_path / "fresh") if not runs else (model_dir,):
      args = executor_args(where, *record_params(data, *params, "Executor.max_steps = 60"))
      runs.append((name, (args, tmp_path / "logs" / f"{name}_{where.name}")))
  for (name, _), executor in zip(runs, run_all([run for _, run in runs]), strict=True):
    assert executor.returncode == 2, executor.tail()
    last = executor.log.strip().splitlines()[-1]
    assert last.startswith("executor: error: ") and EMPTY[name][1] in last, (name, last)
    assert "Traceback" not in executor.log
  after = disk_state(tmp_path)
  after = {k: v for k, v in after.items() if not k.startswith("logs")}
  assert after == before


def test_array_dataset_refuses_no_examples_and_batches_of_none():
  arrays = {"x": np.zeros([10, 2], np.float32)}
  with pytest.raises(ConfigError, match="array_dataset: the split is empty: its arrays hold no examples"):
    array_dataset({"x": np.zeros([0, 2], np.float32)}, tf.distribute.InputContext(), 4, train=True)
  with pytest.raises(ConfigError, match="array_dataset: a global batch of 0 example"):
    array_dataset(arrays, tf.distribute.InputContext(), 0, train=False)
  two = tf.distribute.InputContext(num_replicas_in_sync=2)
  with pytest.raises(
    ConfigError, match=r"array_dataset: a global batch of 1 example\(s\) does not divide .* 2 rep"
  ):
    array_dataset(arrays, two, 1, train=True)


def test_record_dataset_refuses_no_records_and_batches_of_none(tmp_path):
  arrays = {"x": np.zeros([0, 2], np.float32)}
  files = write_array_records(arrays, str(tmp_path / "empty"), 2)
  for train in (True, False):
    with pytest.raises(
      InputError, match="record_dataset: the split is empty: its record files hold no records"
    ):
      record_dataset(files, array_parser(arrays), tf.distribute.InputContext(), 4, train=train)
  arrays = {"x": np.zeros([8, 2], np.float32)}
  files = write_array_records(arrays, str(tmp_path / "full"), 2)
  with pytest.raises(ConfigError, match="record_dataset: a global batch of 0 example"):
    record_dataset(files, array_parser(arrays), tf.distribute.InputContext(), 0, train=True)


# ------------------------------------------------------------------------ which file and record is damaged


def _records(path, count, payload=b"0123456789"):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for _ in range(count):
      writer.write(payload)
  return str(path)


def _offset_reported(path):
  """The offset a reader of `path` reports for its damaged record."""
  with pytest.raises(tf.errors.DataLossError) as error:
    for _ in tf.data.TFRecordDataset(path):
      pass
  match = re.search(r"corrupted record at (\d+)", error.value.message)
  return int(match.group(1))


def test_the_damaged_record_is_found_among_shards_of_the_same_layout(tmp_path):
  shards = [_records(tmp_path / f"s{i}", 1000) for i in range(4)]
  size = os.path.getsize(shards[0]) // 1000
  damage(tmp_path / "s2", 600, part=14, size=size)  # Its data.
  damage(tmp_path / "s1", 300, part=3, size=size)  # Its length.
  offset = _offset_reported(shards[2])
  assert offset == 600 * size + 12  # The data's offset, not the record's.
  assert record_damage.find_damaged(shards, offset) == [(shards[2], 600, 600 * size)]
  offset = _offset_reported(shards[1])
  assert offset == 300 * size
  assert record_damage.find_damaged(shards, offset) == [(shards[1], 300, 300 * size)]
  source = record_damage.ReadFiles(tuple(shards), "")
  assert record_damage.describe(source, 300 * size) == (
    f"record 300 (counting from 0), at byte {300 * size} of '{shards[1]}', is damaged"
  )
  damage(
    tmp_path / "s3", 300, part=3, size=size
  )  # Two files damaged at the same offset: which one is not known.
  assert "(which one is not known)" in record_damage.describe(source, 300 * size)
  assert "(which one is not known)" in record_damage.describe(
    record_damage.ReadFiles(tuple(shards), "GZIP"), 0
  )


def test_a_damaged_record_past_a_million_records_is_found(tmp_path):
  path = _records(tmp_path / "big", 1_000_001, payload=b"x")
  size = os.path.getsize(path) // 1_000_001
  damage(tmp_path / "big", 1_000_000, part=13, size=size)
  assert record_damage.find_damaged([path], 1_000_000 * size + 12, secs=60) == [
    (path, 1_000_000, 1_000_000 * size)
  ]
