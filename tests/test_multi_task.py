"""Multi-task schedules: shared variables, a reproducible sampler that survives a resume."""

import numpy as np
import pytest
from conftest import read_scalars

from executor.cli.main import run
from executor.multi_task import StepScheduledSampler, WeightedSampler
from executor.tasks.shared import SharedTrunk
from executor.tasks.spirals import SpiralsClassifier
from programs import TrainProgram
from programs.core.errors import ConfigError
from programs.core.runtime import Runtime

PARAMS = [
  "Executor.max_steps = 100",
  "TrainProgram.steps_per_loop = 10",
  "Checkpointer.save_interval_steps = 10",
  "SimpleProgramSchedule.eval_programs = []",
]


def _trained_steps(model_dir):
  return {
    task: [s for s, _ in read_scalars(model_dir / task / "train")["loss"]]
    for task in ("three_arms", "five_arms")
  }


def test_multi_task_sampler_sequence_is_reproducible_and_survives_a_resume(tmp_path):
  whole, split = tmp_path / "whole", tmp_path / "split"
  run(str(whole), ["gin/multi_task.gin"], PARAMS)
  run(str(split), ["gin/multi_task.gin"], [*PARAMS, "Executor.max_steps = 50"])
  run(str(split), ["gin/multi_task.gin"], PARAMS)
  assert _trained_steps(whole) == _trained_steps(split)
  # The sequence is the sampler's, drawn from (seed, cycle): cycle c trains steps 10c+1 .. 10c+10.
  sampler = WeightedSampler([0.7, 0.3], seed=0)
  expected = {"three_arms": [], "five_arms": []}
  for cycle in range(10):
    expected[["three_arms", "five_arms"][sampler.sample(cycle, 10 * cycle, 2)]].append(10 * cycle + 10)
  assert _trained_steps(whole) == expected
  assert expected["three_arms"] and expected["five_arms"]


def test_multi_task_variables_change_only_when_their_task_trains(tmp_path):
  trunk = SharedTrunk(hidden_sizes=(16,))
  three = SpiralsClassifier(name="three", num_classes=3, trunk=trunk, global_batch_size=32)
  five = SpiralsClassifier(name="five", num_classes=5, trunk=trunk, global_batch_size=32)
  runtime = Runtime()
  runtime.build([three, five])
  programs = {}
  for task in (three, five):
    program = TrainProgram(task, steps_per_loop=5, name=f"{task.name}/train")
    program.prepare(runtime, str(tmp_path))
    programs[task.name] = program

  def snapshot():
    return {
      "trunk": [v.numpy() for v in trunk.layer().trainable_variables],
      "three": [v.numpy() for v in three.model.get_layer("three_logits").trainable_variables],
      "five": [v.numpy() for v in five.model.get_layer("five_logits").trainable_variables],
    }

  def changed(before, after):
    return {k: any(not np.array_equal(a, b) for a, b in zip(before[k], after[k])) for k in before}

  before = snapshot()
  programs["three"].run()
  after_three = snapshot()
  assert changed(before, after_three) == {"trunk": True, "three": True, "five": False}
  programs["five"].run()
  assert changed(after_three, snapshot()) == {"trunk": True, "three": False, "five": True}
  # Shared variables are listed once.
  assert len(three.variables) == len(five.variables) == 4
  assert runtime.step() == 10


def test_multi_task_per_task_folders_and_checkpoint(tmp_path):
  model_dir = tmp_path / "run"
  run(
    str(model_dir),
    ["gin/multi_task.gin"],
    [
      "Executor.max_steps = 40",
      "TrainProgram.steps_per_loop = 20",
      "MultiTaskProgramSchedule.sampler = @RoundRobinSampler()",
    ],
  )
  assert [s for s, _ in read_scalars(model_dir / "three_arms" / "eval_test")["accuracy"]] == [20]
  assert [s for s, _ in read_scalars(model_dir / "five_arms" / "eval_test")["accuracy"]] == [40]
  text = (model_dir / "model_analysis.txt").read_text()
  assert "shared_trunk/hidden_0/kernel" in text and "three_arms_logits/kernel" in text


def test_step_scheduled_sampler_follows_its_curriculum():
  sampler = StepScheduledSampler(boundaries=[100], probabilities=[[1.0, 0.0], [0.0, 1.0]], seed=0)
  assert [sampler.sample(c, 0, 2) for c in range(5)] == [0] * 5
  assert [sampler.sample(c, 100, 2) for c in range(5)] == [1] * 5
  with pytest.raises(ConfigError, match="must hold 2 non-negative weights"):
    WeightedSampler([1.0, 2.0, 3.0]).sample(0, 0, 2)
