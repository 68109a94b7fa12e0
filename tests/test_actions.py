"""A user's own action, through the real executor and its public modes."""

import gin
import pytest
from conftest import read_scalars

from executor.actions import Action
from executor.cli.main import run
from programs.core.errors import ConfigError

BASE = [
  "TrainProgram.steps_per_loop = 10",
  "DecodeProgram.num_batches = 1",
  "Checkpointer.save_interval_steps = 10",
  "Executor.max_steps = 100",
]


@gin.configurable
class StopAtStep(Action):
  """Records every hook call and stops training once the step reaches `stop_step`."""

  calls: list = []

  def __init__(self, program: str = "eval_test", stop_step: int = 30):
    self.program, self.stop_step = program, stop_step

  def validate(self, program_names):
    if self.program not in program_names:
      raise ConfigError(f"StopAtStep.program '{self.program}' is not in the schedule")
    StopAtStep.calls.append(("validate", None))

  def start(self, context):
    StopAtStep.calls.append(("start", context.step))

  def after_train_loop(self, result):
    StopAtStep.calls.append(("train_loop", result.step))

  def __call__(self, cycle):
    metrics = cycle.metrics(self.program)
    StopAtStep.calls.append(("cycle", (cycle.step, sorted(metrics))))
    return f"reached step {cycle.step}" if cycle.step >= self.stop_step else None

  def close(self):
    StopAtStep.calls.append(("close", None))


def test_a_users_action_sees_every_hook_and_stops_training(tmp_path, caplog):
  StopAtStep.calls = []
  with caplog.at_level("INFO"):
    step = run(str(tmp_path / "run"), ["gin/spirals.gin"], [*BASE, "Executor.actions = [@StopAtStep()]"])
  assert step == 30
  kinds = [kind for kind, _ in StopAtStep.calls]
  assert kinds == ["validate", "start"] + ["train_loop", "cycle"] * 3 + ["close"]
  assert [v for k, v in StopAtStep.calls if k == "train_loop"] == [10, 20, 30]
  assert [v[0] for k, v in StopAtStep.calls if k == "cycle"] == [10, 20, 30]
  assert all("accuracy" in v[1] for k, v in StopAtStep.calls if k == "cycle")
  assert [s for s, _ in read_scalars(tmp_path / "run" / "eval_test")["loss"]] == [10, 20, 30]
  assert any("reached step 30" in r.getMessage() for r in caplog.records)
  # The progress action is still there, ahead of the user's.
  assert any(r.getMessage().startswith("Progress: step 30/100") for r in caplog.records)


def test_an_action_that_refuses_the_schedule_stops_before_anything_is_written(tmp_path):
  with pytest.raises(ConfigError, match="StopAtStep.program 'eval_dev' is not in the schedule"):
    run(
      str(tmp_path / "run"),
      ["gin/spirals.gin"],
      [*BASE, "Executor.actions = [@StopAtStep()]", "StopAtStep.program = 'eval_dev'"],
    )
  assert not (tmp_path / "run").exists()


def test_not_an_action_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="Executor.actions holds .* which is not an Action"):
    run(str(tmp_path / "run"), ["gin/spirals.gin"], [*BASE, "Executor.actions = [@TrainProgram]"])


def test_eval_mode_runs_the_evals_once_on_the_latest_checkpoint(tmp_path):
  train_dir = tmp_path / "train"
  run(str(train_dir), ["gin/spirals.gin"], [*BASE, "Executor.max_steps = 20"])
  assert run(str(train_dir), ["gin/spirals.gin"], BASE, mode="eval") == 20
  # The train loop did not run again: one more eval_test point at the same step, no new train step.
  assert [s for s, _ in read_scalars(train_dir / "eval_test")["loss"]] == [10, 20, 20]
  assert max(s for s, _ in read_scalars(train_dir / "train")["loss"]) == 20
