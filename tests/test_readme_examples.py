"""The README's examples run as written: each Python block in a module of its own, run by the `executor` command."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO
from test_cli_user import _code_blocks, _last_line, _readme_section


def _python_block(section, index=0):
  return [body for language, body in _code_blocks(_readme_section(section)) if language == "python"][index]


def _gin_block(section, index=0):
  return [body for language, body in _code_blocks(_readme_section(section)) if language == ""][index]


def _run(folder, module, gin_text, params):
  (folder / "example.gin").write_text(gin_text)
  env = dict(os.environ, PYTHONPATH=str(REPO))
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "executor.cli.main",
      f"--gin_search_path={folder}",
      f"--module={module}",
      "--gin_file=example.gin",
      f"--model_dir={folder / 'run'}",
      *[f"--gin_param={p}" for p in params],
    ],
    cwd=folder,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  "section,gin_text,params",
  [
    (
      "Writing a task",
      "Executor.task = @MyTask()\nSimpleProgramSchedule.eval_programs = [@EvalProgram]\n",
      ["Executor.max_steps=60", "TrainProgram.steps_per_loop=20"],
    ),
    (
      "A Keras model as a task",
      None,  # The README's own gin block.
      [
        "Executor.max_steps=60",
        "TrainProgram.steps_per_loop=20",
        "SimpleProgramSchedule.eval_programs=[@EvalProgram]",
      ],
    ),
    (
      "Writing an action",
      "include 'spirals.gin'\n",
      [
        "Executor.max_steps=500",
        "Executor.actions=[@LogBestAccuracy(), @EarlyStopping()]",
        "DecodeProgram.num_batches=1",
      ],
    ),
  ],
)
def test_a_readme_example_runs_as_written(section, gin_text, params, tmp_path):
  heading = section if section != "Writing an action" else "Layout"
  text = _readme_section(heading)
  if section == "Writing an action":
    text = text[text.index("### Writing an action") :]
    python = [body for language, body in _code_blocks(text) if language == "python"][0]
  else:
    python = _python_block(section)
  assert "super().build()\n" not in python and "from core" not in python
  (tmp_path / "example_module.py").write_text(python)
  gin_text = gin_text if gin_text is not None else _gin_block(section)
  result = _run(tmp_path, "example_module", gin_text, params)
  assert result.returncode == 0, result.stderr[-3000:]
  steps = re.search(r"Done at step (\d+)", _last_line(result.stderr))
  assert steps, result.stderr[-2000:]
  if section == "Writing an action":
    assert "New best accuracy" in result.stderr
