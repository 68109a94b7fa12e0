"""Bad input fails before anything is written, with a message that names the culprit."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

from executor.cli.main import run
from programs.core.errors import ConfigError

SPIRALS = ["gin/spirals.gin"]


@pytest.mark.parametrize(
  "files, params, expected",
  [
    (["gin/no_such.gin"], [], "gin file 'gin/no_such.gin' not found"),
    (SPIRALS, ["NoSuchThing.value = 1"], "No configurable matching 'NoSuchThing'"),
    (SPIRALS, ["TrainProgram.stepz = 1"], "'TrainProgram' doesn't have a parameter named 'stepz'"),
    (SPIRALS, ["TrainProgram.steps_per_loop = = 3"], "gin binding 'TrainProgram.steps_per_loop = = 3'"),
    (SPIRALS, ["EvalProgram.split = 'validation'"], "has no split 'validation' (it has: train, test)"),
    (SPIRALS, ["TrainProgram.steps_per_loop = 0"], "TrainProgram 'train': steps_per_loop must be"),
    (SPIRALS, ["EvalProgram.split = 'train'"], "split 'train' of task 'spirals_classifier' repeats forever"),
    (SPIRALS, ["SpiralsClassifier.global_batch_size = 0"], "global_batch_size must be >= 1, got 0"),
    (
      SPIRALS,
      ["SpiralsClassifier.num_train_examples = 0"],
      "TrainProgram 'train': split 'train' of task 'spirals_classifier': array_dataset: the split is empty",
    ),
  ],
)
def test_bad_config_names_the_culprit_and_writes_nothing(tmp_path, files, params, expected):
  model_dir = tmp_path / "run"
  with pytest.raises(ConfigError) as error:
    run(str(model_dir), files, params)
  assert expected in str(error.value)
  assert not model_dir.exists()


def test_bad_binding_inside_a_gin_file_names_the_file(tmp_path):
  bad = tmp_path / "bad.gin"
  bad.write_text("include 'gin/spirals.gin'\nTrainProgram.steps_per_loopp = 3\n")
  with pytest.raises(ConfigError) as error:
    run(str(tmp_path / "run"), [str(REPO / "gin/spirals.gin"), str(bad)], [])
  assert str(bad) in str(error.value) and "steps_per_loopp" in str(error.value)


def test_model_dir_that_is_a_file(tmp_path):
  path = tmp_path / "file"
  path.write_text("keep me")
  for model_dir in [path, path / "sub"]:
    with pytest.raises(ConfigError, match="is a file, not a directory"):
      run(str(model_dir), SPIRALS, [])
  assert path.read_text() == "keep me"


def test_model_dir_not_writable(tmp_path):
  if os.geteuid() == 0:
    model_dir = "/proc/self/run"  # Root writes anywhere but /proc.
  else:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    model_dir = str(locked / "run")
  with pytest.raises(ConfigError, match="is not writable"):
    run(model_dir, SPIRALS, [])


def _cli(*args, cwd=REPO, timeout=600):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  return subprocess.run(
    [sys.executable, "-m", "executor.cli.main", *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.mark.slow
def test_cli_reports_bad_input_without_a_traceback(tmp_path):
  result = _cli(
    f"--model_dir={tmp_path / 'run'}", "--gin_file=gin/spirals.gin", "--gin_param=EvalProgram.split = 'dev'"
  )
  assert result.returncode == 2
  assert (
    "executor: error: EvalProgram 'eval_dev': task 'spirals_classifier' has no split 'dev'" in result.stderr
  )
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_help_lists_the_flags():
  result = _cli("--help")
  for flag in ["--model_dir", "--gin_file", "--gin_param", "--deterministic"]:
    assert flag in result.stdout, flag


def test_global_batch_must_divide_by_the_replicas_mirrored(tmp_path):
  params = [
    "Runtime.strategy_fn = @mirrored_strategy",
    "mirrored_strategy.num_logical_cpus = 2",
    "SpiralsClassifier.global_batch_size = 63",
  ]
  with pytest.raises(
    ConfigError, match="global batch size 63 of task 'spirals_classifier' does not divide by the 2 replicas"
  ):
    run(str(tmp_path / "run"), SPIRALS, params)
  assert not (tmp_path / "run").exists()
