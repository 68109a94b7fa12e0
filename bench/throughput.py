"""Table 1: limit, keras, ours at N = 1, 10, 100, 1000 steps per loop (medium: 1, 10, 100).

Usage: python bench/throughput.py [--quick] [--repeats=N]

Steps/sec are medians of `--repeats` repeats; ratios are medians of paired
rounds (see `harness.measure_interleaved`). Warm-up (trace + first loop) is
excluded and printed separately; `(trace)` is `TrainProgram.compile()`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_workload import MEDIUM, SMALL  # noqa: E402
from harness import KerasFit, Limit, Ours, build, measure_interleaved, run_alone, say  # noqa: E402


def throughput(args, model_dir: str) -> dict:
  """Limit, keras, ours at several N, small and medium; {(workload, N): steps/sec and ratios}."""
  plans = [(SMALL, (1, 10, 100, 1000), args.small_steps), (MEDIUM, (1, 10, 100), args.medium_steps)]
  if args.quick:
    plans = [(SMALL, (1, 10, 100, 1000), args.small_steps), (MEDIUM, (1, 100), args.medium_steps)]
  say(
    f"== throughput: steps/sec (median of {args.repeats} repeats), ratios (median of paired rounds); "
    "warm-up = trace + first loop (s), excluded =="
  )
  header = (
    f"{'workload':8} {'N':>5} {'limit':>8} {'keras':>8} {'ours':>8} {'ours/limit':>10} "
    f"{'ours/keras':>10} {'keras/limit':>11} | {'warm-up s: limit':>16} {'keras':>6} {'ours':>6} (trace)"
  )
  say(header)
  results = {}
  for workload, ns, steps in plans:
    for n in ns:
      contenders = {
        "limit": build(f"limit {n}", Limit, workload, n),
        "keras": build(f"keras {n}", KerasFit, workload, n),
        "ours": build(f"ours {n}", Ours, workload, n, os.path.join(model_dir, f"tp_{workload.name}_{n}")),
      }
      samples = measure_interleaved(contenders, max(steps, n), args.repeats)
      ours = contenders["ours"]
      assert ours.program.trace_count == 1, f"ours was traced {ours.program.trace_count} times"
      sps = {name: samples.sps(name) for name in contenders}
      ratios = {
        "ours/limit": samples.ratio("ours", "limit"),
        "ours/keras": samples.ratio("ours", "keras"),
        "keras/limit": samples.ratio("keras", "limit"),
      }
      results[(workload.name, n)] = {**sps, **ratios}
      w = {k: c.warmup_secs for k, c in contenders.items()}
      say(
        f"{workload.name:8} {n:>5} {sps['limit']:>8.1f} {sps['keras']:>8.1f} {sps['ours']:>8.1f} "
        f"{ratios['ours/limit']:>10.3f} {ratios['ours/keras']:>10.3f} {ratios['keras/limit']:>11.3f} | "
        f"{w['limit']:>16.2f} {w['keras']:>6.2f} {w['ours']:>6.2f} ({ours.compile_secs:.2f})"
      )
  say()
  return results


if __name__ == "__main__":
  run_alone(throughput, __doc__)
