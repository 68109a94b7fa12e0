"""Time per generated token of the LM's on-device decoding, with and without the key/value cache.

Usage: python bench/decode_cache.py [--batch=8] [--repeats=3] [--window=4] [--gin_file=gin/lm.gin]

The model is `gin/lm.gin`'s `TransformerLM` (its sizes; `max_length` raised
so that 256 tokens fit after the prompt; random weights: the cost of a token
does not depend on them). One compiled function runs `executor.tasks.lm.generate`
(the decode program's loop) for 256 + window tokens per row, and records a
`tf.timestamp` on device after each step, so a token's time is the gap
between two consecutive steps of the same on-device loop, with no host round
trip in it. t(n) is the median, over `--repeats` runs, of the gaps of tokens
n - window .. n + window. The table prints t(n) at n = 16, 64, 128, 256 with
and without the cache, their ratio, and t(256) / t(16) for each.

Target: flat (t(256)/t(16) <= 1.5) with the cache; growing without it.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from executor.tasks.lm import TransformerLM, generate, sampler  # noqa: E402

POINTS = (16, 64, 128, 256)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8, help="rows decoded together")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--window", type=int, default=4, help="tokens on each side of n in t(n)")
  parser.add_argument("--gin_file", default="gin/lm.gin")
  args = parser.parse_args()

  gin.parse_config_file(args.gin_file)
  num_new = max(POINTS) + args.window + 1
  keras.utils.set_random_seed(0)
  task = TransformerLM(
    max_length=512, max_prompt_length=16, num_decode_tokens=num_new, prompts=["import os\n"]
  )
  task.build()
  prompts, lengths = task.prompt_arrays()
  prompts = tf.constant(np.repeat(prompts, args.batch, 0))
  lengths = tf.constant(np.repeat(lengths, args.batch, 0))
  greedy = tf.constant([i % 2 == 0 for i in range(args.batch)])  # half greedy, half sampled
  print(
    f"model: {task.num_layers} layers, width {task.model_dim}, {task.num_heads} heads, mlp {task.mlp_dim}; "
    f"batch {args.batch}; prompt {int(lengths[0])} tokens; {num_new} new tokens per row; "
    f"cache buffer {prompts.shape[1] + num_new} positions"
  )

  results = {}
  for cache in (True, False):
    fn = tf.function(
      lambda p, n, c=cache: generate(
        task.model,
        p,
        n,
        num_new,
        sampler(task.generator, greedy, task.temperature, task.top_k),
        cache=c,
        timestamps=True,
      ),
      autograph=False,
    )
    start = time.perf_counter()
    fn(prompts, lengths)  # trace, compile, warm up
    warm = time.perf_counter() - start
    gaps, walls = [], []
    for _ in range(args.repeats):
      start = time.perf_counter()
      _, stamps = fn(prompts, lengths)
      walls.append(time.perf_counter() - start)
      gaps.append(np.diff(stamps.numpy()))  # gaps[k - 1]: the time of token k
    results[cache] = {
      n: statistics.median(np.concatenate([g[n - 1 - args.window : n + args.window] for g in gaps]).tolist())
      for n in POINTS
    }
    print(
      f"cache={cache}: first call (trace + run) {warm:.2f}s, runs {', '.join(f'{w:.2f}s' for w in walls)}"
    )

  print()
  print("| token n | cached ms/token | uncached ms/token | uncached / cached |")
  print("|---:|---:|---:|---:|")
  for n in POINTS:
    c, u = results[True][n] * 1e3, results[False][n] * 1e3
    print(f"| {n} | {c:.3f} | {u:.3f} | {u / c:.2f} |")
  flat, grow = (results[k][256] / results[k][16] for k in (True, False))
  print()
  print(
    f"t(256)/t(16): cached {flat:.2f} (target <= 1.5: {'met' if flat <= 1.5 else 'NOT met'}), uncached {grow:.2f}"
  )


if __name__ == "__main__":
  main()
