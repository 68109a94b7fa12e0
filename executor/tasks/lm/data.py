"""The LM's data: the standard library's sources as byte tokens, split by file, packed into windows.

The text is real and ships with every Python: the `.py` files of the standard
library (found with `sysconfig`, else next to `os.__file__`), split into train
and held-out BY FILE (a hash of each file's path decides, so the split is
deterministic and does not move when other files come or go).

Vocabulary: bytes. Id 0 is padding, id 1 starts every file (so predicting it
after a file's last byte means "end of file"), and byte `b` is id `b + 2`.

Packing: the files of a split are concatenated, each starting with the
file id, and cut into windows of `sequence_length + 1` ids (inputs and
targets shifted by one), the last one padded. A window can hold the end of
one file and the start of the next: its tokens carry segment ids (one per
file, 0 for padding) and positions that restart at each file, and attention
never crosses a segment.
"""

from __future__ import annotations

import functools
import math
import os
import sysconfig
import zlib
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

PAD_ID = 0
BOS_ID = 1
BYTE_OFFSET = 2
VOCAB_SIZE = 256 + BYTE_OFFSET

DEFAULT_PROMPTS = (
  "import os\n",
  "def main():\n    ",
  "class ",
  "    def __init__(self, ",
  "if __name__ == ",
  "        for i in range(",
  '"""',
  "        return ",
)

DEFAULT_EXCLUDE_DIRS = ("site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test")


def stdlib_root() -> str:
  """The folder of the running Python's standard library."""
  root = sysconfig.get_paths().get("stdlib")
  if root and os.path.isfile(os.path.join(root, "os.py")):
    return root
  return os.path.dirname(os.__file__)


def stdlib_files(root: str, exclude_dirs: Sequence[str] = DEFAULT_EXCLUDE_DIRS) -> list[str]:
  """Paths (relative, `/`-separated, sorted) of every `.py` file under `root`, minus `exclude_dirs`."""
  exclude = set(exclude_dirs)
  out = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in exclude)
    rel = os.path.relpath(folder, root)
    for name in files:
      if name.endswith(".py"):
        out.append(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
  return sorted(out)


def is_held_out(path: str, held_out_percent: int) -> bool:
  """Whether the file at relative `path` belongs to the held-out split (a hash of the path decides)."""
  return zlib.crc32(path.encode("utf-8")) % 100 < held_out_percent


def encode(data: bytes) -> np.ndarray:
  """Token ids (uint16) of raw bytes."""
  return np.frombuffer(data, np.uint8).astype(np.uint16) + BYTE_OFFSET


def decode(ids: Sequence[int] | np.ndarray) -> str:
  """The text of token ids, up to the first padding or file-start id (invalid UTF-8 is replaced)."""
  out = bytearray()
  for i in np.asarray(ids).tolist():
    if i < BYTE_OFFSET:
      break
    out.append(i - BYTE_OFFSET)
  return out.decode("utf-8", errors="replace")


def encode_prompt(text: str) -> np.ndarray:
  """The ids of a prompt: the file-start id, then the text's UTF-8 bytes."""
  return np.concatenate([[BOS_ID], encode(text.encode("utf-8"))]).astype(np.int32)


@functools.lru_cache(maxsize=4)
def load_corpus(
  root: str, exclude_dirs: tuple[str, ...], held_out_percent: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
  """The train and held-out streams of token ids (uint16), each file preceded by `BOS_ID`.

  Returns:
    (train stream, held-out stream, train files, held-out files).
  """
  parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
  for path in stdlib_files(root, exclude_dirs):
    with open(os.path.join(root, path), "rb") as f:
      data = f.read()
    parts[is_held_out(path, held_out_percent)].append(
      np.concatenate([[BOS_ID], encode(data)]).astype(np.uint16)
    )
  streams = [np.concatenate(parts[h]) if parts[h] else np.zeros([0], np.uint16) for h in (False, True)]
  return streams[0], streams[1], len(parts[False]), len(parts[True])


def make_windows(stream: np.ndarray, sequence_length: int) -> np.ndarray:
  """Windows of `sequence_length + 1` ids with stride `sequence_length` (each id is a target once).

  The last window is padded with `PAD_ID`. Returns uint16 [num_windows, sequence_length + 1].
  """
  n = max(1, math.ceil((len(stream) - 1) / sequence_length))
  padded = np.full([n * sequence_length + 1], PAD_ID, np.uint16)
  padded[: len(stream)] = stream
  return np.lib.stride_tricks.sliding_window_view(padded, sequence_length + 1)[::sequence_length].copy()


def pack_features(windows: tf.Tensor) -> dict[str, tf.Tensor]:
  """The model's features of a batch of windows [batch, length + 1] of ids.

  Returns:
    `inputs` and `targets` (int32 [batch, length]), `segment_ids` (one per
    file in the window, counting from 1; 0 on padding) and `positions`
    (restarting at 0 at each file start).
  """
  windows = tf.cast(windows, tf.int32)
  inputs, targets = windows[:, :-1], windows[:, 1:]
  segments = tf.cumsum(tf.cast(tf.equal(inputs, BOS_ID), tf.int32), axis=1) + 1
  # Segments are sorted along each row: a segment starts at its first index.
  starts = tf.searchsorted(segments, segments, side="left", out_type=tf.int32)
  positions = tf.range(tf.shape(inputs)[1])[None, :] - starts
  real = tf.not_equal(inputs, PAD_ID)
  return {
    "inputs": inputs,
    "targets": targets,
    "segment_ids": tf.where(real, segments, 0),
    "positions": tf.where(real, positions, 0),
  }
