"""Whole-or-absent files and the one-line messages of storage failures, without a run."""

import errno
import os
import socket
import stat
import subprocess

import pytest
import tensorflow as tf

from executor.checkpoint_files import repair_pointer, restore_candidates
from executor.cli.failures import storage_error
from programs.core.files import atomic_write, remove_dead_temp_files, write_atomically


def test_atomic_write_replaces_the_file_whole(tmp_path):
  path = tmp_path / "records.jsonl"
  path.write_text("old\n")
  write_atomically(str(path), "new\n")
  assert path.read_text() == "new\n"
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
  assert os.listdir(tmp_path) == ["records.jsonl"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / "best.json"
  path.write_text("old")
  with pytest.raises(RuntimeError), atomic_write(str(path)) as f:
    f.write("half")
    raise RuntimeError("the disk is gone")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["best.json"]


def test_storage_errors_name_the_fault_and_the_path(tmp_path):
  error = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "decoder_out_60.jsonl"))
  message = storage_error(error, str(tmp_path))
  assert message.startswith("the disk is full (No space left on device) writing ")
  assert str(tmp_path / "decoder_out_60.jsonl") in message and "latest checkpoint is none" in message
  tf_error = tf.errors.PermissionDeniedError(
    None,
    None,
    "{{function_node x/device:CPU:0}} /data/my run/ckpt-60_temp; Read-only file system [Op:SaveV2]",
  )
  try:
    try:
      raise tf_error
    except tf.errors.PermissionDeniedError:
      raise ValueError("a later error while cleaning up") from None
  except ValueError as later:
    later.__context__ = tf_error
    message = storage_error(later, None)
  assert message.startswith(
    "the file system is read-only (Read-only file system) writing '/data/my run/ckpt-60_temp'"
  )
  assert storage_error(ValueError("a bug"), None) is None


def test_a_garbled_pointer_is_rebuilt_from_the_files(tmp_path):
  v = tf.Variable(1.0)
  checkpoint = tf.train.Checkpoint(v=v)
  manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=5)
  for step in (10, 20):
    manager.save(checkpoint_number=step)
  (tmp_path / "checkpoint").write_bytes(b"\xff\x00 not a proto {")
  repair_pointer(str(tmp_path))
  assert (tmp_path / "checkpoint.unreadable").exists()
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-20")
  assert [os.path.basename(p) for p in restore_candidates(str(tmp_path))] == ["ckpt-20", "ckpt-10"]


def test_a_dead_workers_checkpoint_scratch_folder_is_removed_and_a_live_ones_kept(tmp_path):
  dead = subprocess.Popen(["true"])
  dead.wait()
  host = socket.gethostname().replace(".", "-")
  checkpoints = tmp_path / "run" / "checkpoints"
  gone = checkpoints / f".worker_checkpoint.{host}.{dead.pid}.0badc0de.tmp"
  live = checkpoints / f".worker_checkpoint.{host}.{os.getpid()}.00abcdef.tmp"
  outside = tmp_path / "outside"
  for folder in (gone, live, outside):
    folder.mkdir(parents=True)
    (folder / "ckpt-40.index").write_bytes(b"\0" * 10)
  linked = checkpoints / f".worker_checkpoint.{host}.{dead.pid}.00c0ffee.tmp"
  linked.symlink_to(outside)
  removed = remove_dead_temp_files(str(tmp_path / "run"))
  assert removed == [str(gone)]
  assert not gone.exists() and (live / "ckpt-40.index").exists()
  assert linked.is_symlink() and (outside / "ckpt-40.index").exists()
