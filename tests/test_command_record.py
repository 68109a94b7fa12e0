"""A run remembers how its command was configured: a task trained from its own folder with `--gin_search_path=.` is
exported, reported, evaluated (once and continuously) and resumed from another folder with `--model_dir` alone; a
flag given wins; a recorded folder that is gone is one line naming it and the flag to pass."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO
from serving_util import serve

from executor.command_record import FILE, CommandRecord, with_record
from programs.core.errors import ConfigError

_TASK = textwrap.dedent(
  """
  import gin
  import keras
  import numpy as np
  import tensorflow as tf

  from executor import Task, array_dataset


  @gin.configurable
  class LineFit(Task):
    splits = ("train", "test")

    def build(self):
      self.model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])

    def dataset(self, split, input_context, start_example=0):
      rng = np.random.default_rng(0 if split == "train" else 1)
      x = rng.uniform(-1, 1, (1024, 1)).astype("float32")
      arrays = {"x": x, "y": 2 * x + 1}
      return array_dataset(
        arrays, input_context, self.global_batch_size, train=split == "train", start_example=start_example
      )

    def compute_loss(self, batch, training):
      error = self.model(batch["x"], training=training) - batch["y"]
      loss = tf.reduce_mean(tf.square(error))
      return loss, {"mse": (loss, tf.cast(tf.shape(error)[0], tf.float32))}, {}

    def decode_step(self, batch):
      return {"x": batch["x"], "y": batch["y"], "y_hat": self.model(batch["x"], training=False)[:, 0]}
  """
)

_GIN = """
import my_task

Executor.task = @LineFit()
Executor.max_steps = 200
LineFit.optimizer_fn = @keras.optimizers.SGD
keras.optimizers.SGD.learning_rate = 0.1
TrainProgram.steps_per_loop = 100
SimpleProgramSchedule.eval_programs = [@EvalProgram, @DecodeProgram]
DecodeProgram.num_batches = 1
"""


def _cli(args, cwd):
  return subprocess.run(
    [sys.executable, "-m", "executor.cli.main", *args],
    cwd=cwd,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=600,
  )


def _last_line(proc):
  return proc.stderr.rstrip("\n").splitlines()[-1]


def _project(folder):
  folder.mkdir(parents=True)
  (folder / "my_task.py").write_text(_TASK)
  (folder / "my_experiment.gin").write_text(_GIN)
  return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(the task's folder, the run in it): trained from that folder with `--gin_search_path=.`."""
  folder = _project(tmp_path_factory.mktemp("record") / "my_experiment")
  proc = _cli(["--gin_search_path=.", "--gin_file=my_experiment.gin", "--model_dir=runs/first"], cwd=folder)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return folder, folder / "runs" / "first"


