"""--dry_run: everything checked and compiled, the plan printed, nothing written."""

import os
import subprocess
import sys

from conftest import REPO
from test_resume_at_scale import _tree_digest

from executor.cli.main import run

PARAMS = ["TrainProgram.steps_per_loop = 10", "DecodeProgram.num_batches = 1", "Executor.max_steps = 20"]


def _dry_run(model_dir, *params):
  args = [
    sys.executable,
    "-m",
    "executor.cli.main",
    "--gin_file=gin/spirals.gin",
    f"--model_dir={model_dir}",
    "--dry_run",
  ]
  args += [f"--gin_param={p}" for p in [*PARAMS, *params]]
  return subprocess.run(
    args, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300
  )


def test_dry_run_on_a_fresh_and_on_an_existing_model_dir_writes_nothing(tmp_path):
  fresh = tmp_path / "fresh"
  result = _dry_run(fresh)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "program train (train): split 'train', steps_per_loop 10" in result.stdout
  assert "program eval_test (eval)" in result.stdout and "program decode_test (decode)" in result.stdout
  assert "restores: nothing (fresh start)" in result.stdout and "parameters: " in result.stdout
  assert not fresh.exists()

  existing = tmp_path / "existing"
  run(str(existing), ["gin/spirals.gin"], PARAMS)
  before = _tree_digest(existing)
  result = _dry_run(existing, "Executor.max_steps = 40")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "ckpt-20 (step 20); the checkpoint fits the model" in result.stdout
  assert _tree_digest(existing) == before


def test_dry_run_refuses_an_incompatible_checkpoint(tmp_path):
  model_dir = tmp_path / "run"
  run(str(model_dir), ["gin/spirals.gin"], [*PARAMS, "SpiralsClassifier.hidden_sizes = (16,)"])
  before = _tree_digest(model_dir)
  result = _dry_run(model_dir, "SpiralsClassifier.hidden_sizes = (24,)")
  assert result.returncode == 2
  assert "mlp/hidden_0/kernel: checkpoint [2, 16] float32, model [2, 24] float32" in result.stderr
  assert _tree_digest(model_dir) == before
