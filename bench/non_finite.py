"""The price of watching the weights: `non_finite_policy` 'stop' checks every weight is finite after each loop.

Usage: python bench/non_finite.py [--quick] [--repeats=N]

Two train programs over one task and runtime, identical but for the check (the second overrides
`TrainProgram.watches_weights`), run in alternation; the ratio of their medians per workload and `steps_per_loop`
is the check's cost (1.00: none).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import time  # noqa: E402

from bench_task import BenchTask  # noqa: E402
from harness import median, run_alone, say  # noqa: E402

from programs import TrainProgram  # noqa: E402
from programs.core.runtime import Runtime  # noqa: E402


class Unwatched(TrainProgram):
  """The train program without the check of the weights."""

  @property
  def watches_weights(self) -> bool:
    return False


def _secs(program: TrainProgram, loops: int) -> float:
  start = time.perf_counter()
  for _ in range(loops):
    program.run()
  return time.perf_counter() - start


def non_finite(args, model_dir: str) -> dict:
  """Prints and returns {(workload, steps_per_loop): watched / unwatched seconds}."""
  ratios = {}
  say("| workload | steps_per_loop | watched / unwatched (median of rounds) |")
  say("|---|---|---|")
  for workload, steps_per_loop in (("small", 1), ("small", 100), ("medium", 10)):
    task = BenchTask(workload=workload)
    runtime = Runtime()
    runtime.build([task])
    watched = TrainProgram(task, steps_per_loop=steps_per_loop, name="watched")
    unwatched = Unwatched(task, steps_per_loop=steps_per_loop, name="unwatched")
    for program in (watched, unwatched):
      program.prepare(runtime, os.path.join(model_dir, f"{workload}_{steps_per_loop}"))
      program.run()
    loops = max(1, (args.small_steps if workload == "small" else args.medium_steps) // (5 * steps_per_loop))
    rounds = []
    for r in range(args.repeats * 5):
      pair = (watched, unwatched) if r % 2 else (unwatched, watched)
      secs = {p.name: _secs(p, loops) for p in pair}
      rounds.append(secs["watched"] / secs["unwatched"])
    ratios[(workload, steps_per_loop)] = median(rounds)
    say(f"| {workload} | {steps_per_loop} | {ratios[(workload, steps_per_loop)]:.3f} |")
  return ratios


if __name__ == "__main__":
  run_alone(non_finite, __doc__)
