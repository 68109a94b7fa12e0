"""Monitoring a run: a real TensorBoard server over our event files, and `executor report`."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import tensorflow as tf
from conftest import REPO, read_scalars, read_texts, served_scalars
from tensorboard_server import TensorBoard

from executor.cli.main import run
from executor.cli.report import report
from programs.core.errors import ConfigError

PARAMS = [
  "Executor.max_steps = 200",
  "TrainProgram.steps_per_loop = 50",
  "SimpleProgramSchedule.train_executions_per_eval = 2",
  "DecodeProgram.num_batches = 2",
  "Checkpointer.save_interval_steps = 100",
]
PROGRAMS = ["train", "eval_test", "decode_test", "executor"]
# Beside the programs' folders: model_dir's own events (the HParams session) and best_metrics/ (executor/hparams.py).
RUNS = [*PROGRAMS, ".", "best_metrics"]
# Scalar tags and the steps each is written at.
EXPECTED_SCALARS = {
  "train": {
    tag: [50, 100, 150, 200]
    for tag in ["loss", "accuracy", "learning_rate", "global_step/sec", "examples/sec"]
  },
  "eval_test": {tag: [100, 200] for tag in ["accuracy", "loss", "examples/sec"]},
  "decode_test": {tag: [100, 200] for tag in ["accuracy", "decode_secs", "postprocess_secs", "examples/sec"]},
  "executor": {
    **{
      tag: [100, 200] for tag in ["cycle_secs", "train_secs", "eval_secs", "decode_secs", "checkpoint_secs"]
    },
    **{f"compile_secs/{p}": [0] for p in ["train", "eval_test", "decode_test"]},
    "total_num_params": [0],
  },
}
_RUN = {}  # When the module's run started.
EXPECTED_TEXTS = {
  "executor": {"model_analysis": [0], "operative_config": [0]},
  "decode_test": {"samples": [100, 200]},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  import gin

  gin.clear_config()
  path = tmp_path_factory.mktemp("monitoring") / "run"
  start = time.time()
  assert run(str(path), ["gin/spirals.gin"], PARAMS) == 200
  gin.clear_config()
  _RUN["start"] = start
  return path


# TensorBoard.


@pytest.fixture(scope="module")
def tensorboard(model_dir, tmp_path_factory, request):
  server = TensorBoard(model_dir, tmp_path_factory.mktemp("tensorboard") / "tensorboard.log")
  request.addfinalizer(server.stop)
  server.wait_ready()
  return server


@pytest.mark.slow
def test_tensorboard_serves_runs_scalars_and_texts(tensorboard, model_dir):
  assert sorted(tensorboard.get("/data/runs")) == sorted(RUNS)

  tags = tensorboard.get("/data/plugin/scalars/tags")
  for program, expected in EXPECTED_SCALARS.items():
    assert sorted(tags[program]) == sorted(expected), program
  # Text summaries are not scalars, and vice versa.
  assert "model_analysis" not in tags["executor"] and "samples" not in tags["decode_test"]

  for program, expected in EXPECTED_SCALARS.items():
    on_disk = read_scalars(model_dir / program)
    for tag, steps in expected.items():
      # [[wall_time, step, value], ...]
      points = tensorboard.get("/data/plugin/scalars/scalars", run=program, tag=tag)
      assert [p[1] for p in points] == steps, (program, tag)
      assert [p[2] for p in points] == pytest.approx([v for _, v in on_disk[tag]], rel=1e-6), (program, tag)
  total = tensorboard.get("/data/plugin/scalars/scalars", run="executor", tag="total_num_params")
  assert total[0][2] == (2 * 64 + 64) + (64 * 64 + 64) + (64 * 3 + 3)

  text_tags = tensorboard.get("/data/plugin/text/tags")
  for program, expected in EXPECTED_TEXTS.items():
    assert sorted(text_tags[program]) == sorted(expected), program
  for program, expected in EXPECTED_TEXTS.items():
    for tag, steps in expected.items():
      # [{"wall_time": ..., "step": ..., "text": <html>}, ...]
      entries = tensorboard.get("/data/plugin/text/text", run=program, tag=tag)
      assert [e["step"] for e in entries] == steps, (program, tag)

  analysis = tensorboard.get("/data/plugin/text/text", run="executor", tag="model_analysis")[0]["text"]
  assert "<pre><code>" in analysis  # The markdown code block, rendered.
  assert "mlp/hidden_0/kernel" in analysis and "total parameters: 4,547" in analysis
  config = tensorboard.get("/data/plugin/text/text", run="executor", tag="operative_config")[0]["text"]
  assert "TrainProgram.steps_per_loop = 50" in config and "Executor.max_steps = 200" in config
  samples = tensorboard.get("/data/plugin/text/text", run="decode_test", tag="samples")[-1]["text"]
  assert "<table>" in samples  # The markdown table, rendered.
  for column in ["label", "prediction", "probability", "x"]:
    assert f"<th>{column}</th>" in samples
  assert samples.count("<tr>") == 1 + 5  # Header and DecodeProgram.num_samples_in_summary rows.


@pytest.mark.slow
def test_tensorboard_unknown_tag_is_not_found(tensorboard):
  with pytest.raises(urllib.error.HTTPError) as error:
    tensorboard.get("/data/plugin/scalars/scalars", run="train", tag="no_such_tag")
  assert error.value.code == 404


# executor report.


def parse_report(text):
  """{program: {tag: (value, step)}} of the scalars in a report, {program: {tag: step}} of the rest."""
  scalars, others, program, in_summaries = {}, {}, None, False
  for line in text.splitlines():
    if line.startswith("Summaries"):
      in_summaries = True
    elif in_summaries and (m := re.fullmatch(r"  (\S+)/", line)):
      program = m[1]
      scalars[program], others[program] = {}, {}
    elif program and (m := re.fullmatch(r"    (\S+)\s+(\S+)\s+step (\d+)", line)):
      if m[2].startswith("("):
        others[program][m[1]] = int(m[3])
      else:
        scalars[program][m[1]] = (float(m[2]), int(m[3]))
  return scalars, others


def check_report(text, model_dir):
  scalars, others = parse_report(text)
  assert sorted(scalars) == sorted(RUNS)
  for program in PROGRAMS:
    on_disk = read_scalars(model_dir / program)
    assert sorted(scalars[program]) == sorted(on_disk) == sorted(EXPECTED_SCALARS[program]), program
    for tag, points in on_disk.items():
      value, step = scalars[program][tag]
      assert step == points[-1][0], (program, tag)
      assert value == pytest.approx(points[-1][1], rel=1e-6), (program, tag)
    texts = read_texts(model_dir / program)
    assert others[program] == {tag: points[-1][0] for tag, points in texts.items()}, program

  assert re.search(r"^Latest checkpoint step: 200 \(checkpoint ckpt-200\)$", text, re.M)
  assert re.search(r"^Newest summary step: 200 ", text, re.M)
  assert "Lock:" not in text  # The run ended and released its lock.
  state = tf.train.get_checkpoint_state(str(model_dir / "checkpoints"))
  names = [os.path.basename(p) for p in state.all_model_checkpoint_paths]
  assert names == ["ckpt-100", "ckpt-200"]
  rows = re.findall(r"^  (ckpt-\d+)\s+step\s+(\d+)\s+modified (\S+ \S+) \(.*\)\s+[\d.]+ [KM]?B$", text, re.M)
  assert [(name, int(step)) for name, step, _ in rows] == [("ckpt-100", 100), ("ckpt-200", 200)]
  for _, _, when in rows:
    saved = time.mktime(time.strptime(when, "%Y-%m-%d %H:%M:%S"))
    assert _RUN["start"] - 1 <= saved <= time.time() + 1


def test_report_matches_event_files(model_dir):
  check_report(report(str(model_dir)), model_dir)


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "executor.cli.main", *args],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_report_cli_prints_the_same_report(model_dir, tmp_path):
  missing = tmp_path / "missing"
  # Both processes at once: most of each is importing TensorFlow.
  good = subprocess.Popen(
    [sys.executable, "-m", "executor.cli.main", "report", f"--model_dir={model_dir}"],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    bad = _cli("report", f"--model_dir={missing}")
    out, err = good.communicate(timeout=600)
  finally:
    if good.poll() is None:
      good.kill()
      good.wait(timeout=10)
  assert good.returncode == 0, err[-2000:]
  check_report(out, model_dir)
  assert parse_report(out) == parse_report(report(str(model_dir)))

  assert bad.returncode == 2, bad.stderr[-2000:]
  assert f"executor: error: model_dir '{missing}' does not exist" in bad.stderr
  assert bad.stdout == ""


def test_report_of_a_missing_or_empty_model_dir(tmp_path):
  with pytest.raises(ConfigError, match=re.escape(f"model_dir '{tmp_path / 'missing'}' does not exist")):
    report(str(tmp_path / "missing"))
  with pytest.raises(ConfigError, match=re.escape(f"model_dir '{tmp_path}' holds no run")):
    report(str(tmp_path))
  (tmp_path / "file").write_text("")
  with pytest.raises(ConfigError, match="is not a directory"):
    report(str(tmp_path / "file"))


def test_report_flags_unreadable_and_unlisted_checkpoints(model_dir, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(model_dir, copy)
  checkpoints = copy / "checkpoints"
  index = checkpoints / "ckpt-200.index"
  index.write_bytes(index.read_bytes()[:100])  # Truncated.
  (checkpoints / "ckpt-300.index").write_bytes(b"half written")  # Not (yet) in the state file.
  text = report(str(copy))
  assert re.search(r"^  ckpt-100 +step +100 .*B$", text, re.M)  # Intact: no note.
  assert re.search(r"^  ckpt-200 +step +200 .*\[unreadable: .+\]$", text, re.M)
  assert re.search(r"^  ckpt-300 +step +300 .*\[not in the checkpoint state file", text, re.M)
  # The latest is still the one the state file names, flagged.
  assert re.search(r"^Latest checkpoint step: 200 \(checkpoint ckpt-200; unreadable: .+\)$", text, re.M)


# ---------------------------------------------------------------------------------------------- writers after a crash


def test_a_restarted_writer_s_event_file_sorts_after_the_killed_one_s_and_its_steps_win(tmp_path):
  from programs.core.summaries import SummaryWriter

  # A killed process's file stamped in the future (a restart in the same second, or a clock set back).
  killed = SummaryWriter(str(tmp_path))
  killed.restart(-1)
  killed.scalars({"loss": 1.0}, 10)
  killed.scalars({"loss": 2.0}, 20)
  killed.close()
  (old,) = os.listdir(tmp_path)
  future = re.sub(r"tfevents\.\d+\.", f"tfevents.{int(time.time()) + 3600}.", old)
  os.rename(tmp_path / old, tmp_path / future)
  resumed = SummaryWriter(str(tmp_path))
  resumed.restart(10)
  resumed.scalars({"loss": 3.0}, 20)
  resumed.close()
  assert sorted(os.listdir(tmp_path))[0] == future  # TensorBoard reads files in name order.
  assert served_scalars(tmp_path)["."]["loss"][0][0] == 10
  assert [(s, v) for s, _, v in served_scalars(tmp_path)["."]["loss"]] == [(10, 1.0), (20, 3.0)]


def test_metrics_jsonl_restart_cuts_later_steps_and_a_torn_row(tmp_path):
  from programs.core.metric_writers import JsonlWriter

  path = tmp_path / "metrics.jsonl"
  writer = JsonlWriter(str(path))
  for step in (10, 20, 30):
    writer.scalars({"loss": step / 10}, step)
  writer.close()
  with open(path, "a") as f:
    f.write('{"step": 40, "wall_ti')  # A kill in the middle of a row.
  writer = JsonlWriter(str(path))
  writer.restart(20)
  writer.scalars({"loss": 9.0}, 30)
  writer.close()
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert [(r["step"], r["loss"]) for r in rows] == [(10, 1.0), (20, 2.0), (30, 9.0)]
  assert os.listdir(tmp_path) == ["metrics.jsonl"]  # The rewrite left no temporary file.
