"""State added to a run after its checkpoints were written starts fresh, and the log says which.

An action (early stopping, a Keras callback's monitor) added to a run that has checkpoints, or state a later
release saves (the input seed), has no item in those checkpoints. Before, the restore refused every such
checkpoint ("no checkpoint can be restored ... bring the files back"): a user could not add `EarlyStopping` to a
run, and a checkpoint written before the input seed was saved could not be resumed.
"""

import logging

import tensorflow as tf
from conftest import read_scalars

from executor.checkpoints import Checkpointer
from executor.cli.main import run
from programs.core.runtime import HostCounter

PARAMS = [
  "Executor.max_steps = 40",
  "TrainProgram.steps_per_loop = 20",
  "Checkpointer.save_interval_steps = 20",
]


def test_a_checkpoint_without_an_item_restores_the_others_and_the_item_starts_fresh(tmp_path, caplog):
  step, kept, added = HostCounter(value=7), HostCounter(value=5), HostCounter(value=3)
  old = Checkpointer()
  old.attach(str(tmp_path / "ckpts"), step, {"kept": kept})
  old.save()
  step.value, kept.value = 0, 0
  new = Checkpointer()
  new.attach(str(tmp_path / "ckpts"), step, {"kept": kept, "added": added})
  with caplog.at_level(logging.INFO):
    assert new.restore() == 7
  assert (kept.value, added.value) == (5, 3)
  assert "ckpt-7 holds no added (added to the run since it was written): it starts fresh" in caplog.text


def test_early_stopping_added_to_a_run_with_checkpoints_resumes_it(tmp_path, caplog):
  model_dir = str(tmp_path / "run")
  assert run(model_dir, ["gin/spirals.gin"], PARAMS) == 40
  with caplog.at_level(logging.INFO):
    step = run(
      model_dir,
      ["gin/spirals.gin"],
      [
        *PARAMS,
        "Executor.max_steps = 80",
        "Executor.actions = [@EarlyStopping()]",
        "EarlyStopping.patience = 9",
      ],
    )
  assert step == 80
  assert "holds no early_stopping (added to the run since it was written): it starts fresh" in caplog.text
  assert "Restored" in caplog.text and "ckpt-40 at step 40" in caplog.text
  assert [s for s, _ in read_scalars(tmp_path / "run" / "train")["loss"]] == [20, 40, 60, 80]


def test_a_damaged_checkpoint_is_still_skipped(tmp_path):
  step, kept = HostCounter(value=7), HostCounter(value=5)
  checkpointer = Checkpointer()
  checkpointer.attach(str(tmp_path / "ckpts"), step, {"kept": kept})
  checkpointer.save()
  data = next((tmp_path / "ckpts").glob("ckpt-7.data-*"))
  data.write_bytes(data.read_bytes()[:10])
  try:
    checkpointer.restore()
  except Exception as e:  # noqa: BLE001
    assert "no checkpoint can be restored" in str(e), e
  else:
    raise AssertionError("a truncated checkpoint was restored")
  assert tf.io.gfile.exists(str(tmp_path / "ckpts" / "ckpt-7.index"))
