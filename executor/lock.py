"""One writer per model_dir: an advisory lock held for the life of a run."""

from __future__ import annotations

import fcntl
import os
import socket
import stat

from absl import logging

from programs.core.errors import ConfigError

LOCK_NAME = ".executor.lock"


class ModelDirLock:
  """An exclusive `flock` on `model_dir/.executor.lock`.

  The kernel drops the lock when its process dies, however it dies (kill -9
  included), so a lock left by a dead run is simply taken over. The file
  records the holder's pid and host for the error message of a second run.
  """

  def __init__(self, model_dir: str):
    self.path = os.path.join(model_dir, LOCK_NAME)
    self._file = None

  def acquire(self) -> None:
    """Takes the lock.

    The file is opened without following a link, so a planted symlink cannot make the run truncate a file
    outside model_dir.

    Raises:
      ConfigError: another live executor holds it (names its pid and host), or the lock's path is a symlink, a
        directory or another thing that is not a regular file.
    """
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
      what = (
        "a symlink"
        if os.path.islink(self.path)
        else "a directory"
        if os.path.isdir(self.path)
        else e.strerror
      )
      raise ConfigError(
        f"lock file '{self.path}' is {what}, not a regular file: remove it (it holds no state)"
      ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      os.close(fd)
      raise ConfigError(f"lock file '{self.path}' is not a regular file: remove it (it holds no state)")
    f = os.fdopen(fd, "r+")  # noqa: SIM115  (held open for the run)
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      f.seek(0)
      holder = f.read().strip() or "unknown process"
      f.close()
      raise ConfigError(
        f"model_dir '{os.path.dirname(self.path)}' is in use by another executor ({holder}); "
        f"stop it first (lock: {self.path})"
      ) from None
    f.seek(0)
    previous = f.read().strip()
    if previous:
      logging.info("Took over the lock of model_dir left by %s", previous)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    self._file = f

  def release(self) -> None:
    """Drops the lock (the file stays; its content no longer matters)."""
    if self._file is not None:
      self._file.seek(0)
      self._file.truncate()
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self) -> ModelDirLock:
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()
