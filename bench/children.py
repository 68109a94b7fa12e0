"""Child processes of the benchmarks: their environment, the executor CLI, the time to a log line."""

import os
import queue
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child_env() -> dict[str, str]:
  """This environment with `bench/` on PYTHONPATH, so that children (and gin files) import its modules."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
  return env


def cli_command() -> list[str]:
  """The executor CLI: the installed `executor` script, else `python -m executor.cli.main`."""
  cli = shutil.which("executor", path=os.path.dirname(sys.executable)) or shutil.which("executor")
  return [cli] if cli else [sys.executable, "-m", "executor.cli.main"]


def run_to_marker(
  cmd, marker: str, env, timeout: float | None = None, output: list[str] | None = None
) -> tuple[float | None, dict[str, float]]:
  """Seconds from spawning `cmd` until a line containing `marker`; and of each `PHASE` line.

  The child runs to its end (its exit status is checked). With `timeout`, a
  child that has not printed `marker` by then is killed and the seconds are None.
  With `output`, the child's lines are appended to it.
  """
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  lines: queue.Queue = queue.Queue()  # The child's lines, then None at its end.

  def pump():
    for line in proc.stdout:
      lines.put(line)
    lines.put(None)

  threading.Thread(target=pump, daemon=True).start()
  phases, found, seen = {}, None, []
  while True:
    left = None if timeout is None or found is not None else timeout - (time.perf_counter() - start)
    try:
      line = lines.get(timeout=left) if left is None or left > 0 else None
    except queue.Empty:
      line = None
    if line is None:
      break
    now = time.perf_counter() - start
    seen.append(line)
    if output is not None:
      output.append(line)
    if line.startswith("PHASE "):
      phases[line.split()[1]] = now
    if found is None and marker in line:
      found = now
  if found is None and timeout is not None and proc.poll() is None:
    proc.kill()
    proc.wait()
    return None, phases
  proc.wait()
  if found is None or proc.returncode:
    raise RuntimeError(
      f"{' '.join(cmd)} exited {proc.returncode} without '{marker}':\n" + "".join(seen[-20:])
    )
  return found, phases
