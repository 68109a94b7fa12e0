"""Early stopping and the best checkpoints, through the real executor and across a restart."""

import json

import pytest
from conftest import read_scalars

from executor.cli.main import run
from programs.core.errors import ConfigError

BASE = [
  "TrainProgram.steps_per_loop = 10",
  "DecodeProgram.num_batches = 1",
  "Checkpointer.save_interval_steps = 10",
]
# Only the first evaluation can "improve" (on NaN): every later one is a bad one.
NEVER_BETTER = [
  "Executor.actions = [@EarlyStopping()]",
  "EarlyStopping.program = 'eval_test'",
  "EarlyStopping.metric = 'loss'",
  "EarlyStopping.mode = 'min'",
  "EarlyStopping.min_delta = 1e9",
  "EarlyStopping.patience = 2",
]


def _run(model_dir, *params):
  return run(str(model_dir), ["gin/spirals.gin"], [*BASE, *params])


def test_early_stop_at_the_right_evaluation(tmp_path, caplog):
  model_dir = tmp_path / "run"
  with caplog.at_level("INFO"):
    assert _run(model_dir, "Executor.max_steps = 100", *NEVER_BETTER) == 30
  assert [s for s, _ in read_scalars(model_dir / "eval_test")["loss"]] == [10, 20, 30]
  assert any(
    "early stopping: eval_test/loss has not improved" in r.getMessage() and "(step 10)" in r.getMessage()
    for r in caplog.records
  )


def test_early_stop_state_survives_a_restart(tmp_path):
  model_dir = tmp_path / "run"
  assert _run(model_dir, "Executor.max_steps = 20", *NEVER_BETTER) == 20  # Best at 10, one bad at 20.
  assert _run(model_dir, "Executor.max_steps = 100", *NEVER_BETTER) == 30  # The second bad one: stop.


def test_a_run_early_stopping_ended_trains_nothing_when_started_again_until_patience_is_raised(
  tmp_path, caplog
):
  model_dir = tmp_path / "run"
  assert _run(model_dir, "Executor.max_steps = 100", *NEVER_BETTER) == 30
  with caplog.at_level("INFO"):
    assert (
      _run(model_dir, "Executor.max_steps = 100", *NEVER_BETTER) == 30
    )  # Before: trained to 40, stopped again.
  assert "early stopping: the run stopped already" in caplog.text
  assert [s for s, _ in read_scalars(model_dir / "eval_test")["loss"]] == [10, 20, 30]
  assert _run(model_dir, "Executor.max_steps = 100", *NEVER_BETTER, "EarlyStopping.patience = 4") == 50


def test_early_stop_on_a_decode_metric(tmp_path):
  model_dir = tmp_path / "run"
  params = [
    "Executor.max_steps = 100",
    "Executor.actions = [@EarlyStopping()]",
    "EarlyStopping.program = 'decode_test'",
    "EarlyStopping.metric = 'accuracy'",
    "EarlyStopping.mode = 'max'",
    "EarlyStopping.min_delta = 2.0",
    "EarlyStopping.patience = 1",
  ]
  assert _run(model_dir, *params) == 20


def test_best_checkpoints_keep_the_best_k(tmp_path):
  model_dir = tmp_path / "run"
  _run(
    model_dir,
    "Executor.max_steps = 60",
    "Executor.actions = [@BestCheckpoints()]",
    "BestCheckpoints.program = 'eval_test'",
    "BestCheckpoints.metric = 'accuracy'",
    "BestCheckpoints.mode = 'max'",
    "BestCheckpoints.keep = 2",
  )
  accuracy = dict(read_scalars(model_dir / "eval_test")["accuracy"])
  best = sorted(accuracy, key=lambda s: -accuracy[s])[:2]
  records = json.loads((model_dir / "best" / "best.json").read_text())
  assert [r["step"] for r in records] == best
  for r in records:
    assert r["value"] == pytest.approx(accuracy[r["step"]], rel=1e-6)
  assert sorted(p.name for p in (model_dir / "best").glob("*.index")) == sorted(
    f"ckpt-{s}.index" for s in best
  )


def test_watching_an_unknown_program_or_metric_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="EarlyStopping.program 'eval_dev' is not a program of the schedule"):
    _run(tmp_path / "a", "Executor.actions = [@EarlyStopping()]", "EarlyStopping.program = 'eval_dev'")
  with pytest.raises(
    ConfigError, match="BestCheckpoints.metric 'bleu' is not a metric of program 'eval_test'"
  ):
    _run(
      tmp_path / "b",
      "Executor.max_steps = 10",
      "Executor.actions = [@BestCheckpoints()]",
      "BestCheckpoints.metric = 'bleu'",
    )


def test_no_watcher_acts_on_a_nan_metric():
  from types import SimpleNamespace

  from executor.schedule import CycleResult
  from executor.watchers import EarlyStopping
  from programs.core.results import ProgramResult

  def cycle(step, loss):
    result = ProgramResult(step=step, steps=1, metrics={"loss": loss}, per_example={}, secs=0.0)
    program = SimpleNamespace(final_metrics=lambda r: r.metrics)
    return CycleResult(secs={}, results={"eval_test": result}, step=step, programs={"eval_test": program})

  stopping = EarlyStopping(patience=1)
  stopping.checkpoint_items()
  assert stopping(cycle(10, 1.0)) is None
  # Evaluations that measured nothing (an empty or diverged eval) are no evidence: neither better nor worse.
  assert [stopping(cycle(step, float("nan"))) for step in (20, 30, 40)] == [None, None, None]
  assert int(stopping.best_step.numpy()) == 10 and int(stopping.bad_evaluations.numpy()) == 0
  assert "has not improved on 1" in stopping(cycle(50, 2.0))
