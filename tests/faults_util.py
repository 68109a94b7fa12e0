"""The fault-injection suite's harness: executor processes, tmpfs mounts, checks of what is on disk.

Executor processes are real processes running the `executor` command line
(`executor.cli.main.main`). By default they are forked from one
multiprocessing fork server that has imported TensorFlow, Keras and the
executor once (a fresh interpreter spends ~5 s importing them on the CI
machine, ~70% of a short run); each child runs the command line from
`main()` and exits as the interpreter would (atexit handlers, non-daemon
threads). `FAULTS_LAUNCHER=exec` starts each one as
`python -m executor.cli.main` instead. Either way the process gets real
signals and writes real files; its stdout and stderr go to a log file the
test reads.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from holds import wait_delivered, wait_held

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

# The quickstart task at tiny sizes: 10-step loops, a save every 20 steps, an
# eval and a decode (one batch of 64 each) every 20 steps, dropout (its RNG
# state must resume exactly too).
MAX_STEPS = 200
RECORDS_PER_DECODE = 64
TINY = [
  "SpiralsClassifier.hidden_sizes = (32, 32)",
  "SpiralsClassifier.dropout = 0.1",
  "SpiralsClassifier.num_train_examples = 4000",
  "SpiralsClassifier.num_test_examples = 256",
  "TrainProgram.steps_per_loop = 10",
  "SimpleProgramSchedule.train_executions_per_eval = 2",
  "EvalProgram.num_batches = 1",
  "DecodeProgram.num_batches = 1",
  f"Executor.max_steps = {MAX_STEPS}",
  "Checkpointer.save_interval_steps = 20",
  "Checkpointer.max_to_keep = 3",
]

_PRELOAD = [
  "tensorflow",
  "keras",
  "tensorboard.compat.proto.event_pb2",
  "executor.cli.main",
  "executor.cli.config",
  "executor.executor",
  "programs",
  "executor.tasks.spirals",
]
_context = None
_live: list[Executor] = []


def _fork_context():
  global _context
  if _context is None:
    _context = multiprocessing.get_context("forkserver")
    _context.set_forkserver_preload(_PRELOAD)
  return _context


def _child(argv: list[str], log: str) -> None:
  """Runs the command line in a fork-server child, exiting as `python -m executor.cli.main` would."""
  fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(fd, 1)
  os.dup2(fd, 2)
  os.close(fd)
  os.chdir(REPO)
  sys.argv = ["executor", *argv]
  interrupted = False
  try:
    from executor.cli.main import main

    main()
    code = 0
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if e.code is not None and not isinstance(e.code, int):
      print(e.code, file=sys.stderr)
  except KeyboardInterrupt:
    traceback.print_exc()
    code, interrupted = 130, True
  except BaseException:  # noqa: BLE001  (the interpreter prints it and exits 1)
    traceback.print_exc()
    code = 1
  threading._shutdown()  # Joins non-daemon threads, as interpreter exit does.
  atexit._run_exitfuncs()
  sys.stdout.flush()
  sys.stderr.flush()
  if interrupted:  # An uncaught KeyboardInterrupt ends the interpreter by SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  os._exit(code)


class Executor:
  """One `executor` process whose log can be awaited line by line."""

  def __init__(self, argv: list[str], log: Path):
    self.argv, self.log_path = list(argv), Path(log)
    self.log_path.parent.mkdir(parents=True, exist_ok=True)
    self.log_path.write_text("")
    self.lines: list[str] = []
    self._seen = 0
    self._partial = ""
    self._offset = 0
    if os.environ.get("FAULTS_LAUNCHER", "fork") == "exec":
      env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]))
      with open(self.log_path, "a") as out:
        self._popen = subprocess.Popen(
          [sys.executable, "-m", "executor.cli.main", *argv], cwd=REPO, env=env, stdout=out, stderr=out
        )
      self._process = None
      self.pid = self._popen.pid
    else:
      self._popen = None
      self._process = _fork_context().Process(target=_child, args=(self.argv, str(self.log_path)))
      self._process.start()
      self.pid = self._process.pid
    _live.append(self)

  @property
  def returncode(self) -> int | None:
    """The exit status (negative: the signal that ended it), or None while it runs."""
    if self._popen is not None:
      return self._popen.poll()
    return self._process.exitcode

  def _read(self) -> None:
    with open(self.log_path, errors="replace") as f:
      f.seek(self._offset)
      text = f.read()
      self._offset = f.tell()
    text = self._partial + text
    *complete, self._partial = text.split("\n")
    self.lines.extend(line + "\n" for line in complete)

  def wait_for(self, pattern: str, timeout: float = 600) -> re.Match:
    """The first match of `pattern` in a log line not looked at yet, waiting for it."""
    deadline = time.monotonic() + timeout
    while True:
      exited = self.returncode is not None
      self._read()
      for i in range(self._seen, len(self.lines)):
        match = re.search(pattern, self.lines[i])
        if match:
          self._seen = i + 1
          return match
      self._seen = len(self.lines)
      if exited or time.monotonic() > deadline:
        why = f"exited with {self.returncode}" if exited else f"{timeout}s passed"
        self.kill()
        raise AssertionError(f"no log line matched {pattern!r} ({why}); log tail:\n{self.tail()}")
      time.sleep(0.02)

  def finish(self, timeout: float = 600) -> int:
    """Waits for the exit (killing the process after `timeout`); returns the exit status."""
    try:
      if self._popen is not None:
        self._popen.wait(timeout=timeout)
      else:
        self._process.join(timeout)
      if self.returncode is None:
        raise AssertionError(f"still running after {timeout}s; log tail:\n{self.tail()}")
    finally:
      self.kill()
      self._read()
    return self.returncode

  def wait_held(self, folder, name: str, timeout: float = 600) -> None:
    """Waits until the process holds at `name` (tests/holds.py); fails if it ends first."""
    wait_held(folder, name, lambda: self.returncode is None, lambda: self.log, timeout)

  def signal(self, sig: int) -> None:
    """Sends `sig` to the process and waits until the kernel has delivered it (`holds.wait_delivered`)."""
    os.kill(self.pid, sig)
    wait_delivered(self.pid, sig)

  def kill(self) -> None:
    """SIGKILL, and waits until it is gone."""
    if self.returncode is None:
      with contextlib.suppress(ProcessLookupError):
        os.kill(self.pid, signal.SIGKILL)
      if self._popen is not None:
        self._popen.wait()
      else:
        self._process.join()
    if self in _live:
      _live.remove(self)

  @property
  def log(self) -> str:
    """The whole log so far."""
    self._read()
    return "".join(self.lines) + self._partial

  def tail(self, n: int = 40) -> str:
    """The last `n` log lines."""
    return "".join(self.log.splitlines(keepends=True)[-n:])

  def error_lines(self) -> list[str]:
    """The `executor: ...` messages the user sees, each with the lines that continue it (a message
    that spans several lines comes back as one string holding newlines)."""
    messages = []
    for line in self.log.splitlines():
      if line.startswith("executor: "):
        messages.append(line)
      elif messages and line.startswith("  "):
        messages[-1] += "\n" + line
    return messages


def wait_until(condition, executor: Executor, timeout: float = 600) -> None:
  """Waits until `condition()` holds (what a held run writes reaching the disk), failing if `executor` ends first
  or after `timeout` seconds (a safety net: the wait is on the condition, not the clock)."""
  deadline = time.monotonic() + timeout
  while not condition():
    assert executor.returncode is None, f"exited with {executor.returncode}; log tail:\n{executor.tail()}"
    assert time.monotonic() < deadline, f"not there after {timeout}s; log tail:\n{executor.tail()}"
    time.sleep(0.02)


def kill_all() -> None:
  """Kills every executor a test left running."""
  for executor in list(_live):
    executor.kill()


def forked(target, *args) -> multiprocessing.Process:
  """A process forked from the fork server (TensorFlow and the executor imported once) running `target(*args)`;
  `target` is a module-level function of a module the fork server can import."""
  process = _fork_context().Process(target=target, args=args)
  process.start()
  return process


def executor_args(model_dir, *params, gin_files=(), flags=(), tiny=True, deterministic=True) -> list[str]:
  """Command-line arguments of a spirals run (at the suite's tiny sizes unless `tiny=False`)."""
  args = ["--gin_file=gin/spirals.gin", f"--model_dir={model_dir}", *flags]
  if deterministic:
    args.append("--deterministic")
  args += [f"--gin_file={f}" for f in gin_files]
  return args + [f"--gin_param={p}" for p in [*(TINY if tiny else []), *params]]


def start(model_dir, *params, log, gin_files=(), **kwargs) -> Executor:
  """Starts a spirals run in `model_dir`."""
  return Executor(executor_args(model_dir, *params, gin_files=gin_files, **kwargs), log)


def run_all(runs: list[tuple[list[str], Path]], timeout: float = 600) -> list[Executor]:
  """Runs several executors at once to completion (they share the 2 cores)."""
  executors = [Executor(argv, log) for argv, log in runs]
  for executor in executors:
    executor.finish(timeout)
  return executors


# ---------------------------------------------------------------------------------------------- on disk


def checkpoint_dir(model_dir) -> str:
  return os.path.join(str(model_dir), "checkpoints")


def latest_step(model_dir) -> int | None:
  """The step of the checkpoint the pointer names, or None."""
  import tensorflow as tf

  path = tf.train.latest_checkpoint(checkpoint_dir(model_dir))
  return None if path is None else int(path.rsplit("-", 1)[1])


def checkpoint_state(path) -> dict[str, np.ndarray]:
  """Every tensor of a checkpoint (but the save counter, and a saved input iterator state: a variant tensor numpy
  cannot hold, read by a restore only): reading them all proves it restorable."""
  import tensorflow as tf

  reader = tf.train.load_checkpoint(str(path))
  dtypes = reader.get_variable_to_dtype_map()
  return {
    k: reader.get_tensor(k)
    for k, _ in tf.train.list_variables(str(path))
    if "save_counter" not in k and k != "_CHECKPOINTABLE_OBJECT_GRAPH" and dtypes[k] != tf.variant
  }


def assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
  """Bit for bit."""
  assert a.keys() == b.keys()
  for key in a:
    assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), f"{key} differs"


