"""The spirals experiment end to end through the real executor, files read back."""

import json
import re

import numpy as np
import pytest
from conftest import read_scalars, read_texts

from executor.cli.main import run

SPL = 100
PARAMS = [
  "Executor.max_steps = 600",
  f"TrainProgram.steps_per_loop = {SPL}",
  "SimpleProgramSchedule.train_executions_per_eval = 3",
  "Checkpointer.save_interval_steps = 300",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  import gin

  gin.clear_config()
  path = tmp_path_factory.mktemp("e2e") / "run"
  assert run(str(path), ["gin/spirals.gin"], PARAMS) == 600
  gin.clear_config()
  return path


def test_layout(model_dir):
  for name in [
    "operative_config.gin",
    "model_analysis.txt",
    "checkpoints",
    "train",
    "eval_test",
    "decode_test",
    "executor",
  ]:
    assert (model_dir / name).exists(), name
  assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.index")) == [
    "ckpt-300.index",
    "ckpt-600.index",
  ]


def test_train_summaries(model_dir):
  scalars = read_scalars(model_dir / "train")
  for tag in ["loss", "accuracy", "learning_rate", "global_step/sec", "examples/sec"]:
    assert [s for s, _ in scalars[tag]] == [100, 200, 300, 400, 500, 600], tag
  losses = [v for _, v in scalars["loss"]]
  assert losses[-1] < losses[0] * 0.5
  assert all(v == pytest.approx(0.003) for _, v in scalars["learning_rate"])


def test_eval_and_decode_summaries(model_dir):
  evals = read_scalars(model_dir / "eval_test")
  assert [s for s, _ in evals["accuracy"]] == [300, 600]
  assert evals["accuracy"][-1][1] > evals["accuracy"][0][1] - 0.05
  assert evals["accuracy"][-1][1] > 0.6  # Chance is 1/3.
  decodes = read_scalars(model_dir / "decode_test")
  for tag in ["accuracy", "decode_secs", "postprocess_secs", "examples/sec"]:
    assert [s for s, _ in decodes[tag]] == [300, 600], tag
  assert "samples" in read_texts(model_dir / "decode_test")


def test_executor_summaries(model_dir):
  scalars = read_scalars(model_dir / "executor")
  for tag in ["cycle_secs", "train_secs", "eval_secs", "decode_secs", "checkpoint_secs"]:
    assert [s for s, _ in scalars[tag]] == [300, 600], tag
  for program in ["train", "eval_test", "decode_test"]:
    assert scalars[f"compile_secs/{program}"][0][0] == 0
  assert "model_analysis" in read_texts(model_dir / "executor")


def test_model_analysis_total_is_sum_of_variables(model_dir):
  text = (model_dir / "model_analysis.txt").read_text()
  rows = re.findall(r"^(\S+)\s+\[([\d, ]*)\]\s+(\w+)\s+([\d,]+)$", text, re.M)
  assert {r[0] for r in rows} == {
    f"mlp/{layer}/{kind}" for layer in ["hidden_0", "hidden_1", "logits"] for kind in ["kernel", "bias"]
  }
  for _, shape, _, count in rows:
    dims = [int(d) for d in shape.split(",") if d.strip()]
    assert int(count.replace(",", "")) == int(np.prod(dims))
  total = int(re.search(r"total parameters: ([\d,]+)", text).group(1).replace(",", ""))
  assert total == sum(int(r[3].replace(",", "")) for r in rows)
  assert total == (2 * 64 + 64) + (64 * 64 + 64) + (64 * 3 + 3)


def test_operative_config_records_bindings(model_dir):
  text = (model_dir / "operative_config.gin").read_text()
  assert "TrainProgram.steps_per_loop = 100" in text
  assert "Executor.max_steps = 600" in text


def test_decode_jsonl_has_one_record_per_example(model_dir):
  lines = (model_dir / "decode_test" / "decoder_out_600.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines]
  assert len(records) == 4 * 64  # DecodeProgram.num_batches * global batch.
  assert set(records[0]) == {"x", "label", "prediction", "probability"}
  acc = np.mean([r["label"] == r["prediction"] for r in records])
  final = read_scalars(model_dir / "decode_test")["accuracy"][-1][1]
  assert acc == pytest.approx(final)


def test_resume_continues_from_last_step(model_dir, tmp_path):
  import shutil

  copy = tmp_path / "run"
  shutil.copytree(model_dir, copy)
  assert run(str(copy), ["gin/spirals.gin"], PARAMS[1:] + ["Executor.max_steps = 900"]) == 900
  steps = [s for s, _ in read_scalars(copy / "train")["loss"]]
  assert steps == list(range(100, 1000, 100))  # The second run started at 600.
  assert (copy / "checkpoints" / "ckpt-900.index").exists()
