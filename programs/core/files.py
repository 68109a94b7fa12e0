"""Files that are whole or absent: written to a temporary file beside them, synced, then renamed."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from typing import IO

# `.<name>.<host>.<pid>.<random>.tmp`: whose temporary file it is, so a later run can tell a dead
# process's leftovers from a live writer's file.
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.(?P<rand>[0-9a-f]+)\.tmp$")


def _host() -> str:
  return socket.gethostname().replace(".", "-") or "host"


def temp_path(path: str) -> str:
  """A fresh temporary file name beside `path`: `.<name>.<host>.<pid>.<random>.tmp`."""
  folder, name = os.path.split(os.path.abspath(path))
  return os.path.join(folder, f".{name}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[IO[str]]:
  """Opens a text file that appears at `path` only once complete.

  The text goes to a temporary file in the same folder (so the rename stays
  on one file system), which is flushed and fsynced, then renamed over
  `path`; the folder is fsynced so the rename survives a power loss. A
  failure (full disk, read-only folder, an exception in the block) removes
  the temporary file and leaves `path` as it was. Readers, and a run killed
  at any moment, see the old file or the new one, never a part; what a kill
  leaves behind is named after its process (`temp_path`), and
  `remove_dead_temp_files` clears it at the next start.
  """
  folder = os.path.dirname(os.path.abspath(path))
  tmp = temp_path(path)
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
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


def remove_dead_temp_files(root: str) -> list[str]:
  """Deletes the temporary files and folders under `root` left by dead processes of this host.

  Walks `root` without following links and deletes only regular files and folders named by `temp_path`
  (`atomic_write`'s files, a worker's checkpoint scratch folder) whose process is gone: a live writer's,
  another host's (its process cannot be checked) or a link is left alone. Returns the paths deleted.
  """
  removed = []
  host = _host()
  for folder, dirs, files in os.walk(root, followlinks=False):
    for name in [*files, *dirs]:
      match = _TEMP.match(name)
      if not match or match.group("host") != host or _alive(int(match.group("pid"))):
        continue
      path = os.path.join(folder, name)
      with contextlib.suppress(OSError):
        if os.path.islink(path):
          continue
        if os.path.isfile(path):
          os.unlink(path)
        elif os.path.isdir(path):
          shutil.rmtree(path)
          dirs.remove(name)
        else:
          continue
        removed.append(path)
  return removed


def _alive(pid: int) -> bool:
  if pid == os.getpid():
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's live process.
    return True
  return True
