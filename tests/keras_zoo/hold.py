"""What the zoo's kill tests add to a run: a hold after one train loop, so a test kills the process there."""

import os
import time

import gin

from executor.actions import Action


@gin.configurable
class HoldAfterLoop(Action):
  """After the train loop that ends at `step`, writes `marker` and waits until `release` exists.

  Host-side only: the run's state is the same as without it. The test waits for the marker (an event, not a
  time), then kills the process with SIGKILL; the release file is for a test that lets it go on.
  """

  def __init__(self, step: int, marker: str, release: str = ""):
    self.step, self.marker, self.release = step, marker, release

  def after_train_loop(self, result):
    if result.step != self.step:
      return
    with open(self.marker, "w") as f:
      f.write(str(result.step))
    while not (self.release and os.path.exists(self.release)):
      time.sleep(0.01)
