"""Held-out loss of `gin/lm.gin` in float32 against mixed_bfloat16: does 16-bit compute reach the same model?

Usage: python bench/lm_precision.py [--seeds=0,1,2] [--precisions=float32,mixed_bfloat16] [--max_steps=N]

For each seed, one `executor --gin_file=gin/lm.gin --deterministic --seed=S`
child process per precision, run one after the other (so each has the
machine to itself), from a fresh model_dir to the end of the config. The seed
sets the initial weights (and every other Keras seed); the data order is the
task's own (`TransformerLM.seed`), the same in every run. The held-out loss
is the last `eval_eval/loss` summary, read back from the event files.

Without a fixed seed, float32 runs of the config end up to 9% apart (the
initial weights differ: 1.59-1.73 in five runs), so precisions are compared
seed by seed: the ratio
is loss(precision) / loss(float32) of the same seed, and the last line gives
the median ratio and the largest |ratio - 1| over the seeds.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from children import HERE, child_env, cli_command  # noqa: E402
from harness import median, say  # noqa: E402

from executor.cli.report import read_summaries  # noqa: E402

GIN = os.path.join(os.path.dirname(HERE), "gin", "lm.gin")


def run_once(model_dir: str, precision: str, seed: int, max_steps: int | None) -> tuple[float, float, float]:
  """Trains `gin/lm.gin` in `precision` from scratch; returns (held-out loss, perplexity, wall seconds)."""
  cmd = [
    *cli_command(),
    f"--gin_file={GIN}",
    f"--model_dir={model_dir}",
    "--deterministic",
    f"--seed={seed}",
    f"--gin_param=Runtime.precision = '{precision}'",
  ]
  if max_steps is not None:
    cmd.append(f"--gin_param=Executor.max_steps = {max_steps}")
  start = time.perf_counter()
  proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
  secs = time.perf_counter() - start
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
  scalars = read_summaries(model_dir, "eval_eval").scalars
  return scalars["loss"].value, scalars["perplexity"].value, secs


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds (--seed of each run).")
  parser.add_argument("--precisions", default="float32,mixed_bfloat16", help="float32 first: the reference.")
  parser.add_argument(
    "--max_steps", type=int, default=None, help="Override Executor.max_steps (a quick look)."
  )
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  precisions = args.precisions.split(",")
  if precisions[0] != "float32":
    parser.error("--precisions must start with float32 (the reference)")
  say(
    f"bench/lm_precision.py: {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
    f"Python {platform.python_version()}, gin/lm.gin"
    + (f" to step {args.max_steps}" if args.max_steps else "")
  )
  say()
  say(f"{'seed':>4}  {'precision':<15} {'held-out loss':>13} {'perplexity':>10} {'wall s':>7} {'ratio':>7}")
  ratios = {p: [] for p in precisions[1:]}
  with tempfile.TemporaryDirectory(prefix="bench_lm_precision_") as root:
    for seed in seeds:
      reference = None
      for precision in precisions:
        loss, perplexity, secs = run_once(
          os.path.join(root, f"{precision}_{seed}"), precision, seed, args.max_steps
        )
        if reference is None:
          reference = loss
        else:
          ratios[precision].append(loss / reference)
        ratio = loss / reference
        say(f"{seed:>4}  {precision:<15} {loss:>13.4f} {perplexity:>10.3f} {secs:>7.0f} {ratio:>7.3f}")
  say()
  say(
    " ".join(
      f"{p}/float32: median={median(r):.4f} max|r-1|={max(abs(x - 1) for x in r):.4f}"
      for p, r in ratios.items()
    )
  )


if __name__ == "__main__":
  main()
