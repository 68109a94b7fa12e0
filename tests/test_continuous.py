"""Continuous evaluation: every checkpoint of a training run evaluated exactly once, across a restart."""

import json

import pytest
from conftest import read_scalars

from executor.cli.main import run
from programs.core.errors import ConfigError

TRAIN = [
  "TrainProgram.steps_per_loop = 10",
  "Checkpointer.save_interval_steps = 20",
  "DecodeProgram.num_batches = 1",
  "Checkpointer.max_to_keep = 10",
]
EVAL = ["Executor.eval_poll_secs = 0.1", "Executor.eval_timeout_secs = 1.0"]


def test_continuous_eval_evaluates_each_checkpoint_once_across_a_restart(tmp_path, caplog):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  run(str(train_dir), ["gin/spirals.gin"], [*TRAIN, "Executor.max_steps = 40"])  # ckpt-20, ckpt-40
  run(
    str(eval_dir), ["gin/spirals.gin"], [*TRAIN, *EVAL, "Executor.max_steps = 60"], watch_dir=str(train_dir)
  )
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {"evaluated": [20, 40]}
  run(str(train_dir), ["gin/spirals.gin"], [*TRAIN, "Executor.max_steps = 60"])  # ckpt-60
  with caplog.at_level("INFO"):
    run(
      str(eval_dir), ["gin/spirals.gin"], [*TRAIN, *EVAL, "Executor.max_steps = 60"], watch_dir=str(train_dir)
    )
  # Ended at the final checkpoint, not by waiting out the timeout.
  assert any("Evaluated the final checkpoint (step 60)" in r.getMessage() for r in caplog.records)
  assert [s for s, _ in read_scalars(eval_dir / "eval_test")["accuracy"]] == [20, 40, 60]
  assert [s for s, _ in read_scalars(eval_dir / "decode_test")["accuracy"]] == [20, 40, 60]
  # The trainer's folder got no eval summaries and no new checkpoint from the evaluator.
  assert sorted(p.name for p in (train_dir / "checkpoints").glob("*.index")) == [
    "ckpt-20.index",
    "ckpt-40.index",
    "ckpt-60.index",
  ]
  assert not (eval_dir / "checkpoints").exists()


def test_continuous_eval_needs_a_watch_dir_that_exists(tmp_path):
  with pytest.raises(ConfigError, match="--watch_dir '/no/such' is not a directory"):
    run(str(tmp_path / "eval"), ["gin/spirals.gin"], [], watch_dir="/no/such")
