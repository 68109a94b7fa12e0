"""An action the Keras callback tests load into executor processes through gin, to hold a run at a known point."""

import os
import sys
import time

import gin

from executor import Action


@gin.configurable
class PauseAtStep(Action):
  """Holds the run after the cycle that ends at `step` (after every action before it in the list saw it).

  It prints `PAUSED_AT_STEP <step>` to stderr when the pause starts and goes on once `release_file` exists (or
  after `pause_secs`). It keeps no state, so a run resumed without it is the same run.
  """

  def __init__(self, step: int = 0, release_file: str = "", pause_secs: float = 60.0):
    self.step, self.release_file, self.pause_secs = step, release_file, pause_secs

  def __call__(self, cycle):
    if cycle.step == self.step:
      print(f"PAUSED_AT_STEP {cycle.step}", file=sys.stderr, flush=True)
      end = time.monotonic() + self.pause_secs
      while time.monotonic() < end and not os.path.exists(self.release_file):
        time.sleep(0.02)
    return None
