"""Which file and record a damaged-record error is about.

A TFRecord reader that meets a record whose checksum fails says `corrupted record at <byte offset>`, without the
file. `record_dataset` tags the dataset it returns with its files (`tag`); from a pipeline built on it, `tagged`
finds them again, and `find_damaged` finds the record: in each file, the record that starts at that offset (walking
the record headers, 12 bytes each, without reading the records) and whose checksums fail. A position is given only
when exactly one file has a damaged record starting there.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf
from tensorflow.python.lib.io import tf_record

_ATTRIBUTE = "_executor_record_files"
_HEADER = 12  # uint64 length, uint32 masked CRC of the length.
_FOOTER = 4  # uint32 masked CRC of the data.
_LENGTH = struct.Struct("<Q")
_CHUNK = 1 << 20


class ReadFiles(NamedTuple):
  """The record files a pipeline reads, and their compression."""

  files: tuple[str, ...]
  compression: str


def tag(dataset: tf.data.Dataset, files: Sequence[str], compression: str) -> tf.data.Dataset:
  """Marks `dataset` as reading `files` (for `tagged`); returns it."""
  setattr(dataset, _ATTRIBUTE, ReadFiles(tuple(files), compression))
  return dataset


def tagged(dataset: Any) -> ReadFiles | None:
  """The record files of the `record_dataset` `dataset` is built on (through its input datasets), or None."""
  seen, stack = set(), [dataset]
  while stack:
    ds = stack.pop()
    if id(ds) in seen:
      continue
    seen.add(id(ds))
    found = getattr(ds, _ATTRIBUTE, None)
    if found is not None:
      return found
    try:
      stack.extend(ds._inputs())  # noqa: SLF001  (the datasets a transformation reads)
    except (AttributeError, NotImplementedError, TypeError):
      continue
  return None


def record_at(path: str, offset: int, deadline: float = math.inf) -> tuple[int, int] | None:
  """(index, start) of the record whose header or data starts at byte `offset` of `path`, or None.

  A reader reports the offset of the part whose checksum failed: the record's start (its header) or 12 bytes
  past it (its data). Walks the record headers from the start of the file, reading it in chunks (about 1 s per
  million records before the offset; records longer than a chunk are skipped, not read).

  Raises:
    TimeoutError: `time.monotonic()` passed `deadline` first.
  """
  local = "://" not in path  # Python's own reader is much faster than a GFile's.
  with open(path, "rb") if local else tf.io.gfile.GFile(path, "rb") as f:
    position, index, chunk, base = 0, 0, b"", 0
    while position < offset - _HEADER:
      if position + 8 > base + len(chunk):
        if time.monotonic() > deadline:
          raise TimeoutError(path)
        f.seek(position)
        chunk, base = f.read(_CHUNK), position
        if len(chunk) < 8:
          return None
      (length,) = _LENGTH.unpack_from(chunk, position - base)
      position += _HEADER + length + _FOOTER
      index += 1
  return (index, position) if position in (offset, offset - _HEADER) else None


def is_damaged(path: str, start: int) -> bool:
  """Whether the record that starts at byte `start` of `path` fails its checksums (or is cut short)."""
  try:
    tf_record.tf_record_random_reader(path).read(start)
  except (tf.errors.OpError, IndexError):  # DataLossError; IndexError: cut short.
    return True
  return False


def find_damaged(files: Sequence[str], offset: int, secs: float = 60.0) -> list[tuple[str, int, int]] | None:
  """(file, record index, its first byte) of each of the uncompressed `files` with a damaged record at `offset`.

  A file where a record reads whole at `offset` (or 12 bytes before) is passed over at once; the others are walked
  (`record_at`). None when that takes more than `secs`.
  """
  found, deadline = [], time.monotonic() + secs
  for path in files:
    try:
      if tf.io.gfile.stat(path).length <= offset or not all(
        is_damaged(path, s) for s in {offset, max(offset - _HEADER, 0)}
      ):
        continue
      record = record_at(path, offset, deadline)
      if record is not None and is_damaged(path, record[1]):
        found.append((path, *record))
    except TimeoutError:
      return None
    except (tf.errors.OpError, OSError):  # A file gone or unreadable since: it does not say where.
      continue
  return found


def describe(source: ReadFiles | None, offset: int) -> str:
  """Where the damaged record at `offset` is, as a clause for an error message; says so when it is not known."""
  if source is None:
    return f"a record file of the split (TensorFlow does not say which) has a damaged record at byte {offset}"
  files = source.files
  some = f"'{files[0]}'" + (f" and {len(files) - 1} other(s)" if len(files) > 1 else "")
  if source.compression:
    return (
      f"one of the {source.compression} record files {some} has a damaged record (which one is not known)"
    )
  found = find_damaged(files, offset)
  if found is not None and len(found) == 1:
    path, index, start = found[0]
    return f"record {index} (counting from 0), at byte {start} of '{path}', is damaged"
  why = "not found in a minute" if found is None else "not known"
  return f"one of the record files {some} has a damaged record at byte {offset} (which one is {why})"
