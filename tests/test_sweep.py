"""A sweep as docs/model-dir.md runs it: three runs of one gin file, compared by a real `tensorboard`'s HParams
dashboard (through its HTTP API) and by `executor report`."""

import os
import subprocess
import sys

import pytest
from docs_blocks import marked_by
from tensorboard_server import TensorBoard

LRS = ("0.001", "0.003", "0.01")


def _sweep_block():
  """The block of the docs marked `<!-- test: by tests/test_sweep.py -->`."""
  (block,) = marked_by("test_sweep.py")
  assert "for lr in" in block.body, block.where
  return block.body


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """The docs' sweep commands, as written, but the (blocking) `tensorboard` line; (folder, report output)."""
  root = tmp_path_factory.mktemp("sweep")
  lines = [line for line in _sweep_block().splitlines() if not line.startswith("tensorboard ")]
  env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
  proc = subprocess.run(
    ["bash", "-e", "-c", "\n".join(lines)], cwd=root, env=env, capture_output=True, text=True, timeout=900
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return root / "sweep", proc.stdout


@pytest.mark.slow
def test_report_compares_the_runs_of_a_sweep(sweep):
  folder, out = sweep
  lines = out.splitlines()
  assert lines[0] == f"Runs compared: 3 (in {folder})"
  header = lines[1].split()
  # Only the binding that differs is a column; max_steps is the same in every run.
  assert header[:3] == ["run", "Adam.learning_rate", "step"]
  assert "eval_test/loss" in header and "decode_test/accuracy" in header
  rows = [line.split() for line in lines[2:]]
  assert [r[:3] for r in rows] == [[f"lr_{lr}", lr, "250"] for lr in LRS]


@pytest.mark.slow
def test_tensorboard_hparams_dashboard_shows_the_sweep(sweep, tmp_path):
  folder, _ = sweep
  tb = TensorBoard(folder, tmp_path / "tensorboard.log")
  try:
    tb.wait_ready()  # Every event file is loaded once the server answers.
    experiment = tb.hparams_experiment()
    infos = {h["name"]: h for h in experiment["hparamInfos"]}
    assert infos["Adam.learning_rate"]["differs"] is True
    assert infos["Executor.max_steps"]["differs"] is False
    metrics = {(m["name"]["group"], m["name"]["tag"]) for m in experiment["metricInfos"]}
    assert {("eval_test", "loss"), ("decode_test", "accuracy")} <= metrics
    assert {("best_metrics", "eval_test/loss"), ("best_metrics", "decode_test/accuracy")} <= metrics
    groups = tb.hparams_session_groups(experiment)["sessionGroups"]
  finally:
    tb.stop()
  by_lr = {}
  for group in groups:
    values = {(v["name"]["group"], v["name"]["tag"]): v["value"] for v in group["metricValues"]}
    by_lr[group["hparams"]["Adam.learning_rate"]] = values
    # One eval at the end: the best is the last.
    assert values[("best_metrics", "eval_test/loss")] == pytest.approx(values[("eval_test", "loss")])
    assert values[("eval_test", "loss")] > 0
  assert sorted(by_lr) == sorted(float(lr) for lr in LRS)


def test_report_of_runs_names_a_bad_folder(tmp_path):
  from executor.cli.compare import compare
  from programs.core.errors import ConfigError

  with pytest.raises(ConfigError, match=f"'{tmp_path / 'missing'}' does not exist"):
    compare([str(tmp_path / "missing")])
  (tmp_path / "empty" / "notes").mkdir(parents=True)
  with pytest.raises(ConfigError, match=f"'{tmp_path / 'empty'}' is not a run"):
    compare([str(tmp_path / "empty")])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_hparams_are_the_bindings_the_config_sets_or_a_declared_list():
  from executor.cli.config import parse_config
  from executor.hparams import gin_hparams

  params = ["keras.optimizers.Adam.learning_rate = 0.001", "Executor.max_steps = 7"]
  parse_config(["spirals.gin"], params)
  hparams = gin_hparams()
  # Set by the config, even at the default value; references and lists as gin writes them.
  assert hparams["Adam.learning_rate"] == 0.001 and hparams["Executor.max_steps"] == 7
  assert hparams["Executor.task"] == "@SpiralsClassifier()"
  assert hparams["SimpleProgramSchedule.eval_programs"] == "[@EvalProgram, @DecodeProgram]"
  assert "TrainProgram.split" not in hparams  # A default the config does not set.
  parse_config(["spirals.gin"], [*params, "hparams.names = ['Executor.max_steps', 'Nothing.such']"])
  assert gin_hparams() == {"Executor.max_steps": 7}