def assert_pointer_on_a_complete_checkpoint(model_dir) -> int:
  """The pointer names a checkpoint whose every tensor reads back; returns its step."""
  import tensorflow as tf

  path = tf.train.latest_checkpoint(checkpoint_dir(model_dir))
  assert path is not None, f"no checkpoint in {model_dir}"
  assert os.path.exists(f"{path}.index"), f"the pointer names {path}, which has no index"
  checkpoint_state(path)
  return int(path.rsplit("-", 1)[1])


def assert_event_files_readable(model_dir) -> None:
  """TensorBoard reads every summary folder (a run killed mid-write may leave a truncated last record)."""
  from conftest import read_scalars

  folders = {
    os.path.dirname(p) for p in glob.glob(os.path.join(str(model_dir), "**", "events.out.*"), recursive=True)
  }
  assert folders, f"no event file in {model_dir}"
  for folder in folders:
    read_scalars(folder)
  if os.path.isdir(os.path.join(str(model_dir), "train")):
    assert read_scalars(os.path.join(str(model_dir), "train"))["loss"], "no train loss readable"


def assert_decodes_complete(model_dir, records: int = RECORDS_PER_DECODE) -> list[int]:
  """Every decoder_out_<step>.jsonl holds all its records (never half a file); returns the steps."""
  steps = []
  for path in sorted(glob.glob(os.path.join(str(model_dir), "decode_test", "decoder_out_*.jsonl"))):
    lines = Path(path).read_text().splitlines()
    assert len(lines) == records, f"{path} holds {len(lines)} of {records} records"
    for line in lines:
      json.loads(line)
    steps.append(int(re.search(r"decoder_out_(\d+)\.jsonl$", path).group(1)))
  return sorted(steps)


