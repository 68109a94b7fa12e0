"""The files of a checkpoint folder, read without trusting its `checkpoint` pointer alone.

The pointer (`checkpoints/checkpoint`, a text proto naming the latest
checkpoint and the kept ones) can be damaged apart from the checkpoints: a
node dying mid-copy, a user's edit, a sync tool. These helpers let a run
find its checkpoints from the `ckpt-<step>.index` files as well, and repair
an unreadable pointer from them.
"""

from __future__ import annotations

import os
import re
import shutil

import tensorflow as tf
from absl import logging
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import trackable_object_graph_pb2

from programs.core.errors import ConfigError

POINTER = "checkpoint"
_STEP = re.compile(r"-(\d+)$")
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def object_graph(checkpoint_path: str) -> trackable_object_graph_pb2.TrackableObjectGraph | None:
  """The checkpoint's object graph (node 0 is the root, its children the saved items); None if it has none.

  Raises:
    ValueError: the checkpoint's data cannot be read.
  """
  reader = tf.train.load_checkpoint(checkpoint_path)
  if not reader.has_tensor(_OBJECT_GRAPH):
    return None
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  try:
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH))
  except (tf.errors.OpError, IndexError, DecodeError) as e:  # Truncated or corrupt data files.
    raise ValueError(f"checkpoint '{checkpoint_path}' cannot be read: {e}") from None
  return graph


def saved_items(checkpoint_path: str) -> set[str]:
  """The names of the top-level items a checkpoint holds (model, optimizer, each program's and action's state).

  Raises:
    ValueError: the checkpoint's data cannot be read.
  """
  graph = object_graph(checkpoint_path)
  return {child.local_name for child in graph.nodes[0].children} if graph is not None else set()


def step_of(path: str) -> int:
  """The step of `.../ckpt-<step>` (-1 when the name has none)."""
  match = _STEP.search(path)
  return int(match.group(1)) if match else -1


def files_on_disk(directory: str) -> list[str]:
  """Prefixes of the checkpoints whose index file exists in `directory`, oldest first."""
  prefixes = [p[: -len(".index")] for p in tf.io.gfile.glob(os.path.join(directory, "*.index"))]
  return sorted((p for p in prefixes if step_of(p) >= 0), key=step_of)


def listed(directory: str) -> list[str] | None:
  """The checkpoints the pointer lists, oldest first; None when it is missing or unreadable."""
  try:
    state = tf.train.get_checkpoint_state(directory)
  except Exception:  # A garbled text proto: ParseError, UnicodeDecodeError...  # noqa: BLE001
    return None
  return list(state.all_model_checkpoint_paths) if state else None


def repair_pointer(directory: str) -> None:
  """Rewrites an unreadable pointer from the checkpoint files on disk.

  The damaged pointer is kept beside it as `checkpoint.unreadable`, and a
  warning names both. A readable or missing pointer is left alone.
  """
  path = os.path.join(directory, POINTER)
  if not tf.io.gfile.exists(path) or listed(directory) is not None:
    return
  aside = f"{path}.unreadable"
  tf.io.gfile.rename(path, aside, overwrite=True)
  found = files_on_disk(directory)
  if found:
    tf.compat.v1.train.update_checkpoint_state(directory, found[-1], all_model_checkpoint_paths=found)
  logging.warning(
    "The checkpoint pointer %s could not be read (kept as %s); rebuilt it from the files on disk: %s",
    path,
    aside,
    ", ".join(os.path.basename(p) for p in found) or "none",
  )


def restore_candidates(directory: str) -> list[str]:
  """The checkpoints to try restoring, in order.

  First those the pointer lists, newest first, then those whose files are
  in the folder but not in the pointer, newest first. The pointer comes first because it moves only once a checkpoint is complete: a checkpoint whose
  files are there but that the pointer does not name yet (a run killed inside a save) is only a
  last resort, when nothing the pointer names can be read.
  """
  named = list(reversed(listed(directory) or []))
  steps = {step_of(p) for p in named}
  others = [p for p in reversed(files_on_disk(directory)) if step_of(p) not in steps]
  return named + others


# What TensorFlow leaves of a save cut short: the sharded save's `ckpt-N_temp/` folder, a bundle's
# `<file>.tempstate<N>` and the pointer's `checkpoint.tmp<hex>`.
_LEFTOVER_DIR = re.compile(r"^.+-\d+_temp$")
_LEFTOVER_FILE = re.compile(r"^(.+\.tempstate\d+|checkpoint\.tmp[0-9a-f]+)$")


def remove_leftovers(directory: str) -> list[str]:
  """Deletes what saves cut short left in the checkpoint folder `directory` (of a locked model_dir).

  Only TensorFlow's temporary names, only right in `directory`, never through a link. Returns the paths.
  """
  removed = []
  if not os.path.isdir(directory) or os.path.islink(directory):
    return removed
  for entry in os.scandir(directory):
    if entry.is_symlink():
      continue
    if entry.is_dir() and _LEFTOVER_DIR.match(entry.name):
      shutil.rmtree(entry.path, ignore_errors=True)
    elif entry.is_file() and _LEFTOVER_FILE.match(entry.name):
      os.unlink(entry.path)
    else:
      continue
    removed.append(entry.path)
  return removed


def nothing_restorable(directory: str, failures: list[str]) -> ConfigError:
  """The error of a folder whose pointer or files promise checkpoints of which none can be read."""
  return ConfigError(
    f"no checkpoint can be restored from '{directory}' ({'; '.join(failures)}); "
    "bring the files back, or move the folder away to start afresh"
  )


def check_inside(directory: str) -> None:
  """Fails when the pointer names a checkpoint outside `directory`: the manager would delete it there one day.

  Raises:
    ConfigError: naming the pointer and the entry; raised before anything is written or deleted.
  """
  folder = os.path.realpath(directory)
  # TensorFlow has already joined a relative entry to `directory` (itself maybe relative to the working folder).
  for path in listed(directory) or []:
    if os.path.dirname(os.path.realpath(path)) != folder:
      raise ConfigError(
        f"checkpoint pointer '{os.path.join(directory, POINTER)}' names '{path}', outside its folder (the "
        "executor deletes old checkpoints it names, and never a file elsewhere): fix or remove the pointer"
      )
