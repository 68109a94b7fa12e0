"""How long a save blocks the main loop: synchronous versus asynchronous checkpoints.

Usage: python bench/checkpoint_save.py [--megabytes=400] [--repeats=5]

Builds float32 variables totalling `--megabytes`, then saves them through the
executor's `Checkpointer` `--repeats` times each way, changing the values
between saves (as training does). "Blocked" is the time `save()` holds the
caller; the async run also reports the time until the write is on disk.
Prints medians and the ratio async/sync of the blocked time.
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import logging  # noqa: E402

from executor.checkpoints import Checkpointer  # noqa: E402


def measure(async_save: bool, variables, repeats: int) -> tuple[float, float]:
  step = tf.Variable(0, dtype=tf.int64)
  with tempfile.TemporaryDirectory() as directory:
    checkpointer = Checkpointer(async_save=async_save, max_to_keep=2, check_finite=False)
    checkpointer.attach(directory, step, {}, variables)
    blocked, total = [], []
    for i in range(repeats + 1):
      for v in variables:
        v.assign_add(tf.ones_like(v))
      step.assign(i + 1)
      start = time.perf_counter()
      checkpointer.save()
      mid = time.perf_counter()
      checkpointer.wait()
      end = time.perf_counter()
      if i:  # The first save includes one-time setup.
        blocked.append(mid - start)
        total.append(end - start)
  return statistics.median(blocked), statistics.median(total)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--megabytes", type=int, default=400)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  count = args.megabytes * 2**20 // 4 // 8
  variables = [tf.Variable(tf.zeros([count]), name=f"v{i}") for i in range(8)]
  sync_blocked, sync_total = measure(False, variables, args.repeats)
  async_blocked, async_total = measure(True, variables, args.repeats)
  print(f"variables: {args.megabytes} MB in 8 tensors, medians of {args.repeats} saves")
  print(f"sync : blocked {sync_blocked:.3f}s, on disk after {sync_total:.3f}s")
  print(f"async: blocked {async_blocked:.3f}s, on disk after {async_total:.3f}s")
  print(f"blocked async/sync={async_blocked / sync_blocked:.3f}")


if __name__ == "__main__":
  main()
