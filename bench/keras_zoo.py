"""The Keras zoo (`tests/keras_zoo/`): executor train steps/s over `model.fit` steps/s, per model, same run.

Usage: python bench/keras_zoo.py [--quick] [--repeats=N] [--models=structured,gan,...] [--steps_per_loop=50]

For each model of the zoo, three contenders, each with its own copy of the model (built by the model's own
`model_fn`, under its gin file's precision) and the same train pipeline (`KerasTask.dataset` of the train split):

  ours    the executor's `TrainProgram(steps_per_loop=N)` over the `KerasTask` the model's gin file makes;
  fit     `model.fit` as the model's `model_fn` compiled it (`steps_per_execution=1`, its default), with the gin
          file's `class_weight`;
  fit@N   the same with `steps_per_execution=N` (fit's own multi-step loop), for reference.

Each measure opens a new iterator over the pipeline (a `fit` call does; ours is given one) and leaves its first N
steps out of the timing: the shuffle buffer fills again there, and no contender reads batches that its pipeline's
prefetch buffer gathered while another contender ran (several zoo pipelines are slower than their model).
Steps/sec are medians of `--repeats` repeats; ratios are medians of paired rounds
(`harness.measure_interleaved`: the contenders run in rotating turns, so the load of this shared machine falls on
all alike). Tracing and the first loop (or epoch) are excluded. The last line is `ours/fit=<median over models>`.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import gin  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import measure_interleaved, parse_args, say, start, try_build  # noqa: E402
from keras_zoo import ZOO, fit_check  # noqa: E402


class ZooOurs:
  """The executor's train program of a zoo model, `steps_per_loop=n`, built as the `executor` command builds it."""

  def __init__(self, name: str, n: int, model_dir: str):
    self.n = n
    gin.clear_config()
    model = dataclasses.replace(ZOO[name], params=(*ZOO[name].params, f"TrainProgram.steps_per_loop = {n}"))
    start = time.perf_counter()
    self.executor, self.task, self.program, _ = fit_check.executor_of(model, Path(model_dir))
    self.program.run()
    self.warmup_secs = time.perf_counter() - start
    gin.clear_config()

  def measure(self, calls: int) -> tuple[int, float]:
    """`calls` train loops on a new iterator over the train pipeline, after one loop left out of the timing."""
    self.program.input.iterator = iter(self.program.input.dataset)
    self.program.run()
    start = time.perf_counter()
    for _ in range(calls):
      self.program.run()
    return calls * self.n, time.perf_counter() - start


class SteadyFitClock(keras.callbacks.Callback):
  """Stamps the end of a `fit` call's first `skip` executions and the epoch's end."""

  def __init__(self, skip: int):
    super().__init__()
    self.skip, self.seen = skip, 0
    self.start = self.end = None

  def on_train_batch_end(self, batch, logs=None):
    self.seen += 1
    if self.seen == self.skip:
      self.start = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.end = time.perf_counter()


class ZooFit:
  """`model.fit` of a fresh copy of the zoo model on the same train pipeline (`steps_per_execution` as given)."""

  def __init__(self, ours: ZooOurs, name: str, n: int, steps_per_execution: int = 1):
    self.n, self.steps_per_execution = n, steps_per_execution
    task = ours.task
    self.model = fit_check.keras_copy(task, ZOO[name].precision)
    if steps_per_execution > 1:
      self.model.steps_per_execution = steps_per_execution
      self.model.make_train_function(force=True)
    self.dataset = task.dataset(task.train_split, tf.distribute.InputContext())
    class_weight = getattr(task, "class_weight", None)
    self.fit_args = {"class_weight": class_weight} if class_weight else {}
    start = time.perf_counter()
    self.model.fit(self.dataset, epochs=1, steps_per_epoch=n, verbose=0, **self.fit_args)
    self.warmup_secs = time.perf_counter() - start

  def measure(self, calls: int) -> tuple[int, float]:
    """`calls * n` steps of one `fit` call (a new iterator), after its first `n` steps left out of the timing."""
    clock = SteadyFitClock(skip=max(1, self.n // self.steps_per_execution))
    steps = (calls + 1) * self.n
    self.model.fit(
      self.dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock], **self.fit_args
    )
    return calls * self.n, clock.end - clock.start


def zoo(args, model_dir: str) -> dict:
  """{model: {ours, fit, fit@N steps/s, ours/fit, ours/fit@N}}, printed as a table."""
  n = args.steps_per_loop
  steps = 500 if args.quick else 1500
  say(
    f"== keras zoo: train steps/s (median of {args.repeats} repeats), ratios (median of paired rounds), "
    f"N = {n}; warm-up (trace + first loop) excluded =="
  )
  say(f"{'model':18} {'ours':>8} {'fit':>8} {f'fit@{n}':>8} {'ours/fit':>9} {f'ours/fit@{n}':>11}")
  results = {}
  for name in args.models:
    ours = try_build(f"ours {name}", ZooOurs, name, n, os.path.join(model_dir, name.replace("@", "_")))
    if isinstance(ours, str):
      say(f"{name:18} executor: {ours}")
      continue
    contenders = {
      "ours": ours,
      "fit": try_build(f"fit {name}", ZooFit, ours, name, n),
      "fit@n": try_build(f"fit@{n} {name}", ZooFit, ours, name, n, steps_per_execution=n),
    }
    failed = {k: v for k, v in contenders.items() if isinstance(v, str)}
    samples = measure_interleaved(contenders, steps, args.repeats)
    sps = {k: samples.sps(k) if k not in failed else float("nan") for k in contenders}
    ratio = {k: samples.ratio("ours", k) if k not in failed else float("nan") for k in ("fit", "fit@n")}
    results[name] = {**sps, "ours/fit": ratio["fit"], "ours/fit@n": ratio["fit@n"]}
    say(
      f"{name:18} {sps['ours']:>8.1f} {sps['fit']:>8.1f} {sps['fit@n']:>8.1f} {ratio['fit']:>9.3f} "
      f"{ratio['fit@n']:>11.3f}" + "".join(f"  ({k}: {v})" for k, v in failed.items())
    )
  ratios = [r["ours/fit"] for r in results.values() if r["ours/fit"] == r["ours/fit"]]
  say()
  say(f"ours/fit={statistics.median(ratios) if ratios else float('nan'):.3f}")
  return results


def add_flags(parser) -> None:
  parser.add_argument("--models", default=",".join(ZOO), help=f"Comma-separated subset of {list(ZOO)}.")
  parser.add_argument("--steps_per_loop", type=int, default=50, help="N: TrainProgram.steps_per_loop.")


def main() -> None:
  args = parse_args(__doc__.splitlines()[0], extra_flags=add_flags)
  args.models = args.models.split(",")
  unknown = set(args.models) - set(ZOO)
  if unknown:
    raise SystemExit(f"bench/keras_zoo.py: error: unknown models {sorted(unknown)}; choose from {list(ZOO)}")
  start(args)
  keras.utils.set_random_seed(0)
  with tempfile.TemporaryDirectory(prefix="bench_keras_zoo_") as model_dir:
    zoo(args, model_dir)


if __name__ == "__main__":
  main()
