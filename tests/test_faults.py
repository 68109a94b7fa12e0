"""Fault injection: the faults a real cluster throws at a run, with real processes, signals and files.

Each case asserts what the user sees (exit status, one clear message) and
what is on disk afterwards: the pointer on a complete checkpoint, event
files readable, decode records complete or absent. Runs are the spirals
quickstart at tiny sizes (`faults_util.TINY`); a run that resumes must end
bit for bit on the weights of the uninterrupted reference run.
"""

import fcntl
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf
from conftest import read_scalars, served_scalars
from faults_util import (
  MAX_STEPS,
  TINY,
  Executor,
  assert_decodes_complete,
  assert_disk_consistent,
  assert_event_files_readable,
  assert_same_state,
  bind_read_only,
  checkpoint_dir,
  checkpoint_state,
  executor_args,
  latest_step,
  start,
  tmpfs,
  unmount,
  wait_until,
)
from holds import hold_params, release, wait_held

pytestmark = pytest.mark.slow


def found(reason):
  """A case that failed before its fix (strict: the fix's commit removes the mark)."""
  return pytest.mark.xfail(strict=True, reason=f"found by the suite: {reason}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run: (model_dir, state of its final checkpoint)."""
  root = tmp_path_factory.mktemp("reference")
  executor = start(root / "run", log=root / "log")
  assert executor.finish() == 0, executor.tail()
  return root / "run", checkpoint_state(Path(checkpoint_dir(root / "run")) / f"ckpt-{MAX_STEPS}")


def final_state(model_dir):
  assert latest_step(model_dir) == MAX_STEPS
  return checkpoint_state(Path(checkpoint_dir(model_dir)) / f"ckpt-{MAX_STEPS}")


def steps_at_least(step, every=10):
  """A regex alternative of the steps >= `step` that are multiples of `every`."""
  return "|".join(str(s) for s in range(-(-step // every) * every, MAX_STEPS + 1, every))


def checkpointer_gin(tmp_path, holds, async_save, in_write=-1, saved=-1):
  """A gin file whose checkpointer holds (markers in `holds`, tests/holds.py) inside the write of step `in_write`
  (files complete, pointer not moved: hold `in_write`), or after the first save of a step >= `saved` (`saved`)."""
  path = tmp_path / f"checkpointer_{holds.name}.gin"
  path.write_text(
    "import resume_helpers\n"
    "Executor.checkpointer = @PausingCheckpointer()\n"
    "PausingCheckpointer.save_interval_steps = 20\n"
    "PausingCheckpointer.max_to_keep = 3\n"
    f"PausingCheckpointer.async_save = {async_save}\n"
    f"PausingCheckpointer.pause_at_step = {in_write}\n"
    f"PausingCheckpointer.saved_at_step = {saved}\n"
    f"PausingCheckpointer.hold_dir = {str(holds)!r}\n"
  )
  return path


# ------------------------------------------------------------------------------------------ kill -9

# Where a kill lands: at start-up (restore), after a train loop (plus a random
# delay), after a save (an async one may still be writing), after an eval,
# after a decode wrote its records, inside a checkpoint write (files complete,
# pointer not moved yet). The run holds at each (tests/holds.py) until killed.
KINDS = ["restore", "train", "delay", "saved", "eval", "decode"]
# The `HoldAt` moment of each kind the checkpointer does not hold for.
HOLD_AT = {"restore": "start", "train": "train", "delay": "train", "eval": "cycle", "decode": "decoded"}
# Paced train loops: a host-side sleep after each (tests/resume_helpers.py; the run's state is unchanged), so that a
# kill at a random delay after a hold lands mid-run more often than at the run's end.
PACED = "Executor.actions = [@PacedLoops()]"


def kill_schedule(seed):
  """Ten kill moments, reproducible from `seed`: each kind of KINDS and a kill inside a checkpoint
  write, plus two more drawn from KINDS, in a random order at increasing steps; the last inside the
  final save."""
  rng = random.Random(seed)
  kinds = [*KINDS, "in_write", *rng.choices(KINDS, k=2)]
  rng.shuffle(kinds)
  targets = sorted(rng.sample(range(10, MAX_STEPS - 20, 10), len(kinds)))
  moments = [(kind, step, round(rng.uniform(0.0, 0.3), 3)) for kind, step in zip(kinds, targets)]
  return moments + [("final_save", MAX_STEPS, 0.0)]


@pytest.mark.parametrize(
  "async_save",
  [False, True],
  ids=["sync", "async"],
)
def test_kill_9_at_10_random_moments_and_inside_saves_resumes_bit_exactly(tmp_path, reference, async_save):
  model_dir = tmp_path / "run"
  seed = 13
  for i, (kind, target, delay) in enumerate(kill_schedule(seed)):
    before = latest_step(model_dir) or 0
    holds = tmp_path / f"holds{i}"
    in_write, saved, params, held = -1, -1, [], kind
    if kind == "in_write":
      in_write = min(max(-(-target // 20) * 20, before + 20), MAX_STEPS - 20)
    elif kind == "final_save":
      in_write, held = MAX_STEPS, "in_write"
    elif kind == "saved":
      saved = target
    else:
      held = HOLD_AT[kind]
      params = hold_params(holds, held, target, actions=["@PacedLoops()"] if kind == "delay" else [])
      if kind == "delay":
        in_write = MAX_STEPS  # Alive until the kill, wherever the delay ends.
    gin_file = checkpointer_gin(tmp_path, holds, async_save, in_write, saved)
    executor = start(model_dir, *params, log=tmp_path / f"log{i}", gin_files=[gin_file])
    where = f"kill {i} ({kind} at step >= {target}, seed {seed})"
    executor.wait_held(holds, held)
    if kind == "delay":
      release(holds, held)
      time.sleep(delay)  # A random moment after the hold: the checks below hold wherever it lands.
    executor.kill()
    assert executor.returncode == -signal.SIGKILL, where
    if latest_step(model_dir) is None:  # Killed before the first save.
      assert kind not in ("in_write", "final_save") and (kind, async_save) != ("saved", False), where
      continue
    step = assert_disk_consistent(model_dir)
    if kind in ("in_write", "final_save"):
      # The files of the held checkpoint are complete, but the pointer still names the one before.
      assert os.path.exists(os.path.join(checkpoint_dir(model_dir), f"ckpt-{in_write}.index")), where
      assert step < in_write, where
    if kind == "saved" and not async_save:
      assert step >= target, where  # Held after the save.
  executor = start(model_dir, log=tmp_path / "log_final")
  assert executor.finish() == 0, executor.tail()
  assert f"at step {MAX_STEPS - 20}" in executor.log  # Resumed from the save before the final one.
  assert_same_state(final_state(model_dir), reference[1])
  assert_disk_consistent(model_dir)


# ------------------------------------------------------------------------------ damaged checkpoints


def _truncate_data(ckpt):
  data = next(ckpt.parent.glob(f"{ckpt.name}.data-*"))
  data.write_bytes(data.read_bytes()[:100])


def _delete_index(ckpt):
  ckpt.with_name(f"{ckpt.name}.index").unlink()


def _garble_pointer(ckpt):
  (ckpt.parent / "checkpoint").write_bytes(b"model_checkpoint_path: \x00\xff garbage {{{\n" + os.urandom(64))


def _delete_newest(ckpt):
  for path in ckpt.parent.glob(f"{ckpt.name}.*"):
    path.unlink()


def _delete_all_but_pointer(ckpt):
  for path in ckpt.parent.glob("ckpt-*"):
    path.unlink()


DAMAGE = {
  "data_truncated": (_truncate_data, MAX_STEPS - 20),
  "index_deleted": (_delete_index, MAX_STEPS - 20),
  "pointer_garbled": (_garble_pointer, MAX_STEPS),
  "pointer_on_a_deleted_step": (_delete_newest, MAX_STEPS - 20),
  "all_deleted_but_the_pointer": (_delete_all_but_pointer, None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_checkpoint(tmp_path, reference, damage):
  corrupt, resumed_from = DAMAGE[damage]
  model_dir = tmp_path / "run"
  shutil.copytree(reference[0], model_dir)
  corrupt(Path(checkpoint_dir(model_dir)) / f"ckpt-{MAX_STEPS}")
  files_before = sorted(str(p) for p in model_dir.rglob("*"))
  executor = start(model_dir, log=tmp_path / "log")
  code = executor.finish()
  if resumed_from is None:
    # Nothing to restore although the pointer says there was: stop before writing anything.
    assert code == 2, executor.tail()
    (line,) = executor.error_lines()
    assert "no checkpoint can be restored" in line and checkpoint_dir(model_dir) in line, line
    assert sorted(str(p) for p in model_dir.rglob("*")) == files_before
    return
  assert code == 0, executor.tail()
  assert f"at step {resumed_from}" in executor.log
  if resumed_from < MAX_STEPS:
    assert f"Skipping checkpoint {checkpoint_dir(model_dir)}/ckpt-{MAX_STEPS}" in executor.log
  if damage == "pointer_garbled":
    assert "could not be read (kept as" in executor.log
    assert (Path(checkpoint_dir(model_dir)) / "checkpoint.unreadable").exists()
  assert_same_state(final_state(model_dir), reference[1])
  assert_disk_consistent(model_dir)


# ---------------------------------------------------------------------------------------- storage

BIG = ["SpiralsClassifier.hidden_sizes = (512, 512)"]  # ~3.2 MB per checkpoint (weights and Adam slots).


def test_full_disk_stops_with_a_clear_message_and_resumes_on_a_disk_with_space(tmp_path):
  with tmpfs(tmp_path / "disk", "8m") as disk:
    model_dir = disk / "run"
    executor = start(model_dir, *BIG, log=tmp_path / "log1")
    assert executor.finish() == 1, executor.tail()
    (line,) = executor.error_lines()
    assert "the disk is full" in line and f"writing '{model_dir}/" in line, line
    assert f"the latest checkpoint is '{model_dir}/checkpoints/ckpt-" in line, line
    assert "Traceback" not in executor.log
    step = assert_disk_consistent(model_dir)
    assert 0 < step < MAX_STEPS
    subprocess_run(["mount", "-o", "remount,size=64m", str(disk)])
    executor = start(model_dir, *BIG, log=tmp_path / "log2")
    assert executor.finish() == 0, executor.tail()
    assert f"at step {step}" in executor.log
    assert latest_step(model_dir) == MAX_STEPS
    assert_disk_consistent(model_dir)


def subprocess_run(args):
  import subprocess

  subprocess.run(args, check=True, capture_output=True)


def test_model_dir_turned_read_only_stops_clearly_and_loses_nothing(tmp_path, reference):
  with tmpfs(tmp_path / "disk", "64m") as disk:
    view = tmp_path / "view"
    view.mkdir()
    subprocess_run(["mount", "--bind", str(disk), str(view)])
    try:
      holds = tmp_path / "holds"
      executor = start(view / "run", *hold_params(holds, "train", 50), log=tmp_path / "log1")
      executor.wait_held(holds, "train")
      # A tmpfs cannot be remounted read-only while the run holds files open for writing (EBUSY):
      # a read-only view is mounted over model_dir instead; every new file and rename fails.
      bind_read_only(disk, view)
      release(holds, "train")
      try:
        assert executor.finish() == 1, executor.tail()
      finally:
        unmount(view)
      (line,) = executor.error_lines()
      assert "read-only" in line and f"writing '{view / 'run'}/" in line, line
      assert "Traceback" not in executor.log
      step = assert_disk_consistent(view / "run")
      executor = start(view / "run", log=tmp_path / "log2")
      assert executor.finish() == 0, executor.tail()
      assert f"at step {step}" in executor.log
      assert_same_state(final_state(view / "run"), reference[1])
    finally:
      unmount(view)


def test_model_dir_with_spaces_and_non_ascii_characters(tmp_path, reference):
  model_dir = tmp_path / "my run ünïcødé 日本語 (1)"
  executor = start(model_dir, *hold_params(tmp_path / "holds", "train", 90), log=tmp_path / "log1")
  executor.wait_held(tmp_path / "holds", "train")
  executor.kill()
  step = assert_disk_consistent(model_dir)
  assert step == 80
  executor = start(model_dir, log=tmp_path / "log2")
  assert executor.finish() == 0, executor.tail()
  assert f"at step {step}" in executor.log
  assert_same_state(final_state(model_dir), reference[1])
  assert_disk_consistent(model_dir)
  report = Executor(["report", f"--model_dir={model_dir}"], tmp_path / "report.log")
  assert report.finish() == 0, report.tail()
  assert str(MAX_STEPS) in report.log


# ----------------------------------------------------------------------------------------- signals


def pausing_task(tmp_path, kind, run, holds):
  """A gin file of a spirals run that holds (hold `kind`, marker in `holds`) in the `run`-th run of its eval or
  decode program ('eval', 'decode'), or of its decode's host post-processing ('postprocess')."""
  path = tmp_path / f"pause_{kind}.gin"
  path.write_text(
    "import fault_helpers\n"
    "Executor.task = @PausingSpirals()\n"
    "PausingSpirals.hidden_sizes = (32, 32)\n"
    "PausingSpirals.dropout = 0.1\n"
    "PausingSpirals.num_train_examples = 4000\n"
    "PausingSpirals.num_test_examples = 256\n"
    "PausingSpirals.global_batch_size = 64\n"
    f"PausingSpirals.pause_in = '{kind}'\n"
    f"PausingSpirals.pause_at_run = {run}\n"
    f"PausingSpirals.hold_dir = {str(holds)!r}\n"
  )
  return path


def test_sigterm_during_eval_and_decode_and_a_second_job_on_the_same_model_dir(tmp_path, reference):
  model_dir, holds = tmp_path / "run", tmp_path / "holds1"
  executor = start(model_dir, log=tmp_path / "log1", gin_files=[pausing_task(tmp_path, "eval", 2, holds)])
  executor.wait_held(holds, "eval")  # The eval of step 40.
  second = start(model_dir, log=tmp_path / "second.log")
  assert second.finish() == 2, second.tail()
  (line,) = second.error_lines()
  assert f"is in use by another executor (pid {executor.pid} " in line, line
  # Delivered while the eval is held; the handler runs once the eval returns.
  executor.signal(signal.SIGTERM)
  release(holds, "eval")
  assert executor.finish() == 0, executor.tail()
  assert "Final checkpoint at step 40 " in executor.log and "stopped by SIGTERM" in executor.log
  assert assert_disk_consistent(model_dir) == 40
  assert [s for s, _ in read_scalars(model_dir / "eval_test")["loss"]] == [20, 40]
  assert assert_decodes_complete(model_dir) == [20, 40]

  holds = tmp_path / "holds2"
  executor = start(model_dir, log=tmp_path / "log2", gin_files=[pausing_task(tmp_path, "decode", 2, holds)])
  executor.wait_held(holds, "decode")  # The decode of step 80.
  executor.signal(signal.SIGTERM)
  release(holds, "decode")
  assert executor.finish() == 0, executor.tail()
  assert "Final checkpoint at step 80 " in executor.log and "stopped by SIGTERM" in executor.log
  assert assert_disk_consistent(model_dir) == 80
  assert assert_decodes_complete(model_dir) == [20, 40, 60, 80]

  executor = start(model_dir, log=tmp_path / "log3")
  assert executor.finish() == 0, executor.tail()
  assert_same_state(final_state(model_dir), reference[1])
  assert assert_decodes_complete(model_dir) == list(range(20, MAX_STEPS + 1, 20))


def test_sigterm_twice_is_one_clean_stop(tmp_path):
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  executor = start(model_dir, *hold_params(holds, "train", 50), log=tmp_path / "log")
  executor.wait_held(holds, "train")  # In the main thread: the handler runs and logs while held.
  executor.signal(signal.SIGTERM)
  executor.wait_for("SIGTERM received")  # Two signals sent at once would arrive as one.
  executor.signal(signal.SIGTERM)
  executor.wait_for("SIGTERM received")
  release(holds, "train")
  assert executor.finish() == 0, executor.tail()
  assert executor.log.count("Final checkpoint at step") == 1 and "stopped by SIGTERM" in executor.log
  assert "Traceback" not in executor.log
  assert assert_disk_consistent(model_dir) == 50


def test_sigint_twice_exits_at_once_with_one_message(tmp_path):
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  executor = start(model_dir, *hold_params(holds, "train", 50), log=tmp_path / "log")
  executor.wait_held(holds, "train")
  executor.signal(signal.SIGINT)
  executor.wait_for("SIGINT received")  # Two signals sent at once would arrive as one.
  executor.signal(signal.SIGINT)  # Raised in the hold: the process never goes on.
  assert executor.finish() == 130, executor.tail()
  (line,) = executor.error_lines()
  assert "second Ctrl-C" in line and "latest checkpoint" in line, line
  assert "Traceback" not in executor.log
  step = assert_disk_consistent(model_dir)
  assert step == 40 and str(step) in line


def test_continuous_eval_of_a_run_saving_asynchronously_never_reads_a_partial_checkpoint(tmp_path):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  train_dir.mkdir()
  params = ["SpiralsClassifier.hidden_sizes = (256, 256)", "Checkpointer.max_to_keep = 100"]
  evaluator = start(
    eval_dir,
    *params,
    "Executor.eval_poll_secs = 0.02",
    "Executor.eval_timeout_secs = 600",  # Ends after the checkpoint of max_steps; this is a safety net.
    flags=["--mode=continuous_eval", f"--watch_dir={train_dir}"],
    log=tmp_path / "eval.log",
  )
  evaluator.wait_for("Compiled program decode_test")
  trainer = start(train_dir, *params, "Checkpointer.async_save = True", log=tmp_path / "train.log")
  assert trainer.finish() == 0, trainer.tail()
  assert evaluator.finish() == 0, evaluator.tail()
  assert "Skipping checkpoint" not in evaluator.log
  saved = list(range(20, MAX_STEPS + 1, 20))
  evaluated = json.loads((eval_dir / "continuous_eval.json").read_text())["evaluated"]
  assert MAX_STEPS in evaluated and set(evaluated) <= set(saved)
  # The evaluator's metrics at each step are the trainer's own eval of the same weights.
  ours = dict(read_scalars(eval_dir / "eval_test")["loss"])
  theirs = dict(read_scalars(train_dir / "eval_test")["loss"])
  for step in evaluated:
    assert ours[step] == pytest.approx(theirs[step], rel=1e-6), step
  assert_event_files_readable(eval_dir)
  assert_decodes_complete(eval_dir)


# ------------------------------------------------------------------------------ records across a crash


def test_kill_9_while_a_decode_is_post_processed_loses_no_decode_records(tmp_path, reference):
  # The decode of step 20 is held in its host post-processing; a checkpoint of step 20 must wait for it.
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  executor = start(
    model_dir, log=tmp_path / "log1", gin_files=[pausing_task(tmp_path, "postprocess", 1, holds)]
  )
  executor.wait_held(holds, "postprocess")  # Never released: the post-processing of step 20 never ends.
  # The save of step 20 logs that it waits, then blocks on the held post-processing: the line marks a moment the
  # run cannot leave. Before the fix the save went ahead while the records of step 20 were still being made: a
  # "Saved" line fails the check below at once.
  executor.wait_for(r"Saved .*ckpt-20\b|checkpoint of step 20 waits for decode_test's post-processing")
  executor.kill()
  assert latest_step(model_dir) is None  # No checkpoint promises records it does not have.
  executor = start(model_dir, log=tmp_path / "log2")
  assert executor.finish() == 0, executor.tail()
  every_decode = list(range(20, MAX_STEPS + 1, 20))
  assert assert_decodes_complete(model_dir) == every_decode
  assert [s for s, _ in read_scalars(model_dir / "decode_test")["accuracy"]] == every_decode
  assert_same_state(final_state(model_dir), reference[1])


def test_temporary_files_of_killed_runs_are_removed_at_start(tmp_path):
  model_dir = tmp_path / "run"
  assert start(model_dir, "Executor.max_steps = 40", log=tmp_path / "log1").finish() == 0
  dead = subprocess.Popen(["true"])
  dead.wait()
  host = socket.gethostname().replace(".", "-")
  decodes, checkpoints = model_dir / "decode_test", Path(checkpoint_dir(model_dir))
  gone = [
    decodes / f".decoder_out_20.jsonl.{host}.{dead.pid}.0badc0de.tmp",  # A kill inside a records write.
    model_dir / f".best.json.{host}.{dead.pid}.00c0ffee.tmp",
    checkpoints / "ckpt-60_temp",  # TensorFlow's own leftovers of a save cut short.
    checkpoints / "checkpoint.tmp5f3e2a",
    checkpoints / "ckpt-60.data-00000-of-00001.tempstate1234",
  ]
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "precious").write_text("keep me")
  (outside / f".x.{host}.{dead.pid}.0ddba11.tmp").write_text("keep me too")
  kept = [
    decodes / f".decoder_out_40.jsonl.{host}.{os.getpid()}.00abcdef.tmp",  # A live process's file.
    decodes
    / f".decoder_out_40.jsonl.otherhost.{dead.pid}.00abcdef.tmp",  # Another host's: cannot be checked.
  ]
  for path in gone + kept:
    if path.name.endswith("_temp"):
      path.mkdir()
      (path / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 100)
    else:
      path.write_text("partial")
  links = [decodes / f".y.{host}.{dead.pid}.0abc.tmp", model_dir / "linked_folder"]
  links[0].symlink_to(outside / "precious")
  links[1].symlink_to(outside)
  assert start(model_dir, "Executor.max_steps = 60", log=tmp_path / "log2").finish() == 0
  assert [p for p in gone if os.path.lexists(p)] == []
  assert all(p.exists() for p in kept) and all(p.is_symlink() for p in links)
  assert sorted(p.name for p in outside.iterdir()) == sorted(
    ["precious", f".x.{host}.{dead.pid}.0ddba11.tmp"]
  )
  assert (outside / "precious").read_text() == "keep me"
  assert assert_disk_consistent(model_dir) == 60


@pytest.fixture(scope="module")
def killed_between_checkpoints(tmp_path_factory):
  """A run killed (-9) after writing the summaries of steps after its last checkpoint, then resumed to the end:
  (model_dir, the wall time of the kill, the step resumed from)."""
  root = tmp_path_factory.mktemp("killed_between_checkpoints")
  model_dir = root / "run"
  # Held after the train loop of step 130, past the checkpoint of step 120; its events reach the disk within 50 ms.
  holds = root / "holds"
  executor = start(
    model_dir, "program_writer.flush_secs = 0.05", *hold_params(holds, "train", 130), log=root / "log1"
  )
  executor.wait_held(holds, "train")
  wait_until(lambda: 130 in [s for s, _ in read_scalars(model_dir / "train").get("loss", [])], executor)
  killed_at = time.time()
  executor.kill()
  resumed_from = latest_step(model_dir)
  assert resumed_from == 120
  raw = served_scalars(model_dir, purge=False)
  assert max(s for s, _, _ in raw["train"]["loss"]) > resumed_from, "nothing written after the checkpoint"
  executor = start(model_dir, log=root / "log2")
  assert executor.finish() == 0, executor.tail()
  assert f"at step {resumed_from}" in executor.log
  return model_dir, killed_at, resumed_from


def test_tensorboard_shows_each_step_once_after_a_kill_9_between_checkpoints(killed_between_checkpoints):
  model_dir, killed_at, resumed_from = killed_between_checkpoints
  served = served_scalars(model_dir)
  expected = {
    "train": list(range(10, MAX_STEPS + 1, 10)),
    "eval_test": list(range(20, MAX_STEPS + 1, 20)),
    "decode_test": list(range(20, MAX_STEPS + 1, 20)),
  }
  for run, steps in expected.items():
    assert served[run], run
    for tag, points in served[run].items():
      assert [s for s, _, _ in points] == steps, (
        run,
        tag,
      )  # Once each, in order: before the fix 130 came twice.
      # Past the checkpoint resumed from, each value is the resumed run's.
      assert all(wall > killed_at for s, wall, _ in points if s > resumed_from), (run, tag)
  # `executor report` reads them the same way.
  from executor.cli.report import read_summaries

  assert read_summaries(str(model_dir), "train").scalars["loss"].value == pytest.approx(
    served["train"]["loss"][-1][2]
  )


def test_metrics_jsonl_matches_tensorboard_after_a_kill_9_between_checkpoints(killed_between_checkpoints):
  model_dir, killed_at, resumed_from = killed_between_checkpoints
  served = served_scalars(model_dir)
  for run in ("train", "eval_test", "decode_test", "executor"):
    rows = [json.loads(line) for line in (model_dir / run / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows]
    assert steps == sorted(steps), run  # None going backwards (one step may have rows of several writes).
    assert all(row["wall_time"] > killed_at for row in rows if row["step"] > resumed_from), run
    for tag, points in served[run].items():
      from_jsonl = [(row["step"], row[tag]) for row in rows if tag in row]
      assert [s for s, _ in from_jsonl] == [s for s, _, _ in points], (run, tag)  # Each step once, as served.
      assert [v for _, v in from_jsonl] == pytest.approx([v for _, _, v in points], rel=1e-6, nan_ok=True), (
        run,
        tag,
      )


def test_a_continuous_evaluator_killed_mid_checkpoint_shows_each_step_once(tmp_path):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  assert start(train_dir, "Executor.max_steps = 60", log=tmp_path / "train.log").finish() == 0
  evaluate = ["Executor.max_steps = 60", "Executor.eval_poll_secs = 0.02", "Executor.eval_timeout_secs = 600"]
  flags = ["--mode=continuous_eval", f"--watch_dir={train_dir}"]
  # Held in the decode of the checkpoint of step 40, after writing its eval scalars, then killed.
  holds = tmp_path / "holds"
  held = pausing_task(tmp_path, "decode", 2, holds)
  evaluator = start(
    eval_dir,
    *evaluate,
    "program_writer.flush_secs = 0.05",
    flags=flags,
    gin_files=[held],
    log=tmp_path / "e1.log",
  )
  evaluator.wait_held(holds, "decode")
  wait_until(lambda: 40 in [s for s, _ in read_scalars(eval_dir / "eval_test").get("loss", [])], evaluator)
  evaluator.kill()
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {
    "watch_dir": str(train_dir.resolve()),
    "evaluated": [20],
  }
  evaluator = start(eval_dir, *evaluate, flags=flags, log=tmp_path / "e2.log")
  assert evaluator.finish() == 0, evaluator.tail()
  served = served_scalars(eval_dir)
  for run in ("eval_test", "decode_test"):
    for tag, points in served[run].items():
      assert [s for s, _, _ in points] == [20, 40, 60], (run, tag)  # Before the fix: 40 twice in eval_test.
  rows = [json.loads(line) for line in (eval_dir / "eval_test" / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows] == [20, 40, 60]


def test_a_continuous_evaluator_records_a_checkpoint_evaluated_only_once_its_outputs_are_on_disk(tmp_path):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  assert start(train_dir, "Executor.max_steps = 40", log=tmp_path / "train.log").finish() == 0
  holds = tmp_path / "holds"
  # Writers never flush on their timer: only what the evaluator flushes itself is on disk at the kill.
  evaluator = start(
    eval_dir,
    "Executor.max_steps = 40",
    "Executor.eval_poll_secs = 0.02",
    "program_writer.flush_secs = 3600",
    flags=["--mode=continuous_eval", f"--watch_dir={train_dir}"],
    gin_files=[pausing_task(tmp_path, "decode", 2, holds)],
    log=tmp_path / "e1.log",
  )
  evaluator.wait_held(holds, "decode")  # The decode of step 40, after the record says 20 was evaluated.
  evaluator.kill()
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {
    "watch_dir": str(train_dir.resolve()),
    "evaluated": [20],
  }
  # Before the fix: the decode scalars of step 20 were still in the writer's buffer, lost with the process.
  for run, tag in (("eval_test", "loss"), ("decode_test", "accuracy")):
    assert [s for s, _ in read_scalars(eval_dir / run)[tag]] == [20], run
  assert (eval_dir / "decode_test" / "decoder_out_20.jsonl").exists()


def test_decode_records_keep_the_last_k_and_those_of_kept_and_best_checkpoints(tmp_path):
  model_dir = tmp_path / "run"
  executor = start(
    model_dir,
    "DecodeProgram.keep_records = 1",
    "Executor.actions = [@BestCheckpoints()]",
    "BestCheckpoints.program = 'decode_test'",
    "BestCheckpoints.metric = 'accuracy'",
    "BestCheckpoints.mode = 'max'",
    "BestCheckpoints.keep = 2",
    log=tmp_path / "log",
  )
  assert executor.finish() == 0, executor.tail()
  best = {r["step"] for r in json.loads((model_dir / "best" / "best.json").read_text())}
  kept = {
    int(p.rsplit("-", 1)[1])
    for p in tf.train.get_checkpoint_state(checkpoint_dir(model_dir)).all_model_checkpoint_paths
  }
  assert kept == {160, 180, 200}
  on_disk = set(assert_decodes_complete(model_dir))
  # The last decode's, the kept and the best checkpoints'; a file is deleted at the next decode after it is
  # none of these, so two may be left by the final cycle: the checkpoint the final save dropped (140), and a
  # best checkpoint the final decode displaced.
  required = {MAX_STEPS} | kept | best
  assert required <= on_disk and len(on_disk - required) <= 2, (on_disk, required)
  assert len(on_disk) < MAX_STEPS // 20
  # Only the files go: the decode scalars of every step stay.
  assert [s for s, _ in read_scalars(model_dir / "decode_test")["accuracy"]] == list(
    range(20, MAX_STEPS + 1, 20)
  )


# ------------------------------------------------------------------------------ bad configuration

BAD = {  # name: (gin file content, what the one error line must say besides the file's name)
  "syntax_error": ("Executor.max_steps = (\n", ["syntax_error.gin", "syntax error at line 2"]),
  "binary_file": (bytes(range(256)) * 8, ["binary_file.gin", "not a text file (byte 0x80 at offset 128"]),
  "negative_max_steps": ("Executor.max_steps = -5\n", ["Executor.max_steps must be an integer >= 0, got -5"]),
  "no_such_parameter": (
    "TrainProgram.no_such_parameter = 1\n",
    ["no_such_parameter.gin", "'TrainProgram' doesn't have a parameter named 'no_such_parameter'"],
  ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_configuration_is_one_line_exit_2_and_nothing_written(tmp_path, name):
  content, expected = BAD[name]
  gin_file = tmp_path / f"{name}.gin"
  gin_file.write_bytes(content if isinstance(content, bytes) else content.encode())
  # The shipped quickstart config, then the bad file (the suite's tiny bindings would override it).
  executor = Executor(executor_args(tmp_path / "run", gin_files=[gin_file], tiny=False), tmp_path / "log")
  assert executor.finish() == 2, executor.tail()
  (line,) = executor.error_lines()
  assert "\n" not in line and all(e in line for e in expected), line
  assert "Traceback" not in executor.log
  assert not (tmp_path / "run").exists()


def test_a_huge_steps_per_loop_is_no_fault(tmp_path):
  # Loops are cut to what is left (max_steps, num_batches, the split), so 10^9 runs as one loop.
  executor = start(tmp_path / "run", "TrainProgram.steps_per_loop = 1000000000", log=tmp_path / "log")
  assert executor.finish() == 0, executor.tail()
  assert executor.log.count("] train step ") == 1 and f"] train step {MAX_STEPS}:" in executor.log
  assert assert_disk_consistent(tmp_path / "run") == MAX_STEPS


# ---------------------------------------------------------------- issue 24: one line, exit 2, nothing on disk changed


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished run of 40 steps that keeps its best checkpoints (best/best.json)."""
  root = tmp_path_factory.mktemp("trained")
  executor = start(
    root / "run", "Executor.max_steps = 40", "Executor.actions = [@BestCheckpoints()]", log=root / "log"
  )
  assert executor.finish() == 0, executor.tail()
  return root / "run"


def _events_hold_a_summary(path: Path) -> bool:
  """Whether an event file holds more than its header (a summary, a log message...)."""
  from tensorboard.compat.proto import event_pb2

  data, offset = path.read_bytes(), 0
  while offset + 12 <= len(data):
    (length,) = struct.unpack("<Q", data[offset : offset + 8])
    event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + int(length)])
    if not event.HasField("file_version"):
      return True
    offset += 12 + int(length) + 4
  return False


def disk_state(root: Path) -> dict[str, object]:
  """Every path under `root` (and beside it, for what a planted link or path may reach): its bytes, link or type.

  An event file that holds only its header is left out: programs open their writers while they are prepared,
  before the checks that need them traced.
  """
  state = {}
  for path in sorted(root.rglob("*")):
    key = str(path.relative_to(root))
    if path.is_symlink():
      state[key] = ("link", os.readlink(path))
    elif path.is_dir():
      state[key] = "dir"
    elif ".tfevents." in path.name and not _events_hold_a_summary(path):
      continue
    else:
      state[key] = path.read_bytes()
  return state


def _copy(trained, tmp_path):
  model_dir = tmp_path / "run"
  shutil.copytree(trained, model_dir, symlinks=True)
  return model_dir


def _plant(relative, content):
  """Damage: write `content` (bytes, or 'dir') at `relative` in model_dir."""

  def damage(model_dir):
    path = model_dir / relative
    if path.is_dir():
      shutil.rmtree(path)
    elif path.exists():
      path.unlink()
    if content == "dir":
      path.mkdir(parents=True)
    else:
      path.write_bytes(content)

  return damage


def _link_lock_outside(model_dir):
  (model_dir / ".executor.lock").unlink()
  (model_dir / ".executor.lock").symlink_to(model_dir.parent / "outside" / "precious.txt")


def _best_json_escaping(model_dir):
  records = json.loads((model_dir / "best" / "best.json").read_text())
  records[-1]["path"] = "../../outside/precious.txt"
  (model_dir / "best" / "best.json").write_text(json.dumps(records))


def _pointer_outside(model_dir):
  (model_dir.parent / "outside" / "precious.index").write_text("not a checkpoint of this run")
  pointer = model_dir / "checkpoints" / "checkpoint"
  pointer.write_text(
    'model_checkpoint_path: "ckpt-40"\nall_model_checkpoint_paths: "../../outside/precious"\n'
    + "".join(f'all_model_checkpoint_paths: "ckpt-{s}"\n' for s in (20, 40))
  )


def _continuous_dir(relative_content):
  def damage(model_dir):
    (model_dir.parent / "eval").mkdir()
    (model_dir.parent / "eval" / "continuous_eval.json").write_text(relative_content)

  return damage


def _second_continuous_evaluator(model_dir):
  """A live evaluator's lock on the eval dir (held by this test process, as the kernel sees any other)."""
  (model_dir.parent / "eval").mkdir()
  lock = open(model_dir.parent / "eval" / ".executor.lock", "a+")  # noqa: SIM115  (held through the case)
  fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  lock.write("pid 1234 on elsewhere\n")
  lock.flush()
  return lock


def _truncate_latest_data(model_dir):
  (data,) = (model_dir / "checkpoints").glob("ckpt-40.data-*")
  data.write_bytes(data.read_bytes()[:100])


def _link_outside(relative):
  """Damage: `relative` in model_dir becomes a link to a folder outside it (its content moved there)."""

  def damage(model_dir):
    outside = model_dir.parent / "outside" / relative.replace("/", "_")
    if (model_dir / relative).is_dir():
      shutil.move(model_dir / relative, outside)
    else:
      outside.mkdir(parents=True)
      (outside / "keep.txt").write_text("not the executor's")
    (model_dir / relative).symlink_to(outside)

  return damage


def _link_metrics_outside(model_dir):
  (model_dir / "train" / "metrics.jsonl").unlink()
  (model_dir / "train" / "metrics.jsonl").symlink_to(model_dir.parent / "outside" / "precious.txt")


BEST = "Executor.actions = [@BestCheckpoints()]"
EXPORTER = "Executor.actions = [@Exporter()]"
CONTINUOUS = ["--mode=continuous_eval", "--watch_dir={run}"]
# name: (damage of the trained run's copy, gin bindings, flags, the model_dir used, what the line says)
ONE_LINE = {
  # Class 3: nothing outside model_dir is touched.
  "lock_is_a_symlink": (_link_lock_outside, [], [], "run", ["lock file", ".executor.lock' is a symlink"]),
  "best_json_path_outside": (
    _best_json_escaping,
    [BEST, "Executor.max_steps = 60"],
    [],
    "run",
    ["best.json' holds", "../../outside/precious.txt"],
  ),
  "pointer_names_a_checkpoint_outside": (
    _pointer_outside,
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["checkpoint pointer", "names '", "outside/precious', outside its folder"],
  ),
  # Class 6: evaluation modes.
  "eval_without_checkpoint": (None, [], ["--mode=eval"], "typo", ["no checkpoint to evaluate in", "typo"]),
  "second_continuous_evaluator": (
    _second_continuous_evaluator,
    [],
    CONTINUOUS,
    "eval",
    ["eval' is in use by another executor (pid 1234 on elsewhere)"],
  ),
  "eval_of_a_damaged_checkpoint_path": (
    _truncate_latest_data,
    [],
    ["--mode=eval", "--checkpoint_path={run}/checkpoints/ckpt-40"],
    "eval",
    ["checkpoint '", "run/checkpoints/ckpt-40' cannot be read"],
  ),
  # Class 7: damaged files and paths of the wrong type.
  "best_json_garbled": (
    _plant("best/best.json", b"[{"),
    [BEST, "Executor.max_steps = 60"],
    [],
    "run",
    ["best.json' is unreadable"],
  ),
  "best_json_wrong_shape": (
    _plant("best/best.json", b'{"step": 3}'),
    [BEST, "Executor.max_steps = 60"],
    [],
    "run",
    ["best.json' holds {'step': 3}"],
  ),
  "continuous_eval_json_garbled": (
    _continuous_dir("{"),
    [],
    CONTINUOUS,
    "eval",
    ["continuous_eval.json' is unreadable"],
  ),
  "continuous_eval_json_wrong_shape": (
    _continuous_dir('{"evaluated": ["x"]}'),
    [],
    CONTINUOUS,
    "eval",
    ["continuous_eval.json' must hold", "['x']"],
  ),
  "continuous_eval_json_negative_step": (
    _continuous_dir('{"evaluated": [-5, 20]}'),
    [],
    CONTINUOUS,
    "eval",
    ["continuous_eval.json' must hold", "[-5, 20]"],
  ),
  "continuous_eval_json_of_another_run": (
    _continuous_dir('{"watch_dir": "/elsewhere/run", "evaluated": [20]}'),
    [],
    CONTINUOUS,
    "eval",
    ["continuous_eval.json' records the checkpoints of '/elsewhere/run'", "not those of --watch_dir"],
  ),
  "lock_is_a_directory": (_plant(".executor.lock", "dir"), [], [], "run", [".executor.lock' is a directory"]),
  "checkpoints_is_a_file": (
    _plant("checkpoints", b"x"),
    [],
    [],
    "run",
    ["run/checkpoints' is a file, not a directory"],
  ),
  "train_is_a_file": (
    _plant("train", b"x"),
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["run/train' is a file"],
  ),
  "decoder_out_is_a_directory": (
    _plant("decode_test/decoder_out_60.jsonl", "dir"),
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["decoder_out_60.jsonl' is a directory, not a file"],
  ),
  "best_is_a_file": (
    _plant("best", b"x"),
    [BEST, "Executor.max_steps = 60"],
    [],
    "run",
    ["run/best' is a file"],
  ),
  "path_component_of_300_characters": (
    None,
    [],
    [],
    "a" * 300 + "/run",
    ["bytes long; the file system allows"],
  ),
  "train_split_empty": (
    None,
    ["import fault_helpers", "Executor.task = @EndingSpirals()"],
    [],
    "fresh",
    ["TrainProgram 'train': split 'train' of task 'ending_spirals' is empty"],
  ),
  "eval_split_empty": (
    None,
    ["SpiralsClassifier.num_test_examples = 0"],
    [],
    "fresh",
    ["split 'test'", "is empty"],
  ),
  "max_steps_40_5": (
    None,
    ["Executor.max_steps = 40.5"],
    [],
    "fresh",
    ["Executor.max_steps must be an integer", "40.5"],
  ),
  "max_steps_1e3": (
    None,
    ["Executor.max_steps = 1e3"],
    [],
    "fresh",
    ["Executor.max_steps must be an integer", "1000.0"],
  ),
  "num_batches_1_5": (
    None,
    ["EvalProgram.num_batches = 1.5"],
    [],
    "fresh",
    ["num_batches must be an integer", "1.5"],
  ),
  "ema_decay_1_5": (
    None,
    ["SpiralsClassifier.ema_decay = 1.5"],
    [],
    "fresh",
    ["SpiralsClassifier.ema_decay must be", "< 1"],
  ),
  "eval_poll_secs_negative": (
    None,
    ["Executor.eval_poll_secs = -1"],
    [],
    "fresh",
    ["Executor.eval_poll_secs must be"],
  ),
  "dataset_keys_do_not_fit": (
    None,
    ["import fault_helpers", "Executor.task = @MisfitSpirals()"],
    [],
    "fresh",
    [
      "task 'misfit_spirals'",
      "split 'train'",
      "element spec features: float32",
      "spirals.py:",
      "KeyError: 'x'",
    ],
  ),
  "dataset_shapes_do_not_fit": (
    None,
    ["import fault_helpers", "Executor.task = @MisfitSpirals()", "MisfitSpirals.misfit = 'shape'"],
    [],
    "fresh",
    ["task 'misfit_spirals'", "element spec x: float32(64, 3)", "spirals.py:", "ValueError"],
  ),
  # Class 8: a config accepted, then a promise broken.
  "keep_checkpoint_every_n_hours_negative": (
    None,
    ["Checkpointer.keep_checkpoint_every_n_hours = -1"],
    [],
    "fresh",
    ["Checkpointer.keep_checkpoint_every_n_hours must be a number > 0 or None, got -1"],
  ),
  "best_metric_typo_refused_once_traced": (
    None,
    [BEST, "BestCheckpoints.metric = 'accuracyy'", "Executor.max_steps = 60"],
    [],
    "run",
    ["BestCheckpoints.metric 'accuracyy' is not a metric of program 'eval_test' (it has: accuracy, loss)"],
  ),
  "max_rollbacks_negative": (
    None,
    ["TrainProgram.max_rollbacks = -1"],
    [],
    "fresh",
    ["max_rollbacks must be an integer >= 0"],
  ),
  "profiler_start_step_negative": (
    None,
    ["Executor.actions = [@Profiler()]", "Profiler.start_step = -5"],
    [],
    "fresh",
    ["Profiler.start_step must be an integer >= 0, got -5"],
  ),
  "max_steps_true": (
    None,
    ["Executor.max_steps = True"],
    [],
    "fresh",
    ["Executor.max_steps must be an integer >= 0, got True"],
  ),
  # A folder the run writes (and rotates) in that is a link to outside model_dir.
  "export_dir_is_a_symlink": (
    _link_outside("export"),
    [EXPORTER, "Executor.max_steps = 60"],
    [],
    "run",
    ["run/export' is a symlink"],
  ),
  "best_is_a_symlink": (
    _link_outside("best"),
    [BEST, "Executor.max_steps = 60"],
    [],
    "run",
    ["run/best' is a symlink"],
  ),
  "eval_test_is_a_symlink": (
    _link_outside("eval_test"),
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["run/eval_test' is a symlink"],
  ),
  # A file or folder of the wrong type where the run writes (a traceback, some only at the end of the run).
  "metrics_jsonl_is_a_directory": (
    _plant("train/metrics.jsonl", "dir"),
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["train/metrics.jsonl' is a directory, not a file"],
  ),
  "metrics_jsonl_is_a_symlink": (
    _link_metrics_outside,
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["train/metrics.jsonl' is a symlink"],
  ),
  "export_is_a_file": (
    _plant("export", b"x"),
    [EXPORTER, "Executor.max_steps = 60"],
    [],
    "run",
    ["run/export' is a file"],
  ),
  "best_metrics_is_a_file": (
    _plant("best_metrics", b"x"),
    ["Executor.max_steps = 60"],
    [],
    "run",
    ["run/best_metrics' is a file"],
  ),
  "exporter_metric_typo_refused_once_traced": (
    None,
    [EXPORTER, "Exporter.program = 'eval_test'", "Exporter.metric = 'msee'", "Executor.max_steps = 60"],
    [],
    "run",
    ["Exporter.metric 'msee' is not a metric of program 'eval_test' (it has: accuracy, loss)"],
  ),
  "exporter_mode_median": (
    None,
    [EXPORTER, "Exporter.mode = 'median'"],
    [],
    "fresh",
    ["Exporter.mode must be 'min' or 'max', got 'median'"],
  ),
  "num_samples_in_summary_negative": (
    None,
    ["DecodeProgram.num_samples_in_summary = -1"],
    [],
    "fresh",
    ["DecodeProgram.num_samples_in_summary must be an integer >= 0, got -1"],
  ),
}


@pytest.mark.parametrize("name", list(ONE_LINE))
def test_bad_input_is_one_line_exit_2_and_nothing_on_disk_changed(tmp_path, trained, name):
  damage, params, flags, where, expected = ONE_LINE[name]
  run = _copy(trained, tmp_path)
  (tmp_path / "outside").mkdir()
  (tmp_path / "outside" / "precious.txt").write_text("not the executor's")
  held = damage(run) if damage is not None else None
  before = disk_state(tmp_path)
  model_dir = tmp_path / where
  flags = [f.format(run=run) for f in flags]
  executor = Executor(executor_args(model_dir, *params, flags=flags), tmp_path / "log")
  assert executor.finish() == 2, executor.tail()
  last = executor.log.strip().splitlines()[-1]
  assert last.startswith("executor: error: ") and all(e in last for e in expected), last
  assert "Traceback" not in executor.log
  after = disk_state(tmp_path)
  after.pop("log")
  assert after == before
  if held is not None:
    held.close()


def test_eval_mode_writes_its_own_records_beside_the_training_runs(tmp_path, trained):
  run = _copy(trained, tmp_path)
  records = {name: (run / name).read_bytes() for name in ("operative_config.gin", "model_analysis.txt")}
  executor = Executor(
    executor_args(run, "EvalProgram.num_batches = 2", flags=["--mode=eval"]), tmp_path / "log"
  )
  assert executor.finish() == 0, executor.tail()
  assert {name: (run / name).read_bytes() for name in records} == records
  assert "EvalProgram.num_batches = 2" in (run / "eval_operative_config.gin").read_text()
  assert "total parameters" in (run / "eval_model_analysis.txt").read_text()


def test_sigterm_stops_a_continuous_evaluator_after_the_current_evaluation(tmp_path):
  train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
  params = [
    "Executor.max_steps = 100",
    "Checkpointer.save_interval_steps = 10",
    "Checkpointer.max_to_keep = 100",
  ]
  trainer = start(train_dir, *params, log=tmp_path / "train.log")
  assert trainer.finish() == 0, trainer.tail()
  holds = tmp_path / "holds"
  evaluator = start(
    eval_dir,
    *params,
    "Executor.eval_timeout_secs = 600",
    flags=["--mode=continuous_eval", f"--watch_dir={train_dir}"],
    gin_files=[pausing_task(tmp_path, "eval", 2, holds)],
    log=tmp_path / "eval.log",
  )
  evaluator.wait_held(holds, "eval")  # The eval of step 40, the second of a backlog of three.
  evaluator.signal(signal.SIGTERM)  # Delivered while held; the handler runs once the held op returns.
  release(holds, "eval")
  assert evaluator.finish() == 0, evaluator.tail()
  assert "SIGTERM received" in evaluator.log
  assert json.loads((eval_dir / "continuous_eval.json").read_text()) == {
    "watch_dir": str(train_dir.resolve()),
    "evaluated": [20, 40],
  }
  assert [s for s, _ in read_scalars(eval_dir / "eval_test")["loss"]] == [20, 40]


# Loaded by the interpreter at start-up (sitecustomize): holds when TensorFlow's Python modules are being imported.
HOLD_IN_TENSORFLOW_IMPORT = """
import importlib.abc
import sys

class _HoldInImport(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == "tensorflow.python.framework.ops":
      sys.meta_path.remove(self)
      sys.path.append({tests!r})
      from holds import hold

      hold({holds!r}, "import")
    return None

sys.meta_path.insert(0, _HoldInImport())
"""


def test_ctrl_c_during_start_up_imports_is_one_line(tmp_path):
  holds, hook = tmp_path / "holds", tmp_path / "hook"
  hook.mkdir()
  tests = str(Path(__file__).resolve().parent)
  (hook / "sitecustomize.py").write_text(HOLD_IN_TENSORFLOW_IMPORT.format(tests=tests, holds=str(holds)))
  process = subprocess.Popen(
    [sys.executable, "-m", "executor.cli.main", *executor_args(tmp_path / "run")],
    cwd=str(Path(__file__).resolve().parent.parent),
    env=dict(os.environ, PYTHONPATH=str(hook)),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    # Ctrl-C as from a terminal: a test run started in the background (a CI script's `&`) ignores SIGINT, and its
    # children would inherit that (the command keeps an ignored SIGINT ignored, as a background job should).
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  try:
    wait_held(holds, "import", lambda: process.poll() is None, lambda: "(stderr read at the end)")
    # TensorFlow's library is loaded; its Python modules are being imported.
    assert "_pywrap_tensorflow" in Path(f"/proc/{process.pid}/maps").read_text()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=600)
  finally:
    if process.poll() is None:
      process.kill()
      process.communicate()
  assert process.returncode == 130, err
  assert (
    err.strip().splitlines()[-1]
    == "executor: interrupted during start-up (Ctrl-C): stopped before the first step"
  )
  assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_report_names_a_garbled_pointer_and_flags_a_damaged_event_file(tmp_path, trained):
  run = _copy(trained, tmp_path)
  (event_file,) = (run / "train").glob("events.*")
  data = bytearray(event_file.read_bytes())
  # A record's checksum no longer holds (a cut at a record boundary reads as whole).
  data[len(data) // 2] ^= 0xFF
  event_file.write_bytes(bytes(data))
  report = Executor(["report", f"--model_dir={run}"], tmp_path / "log1")
  assert report.finish() == 0, report.tail()
  assert f"DAMAGED: event file '{event_file}' is damaged or cut short" in report.log
  (run / "checkpoints" / "checkpoint").write_bytes(bytes(range(256)))
  before = disk_state(run)
  report = Executor(["report", f"--model_dir={run}"], tmp_path / "log2")
  assert report.finish() == 2, report.tail()
  last = report.log.strip().splitlines()[-1]
  assert last.startswith("executor: error: checkpoint state file") and "checkpoint' is unreadable" in last, (
    last
  )
  assert "Traceback" not in report.log and disk_state(run) == before


def test_a_train_split_that_ends_is_one_line(tmp_path):
  params = ["import fault_helpers", "Executor.task = @EndingSpirals()", "EndingSpirals.train_batches = 25"]
  executor = start(tmp_path / "run", *params, log=tmp_path / "log")
  assert executor.finish() == 2, executor.tail()
  last = executor.log.strip().splitlines()[-1]
  assert last == (
    "executor: error: TrainProgram 'train': split 'train' of task 'ending_spirals' ended after step 20; training "
    "reads its split without end: repeat it in the task's dataset (ds.repeat())"
  ), last
  assert "Traceback" not in executor.log and assert_disk_consistent(tmp_path / "run") == 20


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_run_in_a_relative_model_dir_resumes(tmp_path, monkeypatch, mode):
  """The README's `--model_dir=runs/first`, run again: the pointer's entries are inside their folder."""
  import keras

  from executor.cli.main import run

  def run(*args, _run=run, **kwargs):
    # Auto-named layers named as in a new process; no gc pass (it took minutes late in a long suite).
    keras.utils.clear_session(free_memory=False)
    return _run(*args, **kwargs)

  monkeypatch.chdir(tmp_path)
  spirals = str(Path(__file__).resolve().parent.parent / "gin" / "spirals.gin")
  params = [*TINY, "Executor.max_steps = 20"]
  assert run("runs/first", [spirals], params, deterministic=True) == 20
  if mode == "train":
    assert run("runs/first", [spirals], [*params, "Executor.max_steps = 40"], deterministic=True) == 40
  else:
    run("runs/first", [spirals], params, deterministic=True, mode="eval")
    assert (tmp_path / "runs/first/eval_operative_config.gin").exists()
  assert not (tmp_path / "runs/first/runs").exists()


def test_index_without_files_is_a_usage_error_of_one_line(tmp_path):
  proc = subprocess.run(
    [sys.executable, "-m", "executor.cli.main", "index"],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
    "executor: error: index needs the record files to index: executor index FILES..."
  )
  assert "Traceback" not in proc.stderr and os.listdir(tmp_path) == []
