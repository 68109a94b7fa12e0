"""Files that are whole or absent: written to a temporary file beside them, synced, then renamed."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[IO[str]]:
  """Opens a text file that appears at `path` only once complete.

  The text goes to a temporary file in the same folder (so the rename stays
  on one file system), which is flushed and fsynced, then renamed over
  `path`; the folder is fsynced so the rename survives a power loss. A
  failure (full disk, read-only folder, an exception in the block) removes
  the temporary file and leaves `path` as it was. Readers, and a run killed
  at any moment, see the old file or the new one, never a part.
  """
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide records from other readers.
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
  with contextlib.suppress(OSError):  # Not every file system can sync a folder.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
      os.fsync(dir_fd)
    finally:
      os.close(dir_fd)


def write_atomically(path: str, text: str) -> None:
  """Writes `text` to `path` with `atomic_write`."""
  with atomic_write(path) as f:
    f.write(text)