def assert_disk_consistent(model_dir) -> int:
  """What any fault must leave: a complete checkpoint named by the pointer, readable summaries and
  complete decode records. Returns the latest step."""
  step = assert_pointer_on_a_complete_checkpoint(model_dir)
  assert_event_files_readable(model_dir)
  assert_decodes_complete(model_dir)
  return step


# ---------------------------------------------------------------------------------------------- mounts


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
  """A tmpfs of `size` mounted at `path` for the block; skips the test unless it runs as root."""
  if os.geteuid() != 0:
    pytest.skip(f"mounting a tmpfs needs root; this test runs as uid {os.geteuid()}")
  path.mkdir(parents=True, exist_ok=True)
  result = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
  )
  if result.returncode != 0:
    pytest.skip(f"mount -t tmpfs failed (a container without CAP_SYS_ADMIN?): {result.stderr.strip()}")
  try:
    yield path
  finally:
    kill_all()  # Nothing may hold the mount busy.
    unmount(path)


def unmount(path: Path) -> None:
  """Unmounts `path` (lazily if something still holds it)."""
  if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
    subprocess.run(["umount", "-l", str(path)], check=True)


def bind_read_only(source: Path, target: Path) -> None:
  """Mounts a read-only view of `source` over `target`."""
  subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)], check=True, capture_output=True)
