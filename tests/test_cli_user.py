"""A user's first hour with the command: a quiet log, one line per error, suggestions, a task's own folder.

The walkthrough of the README and docs/own-task.md (a task in its own folder, run and reported) runs in
tests/test_docs_examples.py, as written on those pages.
"""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from executor.cli.main import run
from executor.startup_log import NOISE, command_wants_filter, verbosity
from programs.core.errors import ConfigError


def _cli(args, cwd, timeout=300):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # As a user's shell has it.
  return subprocess.run(
    [sys.executable, "-m", "executor.cli.main", *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _last_line(text):
  return text.rstrip("\n").splitlines()[-1]


@pytest.mark.slow
def test_an_error_is_one_line_printed_once_and_verbosity_brings_the_notices_back(tmp_path):
  # A typo fails right after start-up (TensorFlow imported), before anything is written.
  args = [
    "--gin_file=gin/quickstart.gin",
    f"--model_dir={tmp_path / 'run'}",
    "--gin_param=TrainProgram.steps_per_lop=3",
  ]
  quiet, loud = _cli(args, cwd=REPO), _cli([*args, "--verbosity=1"], cwd=REPO)
  assert "oneDNN custom operations" in loud.stderr
  for noise in ("oneDNN", "cuda drivers", "absl::InitializeLog"):
    assert noise not in quiet.stderr, noise
  message = "Configurable 'TrainProgram' doesn't have a parameter named 'steps_per_lop'. Did you mean 'steps_per_loop'?"
  for result in (quiet, loud):
    assert result.returncode == 2
    last = _last_line(result.stderr)
    assert last.startswith("executor: error: gin binding 'TrainProgram.steps_per_lop=3'") and message in last
    assert [line for line in result.stderr.splitlines() if "steps_per_lop" in line] == [last]
    assert "Traceback" not in result.stderr
  assert quiet.stderr.strip() == _last_line(quiet.stderr)  # The error is all the quiet command prints.
  assert not (tmp_path / "run").exists()


def test_noise_patterns_match_tensorflow_notices_only():
  noise = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796293901.387819   20524 port.cc:153] oneDNN custom operations are on. You may see slightly",
    "I0000 00:00:1796293901.388305   20524 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU",
    "E0000 00:00:1796293910.768454   20524 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
  ]
  real = [
    "W0000 00:00:1796293910.768454   20524 cpu_allocator_impl.cc:83] Allocation of 400000000 exceeds 10% of free",
    "E0000 00:00:1796293910.768454   20524 cuda_platform.cc:52] failed call to cuInit: CUDA_ERROR_NO_DEVICE (100)",
    "F0000 00:00:1796293910.768454   20524 port.cc:153] Check failed: oneDNN custom operations are on",
    "I1203 10:31:54.328587 140483388779392 train.py:184] train step 10: accuracy 0.43125, loss 1.0779",
    "UserWarning: oneDNN custom operations are on",
  ]
  assert all(NOISE.match(line) for line in noise)
  assert not any(NOISE.match(line) for line in real)


def test_only_the_command_filters_and_verbosity_turns_it_off():
  assert command_wants_filter(["python", "-m", "executor.cli.main", "--model_dir=x"])
  assert not command_wants_filter(["python", "-m", "executor.cli.main", "--verbosity=1"])
  assert not command_wants_filter(["python", "-m", "executor.cli.main", "-v", "2"])
  assert not command_wants_filter(["python", "-m", "pytest", "tests"])
  assert verbosity(["--verbosity", "1"]) == 1 and verbosity(["-v=-1"]) == -1 and verbosity([]) == 0


def test_gin_search_path_finds_gin_files_includes_and_modules(tmp_path):
  (tmp_path / "configs").mkdir()
  (tmp_path / "lib").mkdir()
  (tmp_path / "lib" / "cli_user_task.py").write_text(
    "import gin\nfrom executor.tasks.spirals import SpiralsClassifier\n\n\n"
    "@gin.configurable\nclass CliUserTask(SpiralsClassifier):\n  pass\n"
  )
  (tmp_path / "configs" / "base.gin").write_text("include 'spirals.gin'\nExecutor.task = @CliUserTask()\n")
  (tmp_path / "configs" / "exp.gin").write_text("include 'base.gin'\nExecutor.max_steps = 20\n")
  search = [str(tmp_path / "configs"), str(tmp_path / "lib")]
  params = ["TrainProgram.steps_per_loop = 10", "SimpleProgramSchedule.eval_programs = []"]
  run(str(tmp_path / "run"), ["exp"], params, gin_search_paths=search, modules=["cli_user_task"])
  assert (tmp_path / "run" / "checkpoints").is_dir()
  operative = (tmp_path / "run" / "operative_config.gin").read_text()
  assert "CliUserTask" in operative and "Executor.max_steps = 20" in operative


@pytest.mark.parametrize(
  "kwargs, expected",
  [
    ({"gin_search_paths": ["/no/such/folder"]}, "--gin_search_path '/no/such/folder' is not a folder"),
    (
      {"modules": ["no_such_module_xyz"]},
      "--module 'no_such_module_xyz' cannot be imported: No module named 'no_such_module_xyz'",
    ),
  ],
)
def test_bad_search_path_or_module_names_it_and_writes_nothing(tmp_path, kwargs, expected):
  with pytest.raises(ConfigError, match=re.escape(expected)):
    run(str(tmp_path / "run"), ["gin/spirals.gin"], [], **kwargs)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
  "param, suggestion",
  [
    ("TrainProgram.steps_per_lop = 3", "Did you mean 'steps_per_loop'?"),
    ("TrainProgam.steps_per_loop = 3", "Did you mean 'TrainProgram'"),
    ("Executor.task = @SpiralClassifier()", "Did you mean 'SpiralsClassifier'"),
    ("dev/EvalProgram.splt = 'dev'", "Did you mean 'split'?"),
    # SpiralsClassifier takes **kwargs (for Task): the unknown name fails in the call, with the suggestion.
    ("SpiralsClassifier.num_clases = 3", "Did you mean 'num_classes'?"),
    ("SpiralsClassifier.global_batch = 3", "Did you mean 'global_batch_size'?"),
  ],
)
def test_a_typo_gets_a_suggestion(tmp_path, param, suggestion):
  with pytest.raises(ConfigError) as error:
    run(str(tmp_path / "run"), ["gin/spirals.gin"], [param])
  assert suggestion in str(error.value)
  assert not (tmp_path / "run").exists()
