"""Train-loop throughput of the executor against a hand-written loop and Keras `fit`.

Usage: python bench/run.py [--quick] [--repeats=N] [--sections=throughput,options,cycle,startup,decode]
       python bench/run.py --workload=lm|images [--quick] [--repeats=N]

One process (plus fresh child processes for start-up times), one workload
family (`bench/bench_workload.py`): a small MLP on in-memory data, where the
per-step framework overhead dominates, and a medium one, where compute does.
Each contender (`bench/harness.py`) has its own copy of the same model,
optimizer and data:

  limit  a hand-written `tf.function`: N steps in a `tf.range` loop over an
         iterator (tape, Keras model, `optimizer.apply`), nothing else;
  keras  `model.compile(steps_per_execution=N)` + `model.fit`;
  ours   the executor's `TrainProgram(steps_per_loop=N)` through its public API.

Steps/sec are medians of `--repeats` repeats (5; 3 with `--quick`); each
repeat runs the contenders in turns over a few short rounds, and ratios are
medians of the per-round ratios (paired, so that the load of this shared
machine falls on both sides alike). Tracing and the first loop are excluded
and reported separately (warm-up). Sections, one file each (each runs alone:
`python bench/<file> [--quick] [--repeats=N]`):

  throughput  (throughput.py) limit, keras, ours at N = 1, 10, 100, 1000 (medium: 1, 10, 100)
  options     (options.py) small, N=100: XLA, no tf.data prefetch, ours' per-loop host costs
  cycle       (cycle.py) a SimpleProgramSchedule cycle (train, eval, decode) against the
              bare hand-written loops; traces per program after the cycles
  startup     (startup.py) seconds from process start to the first finished train loop
              (executor CLI, executor API, Keras fit), medians of 3
  decode      (decode.py) a DecodeProgram whose post-processing sleeps: wall per decode
              against max(device, host)

The last line is `ours/limit@100=<ratio> ours/keras@100=<ratio>` (small).

With `--workload=lm` (or `images`) it runs only the compute-bound benchmark
of that real task (`workload.py`: tokens/sec or images/sec, float32 and
mixed_bfloat16, with and without XLA, achieved FLOP/s against the measured
matmul peak); its last line is the same, for that workload (float32, no XLA).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tempfile  # noqa: E402
import traceback  # noqa: E402

from cycle import cycle  # noqa: E402
from decode import decode_overlap  # noqa: E402
from harness import parse_args, say, start  # noqa: E402
from options import options  # noqa: E402
from startup import startup  # noqa: E402
from throughput import throughput  # noqa: E402
from workload import add_workload_flag, workload  # noqa: E402

RUNNERS = {
  "throughput": throughput,
  "options": options,
  "cycle": cycle,
  "startup": startup,
  "decode": decode_overlap,
}
SECTIONS = tuple(RUNNERS)


def main():
  args = parse_args(__doc__.splitlines()[0], SECTIONS, extra_flags=add_workload_flag)
  start(args)
  if args.workload:
    with tempfile.TemporaryDirectory(prefix="bench_workload_") as model_dir:
      workload(args, model_dir)
    return
  results = {}
  with tempfile.TemporaryDirectory(prefix="bench_run_") as model_dir:
    for section in SECTIONS:
      if section not in args.sections:
        continue
      try:
        os.makedirs(os.path.join(model_dir, section))
        results[section] = RUNNERS[section](args, os.path.join(model_dir, section))
      except Exception:  # noqa: BLE001  (report the section's failure, go on with the others)
        say(f"== {section}: FAILED ==\n{traceback.format_exc()}")
  print_targets(results)


def print_targets(results: dict) -> None:
  say("== targets ==")
  tp = results.get("throughput", {}).get(("small", 100))
  checks = []
  if tp:
    checks.append(("ours/limit@100 (small) >= 0.97", tp["ours/limit"], lambda v: v >= 0.97))
    checks.append(("ours/keras@100 (small) >= 1.0", tp["ours/keras"], lambda v: v >= 1.0))
  if "cycle" in results:
    checks.append(("cycle/bare loops <= 1.05", results["cycle"]["ratio"], lambda v: v <= 1.05))
    checks.append(
      ("extra traces after the first cycle == 0", results["cycle"]["extra_traces"], lambda v: v == 0)
    )
  if "decode" in results:
    checks.append(("decode wall / max(device, host) <= 1.1", results["decode"]["ratio"], lambda v: v <= 1.1))
  if "startup" in results:
    s = results["startup"]
    for name in ("executor CLI", "executor API"):
      checks.append((f"start-up {name} / keras fit <= 1.0", s[name] / s["keras fit"], lambda v: v <= 1.0))
  for text, value, ok in checks:
    say(
      f"  {'met   ' if ok(value) else 'MISSED'} {text}: {value:.3f}"
      if isinstance(value, float)
      else f"  {'met   ' if ok(value) else 'MISSED'} {text}: {value}"
    )
  if tp:
    say(f"ours/limit@100={tp['ours/limit']:.3f} ours/keras@100={tp['ours/keras']:.3f}")
  else:
    say("ours/limit@100=nan ours/keras@100=nan")


if __name__ == "__main__":
  main()
