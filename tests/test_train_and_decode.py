"""The fused train-and-decode program: one host call per cycle, the same decode as a separate program."""

import json

import numpy as np
from conftest import read_scalars

from executor.cli.config import parse_config
from executor.executor import Executor
from executor.tasks.spirals import SpiralsClassifier
from programs import DecodeProgram, TrainAndDecodeProgram
from programs.core.runtime import Runtime

FUSED = [
  "SimpleProgramSchedule.train_program = @TrainAndDecodeProgram",
  "SimpleProgramSchedule.eval_programs = []",
  "TrainAndDecodeProgram.steps_per_loop = 20",
  "TrainAndDecodeProgram.decode_num_batches = 2",
]


def test_train_and_decode_one_host_call_per_cycle(tmp_path):
  parse_config(["gin/spirals.gin"], [*FUSED, "Executor.max_steps = 60"])
  executor = Executor(model_dir=str(tmp_path / "run"))
  assert executor.run() == 60
  program = executor.schedule.train_program
  assert program.host_calls == 3 and program.trace_count == 1
  assert [s for s, _ in read_scalars(tmp_path / "run" / "train")["loss"]] == [20, 40, 60]
  assert [s for s, _ in read_scalars(tmp_path / "run" / "decode_test")["accuracy"]] == [20, 40, 60]
  lines = (tmp_path / "run" / "decode_test" / "decoder_out_60.jsonl").read_text().splitlines()
  assert len(lines) == 2 * 64 and "prediction" in json.loads(lines[0])


def test_train_and_decode_equals_a_separate_decode_on_the_same_weights(tmp_path):
  task = SpiralsClassifier(global_batch_size=64)
  fused = TrainAndDecodeProgram(task, steps_per_loop=30, decode_num_batches=3)
  separate = DecodeProgram(task, num_batches=3, async_postprocess=False, name="decode_separate")
  runtime = Runtime()
  runtime.build([task])
  for p in (fused, separate):
    p.prepare(runtime, str(tmp_path))
  fused.run()
  alone = separate.run().per_example
  together = fused.last_decode.per_example
  assert set(alone) == set(together)
  for key in alone:
    np.testing.assert_array_equal(alone[key], together[key])
  fused.close()
  separate.close()


def test_train_and_decode_quality_target_ends_the_run(tmp_path, caplog):
  with caplog.at_level("INFO"):
    parse_config(
      ["gin/spirals.gin"],
      [
        *FUSED,
        "Executor.max_steps = 200",
        "TrainAndDecodeProgram.target_metric = 'accuracy'",
        "TrainAndDecodeProgram.target_value = 0.0",
      ],
    )
    assert Executor(model_dir=str(tmp_path / "run")).run() == 20
  assert any("quality target reached: decode_test/accuracy" in r.getMessage() for r in caplog.records)