@pytest.mark.slow
def test_export_report_eval_and_resume_work_from_another_folder_with_model_dir_alone(trained, tmp_path):
  folder, run = trained
  assert json.loads((run / FILE).read_text()) == {"gin_search_path": [str(folder)], "module": []}
  copy = tmp_path / "run"
  shutil.copytree(run, copy)  # This test resumes its run: the other tests keep theirs.
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()

  exported = _cli(["export", f"--model_dir={copy}"], cwd=elsewhere)
  assert exported.returncode == 0, exported.stderr[-3000:]
  records = [
    json.loads(line) for line in (copy / "decode_test" / "decoder_out_200.jsonl").read_text().splitlines()
  ]
  x = np.array([r["x"] for r in records], np.float32)
  (served,) = serve([(exported.stdout.strip().splitlines()[-1], {"x": x})], tmp_path)
  assert served["inputs"] == {"x": "float32"}  # Not y, which decode_step only passes through.
  np.testing.assert_allclose(served["outputs"]["y_hat"], [r["y_hat"] for r in records], rtol=1e-6)

  reported = _cli(["report", f"--model_dir={copy}"], cwd=elsewhere)
  assert reported.returncode == 0, reported.stderr[-3000:]
  assert "Latest checkpoint step: 200" in reported.stdout and "mse" in reported.stdout

  evaluated = _cli(["--mode=eval", f"--model_dir={copy}"], cwd=elsewhere)  # No --gin_file: the run's config.
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert _last_line(evaluated).endswith(f"Done at step 200: {copy}")
  assert (copy / "eval_operative_config.gin").is_file()

  # A continuous evaluation into its own folder takes the config of the run it watches.
  watched = _cli(
    ["--mode=continuous_eval", f"--watch_dir={copy}", f"--model_dir={tmp_path / 'eval'}"], cwd=elsewhere
  )
  assert watched.returncode == 0, watched.stderr[-3000:]
  assert (tmp_path / "eval" / "eval_test").is_dir()

  # A resume finds the gin file in the run's folder too; the record stays the run's.
  resumed = _cli(
    [f"--model_dir={copy}", "--gin_file=my_experiment.gin", "--gin_param=Executor.max_steps = 300"],
    cwd=elsewhere,
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _last_line(resumed).endswith(f"Done at step 300: {copy}")
  assert json.loads((copy / FILE).read_text()) == {"gin_search_path": [str(folder)], "module": []}
  assert sorted(os.listdir(elsewhere)) == []  # Nothing was written where the commands ran.


@pytest.mark.slow
def test_a_recorded_folder_that_is_gone_is_one_line_and_a_flag_given_wins(trained, tmp_path):
  _, run = trained
  # A run trained in `project/` (its record says so), whose folder was then moved.
  project = _project(tmp_path / "project")
  shutil.copytree(run, project / "runs" / "first")
  CommandRecord((str(project),), ()).write(str(project / "runs" / "first"))
  moved = tmp_path / "moved"
  project.rename(moved)
  model_dir = moved / "runs" / "first"
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  for command in (["export"], ["--mode=eval"]):
    refused = _cli([*command, f"--model_dir={model_dir}"], cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert _last_line(refused) == (
      f"executor: error: the run in '{model_dir}' was configured with --gin_search_path '{project}' (recorded in "
      "command.json), which is no longer a folder: pass --gin_search_path=DIR, the folder of the run's gin files "
      "and modules now"
    )
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
  exported = _cli(["export", f"--model_dir={model_dir}", f"--gin_search_path={moved}"], cwd=tmp_path)
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert exported.stdout.strip().splitlines()[-1] == str(model_dir / "export" / "200")


def test_flags_given_win_each_on_its_own(tmp_path):
  (tmp_path / "tasks").mkdir()
  CommandRecord((str(tmp_path / "tasks"),), ("my_task",)).write(str(tmp_path))
  assert with_record(str(tmp_path), [], []) == CommandRecord((str(tmp_path / "tasks"),), ("my_task",))
  assert with_record(str(tmp_path), ["/elsewhere"], []) == CommandRecord(("/elsewhere",), ("my_task",))
  assert with_record(str(tmp_path), [], ["other"]) == CommandRecord((str(tmp_path / "tasks"),), ("other",))
  assert with_record(str(tmp_path / "no_run"), ["a"], []) == CommandRecord(("a",), ())


def test_a_damaged_record_is_one_line_naming_it(tmp_path):
  (tmp_path / FILE).write_text('{"gin_search_path": "not a list"')
  with pytest.raises(
    ConfigError, match=rf"^'{tmp_path / FILE}', the record of how the run was configured, is "
  ):
    with_record(str(tmp_path), [], [])


def test_a_record_that_is_a_folder_is_refused_before_training_writes_anything(tmp_path):
  from executor.cli.main import run

  (tmp_path / "run" / FILE).mkdir(parents=True)
  with pytest.raises(ConfigError, match=rf"'{tmp_path / 'run' / FILE}' is a directory, not a file"):
    run(str(tmp_path / "run"), ["gin/spirals.gin"], ["Executor.max_steps = 10"])
  assert os.listdir(tmp_path / "run") == [FILE]
