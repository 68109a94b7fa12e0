"""Table 2: small, N=100: XLA, no tf.data prefetch, and where ours' per-loop host time goes.

Usage: python bench/options.py [--quick] [--repeats=N]
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import logging as std_logging  # noqa: E402
import time  # noqa: E402

from absl import logging  # noqa: E402
from bench_workload import SMALL  # noqa: E402
from harness import (
  KerasFit,
  Limit,
  Ours,
  OursLoopOnly,
  build,
  measure_interleaved,
  median,
  run_alone,
  say,
  try_build,
)  # noqa: E402


def options(args, model_dir: str) -> dict:
  """Small, N=100: XLA, no prefetch, and where ours' per-loop host time goes; {contender: steps/sec}."""
  n, workload = 100, SMALL
  say(f"== options: small, N={n}, steps/sec (median of {args.repeats} repeats), paired ratio to limit ==")
  ours = build("ours", lambda: Ours(workload, n, os.path.join(model_dir, "opt_ours")))
  contenders = {
    "limit": build("limit", lambda: Limit(workload, n)),
    "ours": ours,
    "ours: compiled loop only (TrainProgram._loop)": OursLoopOnly(ours),
    "keras": build("keras", lambda: KerasFit(workload, n)),
    "limit, XLA": try_build("limit, XLA", lambda: Limit(workload, n, jit_compile=True)),
    "ours, XLA (TrainProgram.jit_compile=True)": try_build(
      "ours, XLA", lambda: Ours(workload, n, os.path.join(model_dir, "opt_xla"), jit_compile=True)
    ),
    "keras, XLA (jit_compile=True)": try_build("keras, XLA", lambda: KerasFit(workload, n, jit_compile=True)),
    "limit, no prefetch": build("limit, no prefetch", lambda: Limit(workload, n, prefetch=False)),
    "ours, no prefetch": build(
      "ours, no prefetch", lambda: Ours(workload, n, os.path.join(model_dir, "opt_nopf"), prefetch=False)
    ),
    "keras, no prefetch": build("keras, no prefetch", lambda: KerasFit(workload, n, prefetch=False)),
  }
  samples = measure_interleaved(contenders, args.small_steps, args.repeats)
  sps = {name: samples.sps(name) for name in samples.rounds}
  for name, c in contenders.items():
    if isinstance(c, str):
      say(f"  {name:48} failed: {c}")
    else:
      say(
        f"  {name:48} {sps[name]:>8.1f}  x{samples.ratio(name, 'limit'):.3f} of limit   "
        f"warm-up {c.warmup_secs:.2f}s"
      )
  # Where ours' time per loop goes: TrainProgram.run and its compiled loop called
  # alternately (paired, so that the machine's load hits both alike), then each
  # piece of TrainProgram.run's host work timed right after a loop, as it runs.
  program = ours.program
  pairs = []
  for _ in range(args.pairs):
    start = time.perf_counter()
    program._loop(program.input.iterator, n)
    mid = time.perf_counter()
    program.run()
    pairs.append((time.perf_counter() - mid) - (mid - start))
  values = {"loss": 1.0, "learning_rate": 1e-3, "global_step/sec": 1.0, "examples/sec": 1.0}
  # The step and the learning rate come back with the loop's results: no device read.
  pieces = {
    "writer.scalars (the 4 train scalars)": lambda: program.writer.scalars(values, 1),
    "absl INFO log line (as the CLI logs it)": lambda: logging.info(
      "%s step %d: %s, %.1f steps/s", "train", 1, "loss 1.0", 1.0
    ),
  }
  # Log lines go to a null stream, formatted as they would be.
  absl_logger, sink = logging.get_absl_logger(), std_logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
  verbosity, propagate = logging.get_verbosity(), absl_logger.propagate
  absl_logger.addHandler(sink)
  absl_logger.propagate = False
  logging.set_verbosity(logging.INFO)
  times = {name: [] for name in pieces}
  try:
    for _ in range(args.pairs):
      program._loop(program.input.iterator, n)
      for name, fn in pieces.items():
        start = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - start)
  finally:
    logging.set_verbosity(verbosity)
    absl_logger.propagate = propagate
    absl_logger.removeHandler(sink)
    sink.stream.close()
  loop_only = "ours: compiled loop only (TrainProgram._loop)"
  loop_secs = n / sps[loop_only]
  host = median(pairs)
  say(
    f"  ours host work per loop (TrainProgram.run - its compiled loop, paired median of {args.pairs}): "
    f"{1e3 * host:.2f} ms = {100 * host / loop_secs:.1f}% of a {1e3 * loop_secs:.1f} ms loop"
  )
  for name, secs in times.items():
    say(f"    {name:44} {1e3 * median(secs):6.3f} ms")
  graph_gap = 1 / samples.ratio(loop_only, "limit") - 1
  say(
    f"  ours compiled loop vs limit loop: {100 * graph_gap:+.1f}% time per step "
    "(in-graph: metric sums and weights carried, loss scaling, the tail)"
  )
  say()
  return sps


if __name__ == "__main__":
  run_alone(options, __doc__)
