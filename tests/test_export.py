"""What leaves a run: SavedModels (command and action) that reproduce the decode records in a process with
TensorFlow alone, fed the model's inputs alone, and the task with restored weights in Python."""

import json
import logging
import os
import subprocess
import sys

import gin
import numpy as np
import pytest
from conftest import REPO
from serving_util import serve, shown_signatures


def _cli(args, cwd, timeout=600):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  return subprocess.run(
    [sys.executable, "-m", "executor.cli.main", *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _records(model_dir, step):
  path = os.path.join(model_dir, "decode_test", f"decoder_out_{step}.jsonl")
  with open(path) as f:
    return [json.loads(line) for line in f]


def _spirals_inputs(records):
  """The points of the decode records, without their labels: what serving_default takes."""
  from executor.tasks.spirals import SpiralsClassifier

  x = SpiralsClassifier().arrays("test")["x"][: len(records)]
  # The records are of these examples, in this order.
  np.testing.assert_allclose([r["x"] for r in records], x, atol=1e-4)
  return {"x": x}


_TRAIN = [
  "--gin_file=quickstart.gin",
  "--gin_param=Executor.max_steps = 40",
  "--gin_param=TrainProgram.steps_per_loop = 20",
  "--gin_param=SimpleProgramSchedule.train_executions_per_eval = 1",
  "--gin_param=Checkpointer.save_interval_steps = 20",
  "--gin_param=SpiralsClassifier.ema_decay = 0.5",
  "--gin_param=DecodeProgram.use_ema = True",
  "--gin_param=Executor.actions = [@Exporter()]",
  "--gin_param=Exporter.every_n_saves = 1",
  "--gin_param=Exporter.keep = 1",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A short spirals run with EMA weights decoded and an Exporter; the model_dir."""
  root = tmp_path_factory.mktemp("export")
  model_dir = root / "run"
  proc = _cli([f"--model_dir={model_dir}", *_TRAIN], cwd=root)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return model_dir


def _assert_reproduces(served, records):
  assert served["outputs"]["prediction"] == [r["prediction"] for r in records]
  np.testing.assert_allclose(served["outputs"]["probability"], [r["probability"] for r in records], atol=1e-4)


@pytest.mark.slow
def test_action_and_command_exports_serve_the_decode_records_in_a_fresh_tensorflow_process(trained, tmp_path):
  # The action exported at steps 20 and 40 (every save); keep=1 left the last, and no temporary folder.
  assert sorted(os.listdir(trained / "export")) == ["40"]
  # The command exports an older checkpoint into its own export_dir, writing nothing into the run.
  export_dir = tmp_path / "exports"
  before = sorted(os.listdir(trained))
  proc = _cli(
    [
      "export",
      f"--model_dir={trained}",
      f"--checkpoint_path={trained / 'checkpoints' / 'ckpt-20'}",
      f"--export_dir={export_dir}",
    ],
    cwd=tmp_path,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().splitlines()[-1] == str(export_dir / "20")
  assert sorted(os.listdir(export_dir)) == ["20"]
  assert sorted(os.listdir(trained)) == before
  records = {step: _records(trained, step) for step in (40, 20)}
  by_action, by_command = serve(
    [
      (trained / "export" / "40", _spirals_inputs(records[40])),
      (export_dir / "20", _spirals_inputs(records[20])),
    ],
    tmp_path,
  )
  for served in (by_action, by_command):
    assert served["inputs"] == {"x": "float32"}  # The features alone: no label.
    assert served["signatures"] == ["score", "serving_default"]
  # The EMA weights (DecodeProgram.use_ema) were exported: the same predictions and probabilities.
  _assert_reproduces(by_action, records[40])
  _assert_reproduces(by_command, records[20])
  shown = shown_signatures(export_dir / "20")
  # serving_default takes the features alone; `score` computes the eval metrics: it takes the labels too.
  assert shown["serving_default"] == {
    "inputs": {"x": "DT_FLOAT"},
    "outputs": {"prediction": "DT_INT32", "probability": "DT_FLOAT"},
  }
  assert shown["score"]["inputs"] == {"x": "DT_FLOAT", "y": "DT_INT32"}
  assert "accuracy" in shown["score"]["outputs"]


@pytest.mark.parametrize(
  ("where", "checkpoint", "culprit"),
  [("missing", None, "model_dir"), ("empty", None, "operative_config.gin"), ("run", "ckpt-7", "ckpt-7")],
)
def test_export_bad_input_names_the_culprit_and_writes_nothing(trained, tmp_path, where, checkpoint, culprit):
  from executor.cli.main import export
  from programs.core.errors import ConfigError

  (tmp_path / "empty").mkdir()
  model_dir = trained if where == "run" else tmp_path / where
  before = sorted(os.listdir(trained))
  checkpoint_path = str(trained / "checkpoints" / checkpoint) if checkpoint else None
  with pytest.raises(ConfigError, match=culprit):
    export(str(model_dir), checkpoint_path=checkpoint_path)
  assert sorted(os.listdir(trained)) == before
  assert sorted(os.listdir(tmp_path)) == ["empty"]
  gin.clear_config()


def test_an_export_with_nothing_to_serve_is_refused_in_one_line_and_leaves_no_folder(trained, tmp_path):
  from executor.cli.main import export
  from programs.core.errors import ConfigError

  before = sorted(os.listdir(trained))
  with pytest.raises(ConfigError) as error:
    export(
      str(trained),
      gin_params=["SpiralsClassifier.serving_inputs = ('y',)"],
      export_dir=str(tmp_path / "a" / "b"),
    )
  assert str(error.value) == (
    "task 'spirals_classifier' (split 'test'): serving_default has no output to serve from y (prediction, "
    "probability read x); set serving_inputs to the fields of the batch (x, y) its predictions read, or override "
    "serving_functions"
  )
  assert os.listdir(tmp_path) == [] and sorted(os.listdir(trained)) == before
  gin.clear_config()


def test_load_model_returns_the_task_with_the_checkpoint_weights(trained):
  from executor.cli.config import parse_config
  from executor.executor import Executor

  parse_config([str(trained / "operative_config.gin")], [])
  task = Executor(model_dir=str(trained)).load_model(str(trained / "checkpoints" / "ckpt-20"))
  records = _records(trained, 20)
  inputs = _spirals_inputs(records)
  with task.ema.averaged():  # The decode ran on the EMA weights.
    probs = task.model(inputs["x"]).numpy()
  probs = np.exp(probs) / np.exp(probs).sum(-1, keepdims=True)
  assert probs.argmax(-1).tolist() == [r["prediction"] for r in records]
  np.testing.assert_allclose(probs.max(-1), [r["probability"] for r in records], atol=1e-4)
  gin.clear_config()


def test_keras_task_exports_through_keras_and_serves_its_predictions(tmp_path):
  from executor.cli.config import parse_config
  from executor.executor import Executor
  from executor.export import export
  from executor.tasks.keras_digits import digits_data

  parse_config(["keras_digits.gin"], [])
  executor = Executor(model_dir=str(tmp_path / "run"))
  executor.runtime.build(executor.tasks)
  absl_level = logging.getLogger("absl").level
  path = export(executor, str(tmp_path / "exports"))
  assert logging.getLogger("absl").level == absl_level  # The run's INFO lines still show after an export.
  x = digits_data("test")[0][:5]
  expected = executor.tasks[0].model(x).numpy()
  (served,) = serve([(path, {"inputs": x})], tmp_path)
  assert served["signatures"] == ["serve", "serving_default"]  # Keras' own export names.
  # Its Input and output Dense have the names Keras made up: served as `inputs`, `prediction` (as decoded).
  assert served["inputs"] == {"inputs": "float32"}
  np.testing.assert_allclose(served["outputs"]["prediction"], expected, atol=1e-5)
  assert not (tmp_path / "run").exists()  # Only the export dir was written.
  gin.clear_config()


def test_exporter_exports_each_new_best_across_a_resume_and_keeps_the_last_k(tmp_path):
  from conftest import read_scalars

  from executor.cli.main import run

  model_dir = tmp_path / "run"
  params = [
    "TrainProgram.steps_per_loop = 10",
    "DecodeProgram.num_batches = 1",
    "Checkpointer.save_interval_steps = 10",
    "Executor.actions = [@Exporter()]",
    "Exporter.program = 'eval_test'",
    "Exporter.metric = 'accuracy'",
    "Exporter.mode = 'max'",
    "Exporter.at_end = False",
    "Exporter.keep = 3",
  ]
  absl_level = logging.getLogger("absl").level
  # Stopped and resumed: the best value so far is restored, so a worse evaluation after the resume exports nothing.
  run(str(model_dir), ["gin/spirals.gin"], [*params, "Executor.max_steps = 30"], deterministic=True)
  assert logging.getLogger("absl").level == absl_level  # The run's INFO lines still show after an export.
  run(str(model_dir), ["gin/spirals.gin"], [*params, "Executor.max_steps = 60"], deterministic=True)
  improved, best = [], float("-inf")
  history = read_scalars(model_dir / "eval_test")["accuracy"]
  for step, value in history:
    if value > best:
      improved, best = [*improved, step], value
  assert any(s > 30 and s not in improved for s, _ in history), history  # The case this test is about.
  assert sorted(os.listdir(model_dir / "export"), key=int) == [str(s) for s in improved[-3:]], history
  gin.clear_config()


def test_exporter_rotation_deletes_only_the_exports_this_model_dir_wrote(tmp_path):
  from executor.cli.main import run

  # A shared export folder outside model_dir already holds others' exports and a user's notes.
  shared = tmp_path / "elsewhere" / "serving"
  for name in ("1", "2", "100"):
    (shared / name).mkdir(parents=True)
    (shared / name / "notes.txt").write_text("not the executor's")
  params = [
    "TrainProgram.steps_per_loop = 10",
    "DecodeProgram.num_batches = 1",
    "Checkpointer.save_interval_steps = 10",
    "Executor.max_steps = 20",
    "Executor.actions = [@Exporter()]",
    "Exporter.every_n_saves = 1",
    "Exporter.at_end = False",
    "Exporter.keep = 1",
    f"Exporter.export_dir = '{shared}'",
  ]
  run(str(tmp_path / "run"), ["gin/spirals.gin"], params, deterministic=True)
  gin.clear_config()
  # Steps 10 and 20 were exported; keep=1 deleted 10 (ours), never 1, 2 or 100.
  assert sorted(os.listdir(shared), key=int) == ["1", "2", "20", "100"]
  assert all((shared / n / "notes.txt").read_text() == "not the executor's" for n in ("1", "2", "100"))
  assert json.loads((tmp_path / "run" / "exports.json").read_text()) == [str(shared / "20")]


def test_export_refuses_a_folder_of_its_step_holding_no_saved_model(trained, tmp_path):
  from executor.cli.main import export
  from programs.core.errors import ConfigError

  (tmp_path / "exports" / "20").mkdir(parents=True)  # Emptied by the user: "exported already" before.
  with pytest.raises(
    ConfigError, match=r"exports/20' is in the way of the export of step 20: it holds no SavedModel"
  ):
    export(
      str(trained),
      checkpoint_path=str(trained / "checkpoints" / "ckpt-20"),
      export_dir=str(tmp_path / "exports"),
    )
  assert os.listdir(tmp_path / "exports" / "20") == []
  gin.clear_config()
