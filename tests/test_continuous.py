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
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {
    "watch_dir": str(train_dir.resolve()),
    "evaluated": [20, 40],
  }
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


def _steps(eval_dir, program):
  """The steps of `program`'s scalars, as TensorBoard's event files and metrics.jsonl hold them."""
  rows = (eval_dir / program / "metrics.jsonl").read_text().splitlines()
  jsonl = [json.loads(row)["step"] for row in rows]
  events = [s for s, _ in read_scalars(eval_dir / program)["accuracy"]]
  assert events == jsonl, (events, jsonl)
  return events


def test_a_checkpoint_unreadable_then_older_than_one_evaluated_is_skipped_with_a_warning_each_step_once(
  tmp_path, caplog
):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  run(str(train_dir), ["gin/spirals.gin"], [*TRAIN, "Executor.max_steps = 60"])  # ckpt-20, 40, 60
  index = train_dir / "checkpoints" / "ckpt-40.index"
  index.rename(tmp_path / "ckpt-40.index")  # Not there yet (a copy that lags, a slow file system).
  evaluator = [*TRAIN, *EVAL, "Executor.max_steps = 80"]  # Ends by the timeout, polling on.
  with caplog.at_level("INFO"):
    assert run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(train_dir)) == 60
  messages = [r.getMessage() for r in caplog.records]
  # Warned when it could not be read, and again when step 60 made it too old: never evaluated after 60.
  assert any(
    "ckpt-40' cannot be read (its files are missing): tried again at each poll" in m for m in messages
  )
  assert any("ckpt-40 for good: step 60 is evaluated already" in m for m in messages)
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {
    "watch_dir": str(train_dir.resolve()),
    "evaluated": [20, 60],
  }
  (tmp_path / "ckpt-40.index").rename(index)  # Readable now, but step 60 is evaluated: summaries go forward.
  caplog.clear()
  with caplog.at_level("INFO"):
    assert run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(train_dir)) == 60
  assert any("ckpt-40 for good: step 60 is evaluated already" in r.getMessage() for r in caplog.records)
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {
    "watch_dir": str(train_dir.resolve()),
    "evaluated": [20, 60],
  }
  assert _steps(eval_dir, "eval_test") == _steps(eval_dir, "decode_test") == [20, 60]


def test_a_restart_after_the_final_checkpoint_is_recorded_ends_at_once(tmp_path, caplog):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  run(str(train_dir), ["gin/spirals.gin"], [*TRAIN, "Executor.max_steps = 40"])
  evaluator = [*TRAIN, "Executor.eval_poll_secs = 0.1", "Executor.max_steps = 40"]
  assert run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(train_dir)) == 40
  # A kill after the final record: the restart has nothing to do and must not wait out eval_timeout_secs.
  with caplog.at_level("INFO"):
    step = run(
      str(eval_dir),
      ["gin/spirals.gin"],
      [*evaluator, "Executor.eval_timeout_secs = 30"],
      watch_dir=str(train_dir),
    )
  assert step == 40
  assert any("Evaluated the final checkpoint (step 40)" in r.getMessage() for r in caplog.records)
  assert not any("No new checkpoint" in r.getMessage() for r in caplog.records)
  assert _steps(eval_dir, "eval_test") == _steps(eval_dir, "decode_test") == [20, 40]


def test_continuous_eval_needs_a_watch_dir_that_exists(tmp_path):
  with pytest.raises(ConfigError, match="--watch_dir '/no/such' is not a directory"):
    run(str(tmp_path / "eval"), ["gin/spirals.gin"], [], watch_dir="/no/such")


def test_continuous_eval_refuses_its_own_model_dir_through_a_symlink(tmp_path):
  (tmp_path / "eval").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "eval")
  for dry_run in (True, False):
    with pytest.raises(ConfigError, match="must differ from --model_dir"):
      run(
        str(tmp_path / "eval"), ["gin/spirals.gin"], EVAL, watch_dir=str(tmp_path / "link"), dry_run=dry_run
      )
  assert list((tmp_path / "eval").iterdir()) == []


def test_a_model_that_does_not_fit_the_watched_checkpoints_is_refused_before_anything_is_written(tmp_path):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  run(str(train_dir), ["gin/spirals.gin"], [*TRAIN, "Executor.max_steps = 20"])
  narrower = [*TRAIN, *EVAL, "Executor.max_steps = 20", "SpiralsClassifier.hidden_sizes = (32,)"]
  for dry_run in (True, False):
    # Before: every checkpoint skipped with a warning, then "Done" (exit 0) after eval_timeout_secs.
    with pytest.raises(ConfigError, match=r"ckpt-20', which does not fit this model"):
      run(str(eval_dir), ["gin/spirals.gin"], narrower, watch_dir=str(train_dir), dry_run=dry_run)
  assert not eval_dir.exists()


def test_an_evaluator_pointed_at_another_run_is_refused_before_anything_is_written(tmp_path):
  first, second, eval_dir = tmp_path / "first", tmp_path / "second", tmp_path / "eval"
  run(str(first), ["gin/spirals.gin"], [*TRAIN, "Executor.max_steps = 20"])
  second.mkdir()  # Another run, started after the evaluator's: no checkpoint yet.
  evaluator = [*TRAIN, *EVAL, "Executor.max_steps = 20"]
  assert run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(first)) == 20
  record = json.loads((eval_dir / "continuous_eval.json").read_text())
  assert record == {"watch_dir": str(first.resolve()), "evaluated": [20]}
  before = {p: p.read_bytes() for p in eval_dir.rglob("*") if p.is_file()}
  for dry_run in (True, False):
    # Before: "Evaluated the final checkpoint (step 20) of .../second already", exit 0, before it had one.
    with pytest.raises(ConfigError, match="records the checkpoints of '.*first' as evaluated, not those of"):
      run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(second), dry_run=dry_run)
  assert {p: p.read_bytes() for p in eval_dir.rglob("*") if p.is_file()} == before
  # The same run through a symlink is the same run; so is one named by a record of an older version.
  (tmp_path / "link").symlink_to(first)
  assert run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(tmp_path / "link")) == 20
  (eval_dir / "continuous_eval.json").write_text('{"evaluated": [20]}')
  assert run(str(eval_dir), ["gin/spirals.gin"], evaluator, watch_dir=str(second)) == 20
