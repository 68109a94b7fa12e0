"""Compute-bound throughput on the real tasks: the LM (tokens/sec) and the CNN (images/sec).

Usage: python bench/workload.py --workload=lm|images [--quick] [--repeats=N]
       (or python bench/run.py --workload=lm|images [--quick])

Three contenders train the same model (the same initial weights, copied from
one to the others), on the same batches (each its own copy of the task's own
`train` dataset, seeded alike), with the same loss, at N steps per loop:

  limit  a hand-written `tf.function`: N steps in a `tf.range` loop, each the
         task's own `compute_loss` under a `GradientTape` and
         `optimizer.apply` (with `jit_compile`, the step is an XLA function);
  keras  the task's Keras model in a thin wrapper, `compile(steps_per_execution=N)`
         with an equivalent loss (LM: sparse cross-entropy weighted by the
         padding mask, `reduction='mean_with_sample_weight'`; CNN: sparse
         cross-entropy, the task's on-device augmentation in the wrapper's
         training call), then `fit`;
  ours   the executor's `TrainProgram(steps_per_loop=N)` over the task.

For float32 and mixed_bfloat16 (`Runtime.precision`), without and with XLA
(`jit_compile`). Ratios are paired (`harness.measure_interleaved`).

FLOPs per step are counted analytically (matmuls and convolutions only;
norms, softmax, activations and the optimizer are left out):

  LM   6 * P * T + 12 * L * S * d * T: P the parameters used as matmul weights
       per token (per block 4 d^2 for q, k, v and the output, 2 d m for the
       MLP; plus V d for the tied output embedding; the embedding lookups are
       gathers), T = batch * S tokens per step (every position is computed,
       padding too), and per block and token 2 S d for q.k and 2 S d for the
       weighted sum of v, forward (the full S x S scores are computed, the
       causal mask does not skip any), times 3 for forward and backward;
  CNN  2 * 3 * MACs * batch, MACs per image the sum over convolutions of
       H_out * W_out * k * k * C_in * C_out, plus in * out of the dense layer
       (2 for multiply and add, 3 for forward + backward).

Achieved FLOP/s are printed beside the peak of this machine measured in the
same run: a chain of `tf.linalg.matmul` of large square matrices in float32
and bfloat16.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from harness import FitClock, measure_interleaved, parse_args, say, start, watchdog  # noqa: E402

from executor.tasks.images import DigitsClassifier  # noqa: E402
from executor.tasks.lm import PAD_ID, VOCAB_SIZE, TransformerLM  # noqa: E402
from programs import TrainProgram  # noqa: E402
from programs.core.runtime import Runtime  # noqa: E402

PRECISIONS = ("float32", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class Spec:
  """One workload: which task, with which sizes.

  Attributes:
    name: `lm` or `images`.
    unit: What a step's examples are counted in (`tokens`, `images`).
    task_kwargs: Arguments of the task (sizes, batch).
  """

  name: str
  unit: str
  task_kwargs: dict

  def make_task(self):
    """A new, unbuilt task of this workload (Adam at a fixed learning rate for every contender)."""
    kwargs = dict(self.task_kwargs)
    kwargs.setdefault("optimizer_fn", lambda: keras.optimizers.Adam(learning_rate=1e-3))
    if self.name == "lm":
      return TransformerLM(**kwargs)
    return DigitsClassifier(**kwargs)

  @property
  def batch(self) -> int:
    return self.task_kwargs["global_batch_size"]

  def units_per_step(self) -> int:
    """Tokens (every position of every window) or images per step."""
    if self.name == "lm":
      return self.batch * self.task_kwargs["sequence_length"]
    return self.batch

  def flops_per_step(self) -> float:
    """The analytic train FLOPs of one step (see the module docstring)."""
    k = self.task_kwargs
    if self.name == "lm":
      d, m, layers, s = k["model_dim"], k["mlp_dim"], k["num_layers"], k["sequence_length"]
      tokens = self.units_per_step()
      params = layers * (4 * d * d + 2 * d * m) + VOCAB_SIZE * d
      return 6.0 * params * tokens + 12.0 * layers * s * d * tokens
    return 6.0 * cnn_macs_per_image(k["widths"], k["blocks_per_stage"]) * self.batch


def cnn_macs_per_image(widths, blocks_per_stage: int, size: int = 8, classes: int = 10) -> int:
  """Multiply-adds of `executor.tasks.images.residual_cnn` on one 8x8x1 image (3x3 convs, 'same' padding)."""
  macs = size * size * 9 * 1 * widths[0]  # stem
  for stage, width in enumerate(widths):
    if stage:
      size = (size + 1) // 2  # stride 2, 'same'
      macs += size * size * 9 * widths[stage - 1] * width
    macs += blocks_per_stage * 2 * size * size * 9 * width * width
  return macs + widths[-1] * classes


# Small enough that a --quick run of a workload takes a few minutes on 2 slow cores.
LM = Spec(
  "lm",
  "tokens",
  dict(
    sequence_length=64,
    max_length=256,
    model_dim=64,
    num_heads=4,
    num_layers=2,
    mlp_dim=256,
    global_batch_size=16,
  ),
)
IMAGES = Spec("images", "images", dict(widths=(32, 64), blocks_per_stage=1, global_batch_size=32))
SPECS = {"lm": LM, "images": IMAGES}


def built_task(spec: Spec, precision: str, weights: list[np.ndarray] | None = None):
  """A task of `spec` built by its own `Runtime(precision)`; its model starts from `weights` if given."""
  task = spec.make_task()
  runtime = Runtime(precision=precision)
  runtime.build([task])
  if weights is not None:
    task.model.set_weights(weights)
  return task, runtime


def train_dataset(task) -> tf.data.Dataset:
  """The task's own train dataset on one pipeline (what the runtime distributes for one replica)."""
  return task.dataset("train", tf.distribute.InputContext())


# ----- Contenders (each: `n`, `warmup_secs`, `first_loss`, `measure(calls)`) -----


class TaskLimit:
  """N steps of the task's `compute_loss` under a tape, `optimizer.apply`, in a `tf.range` loop."""

  def __init__(self, spec: Spec, n: int, precision: str, jit_compile: bool, weights=None):
    self.n = n
    self.task, _ = built_task(spec, precision, weights)
    task = self.task
    self.iterator = iter(train_dataset(task))

    def step(batch):
      with tf.GradientTape() as tape:
        loss, _, _ = task.compute_loss(batch, training=True)
        loss = tf.cast(loss, tf.float32)
      variables = task.trainable_variables
      task.optimizer.apply(tape.gradient(loss, variables), variables)
      return loss

    if jit_compile:
      step = tf.function(step, jit_compile=True)

    def loop(iterator, num_steps):
      loss = tf.constant(0.0)
      for _ in tf.range(num_steps):
        loss = step(next(iterator))
      return loss

    self.loop = tf.function(loop)
    begin = time.perf_counter()
    self.first_loss = float(self.run_loop(1)) if n == 1 else None
    if n > 1:
      self.run_loop(n)
    self.warmup_secs = time.perf_counter() - begin

  def run_loop(self, steps: int | None = None):
    return self.loop(self.iterator, tf.constant(steps or self.n)).numpy()

  def measure(self, calls: int) -> tuple[int, float]:
    begin = time.perf_counter()
    for _ in range(calls):
      self.run_loop()
    return calls * self.n, time.perf_counter() - begin


class _LMForFit(keras.Model):
  """The LM's model called on the feature dict, as `fit` calls a model: `model(x, training=...)`."""

  def __init__(self, inner: keras.Model):
    super().__init__(name="lm_for_fit")
    self.inner = inner

  def call(self, features, training=False):
    return self.inner(features["inputs"], features["segment_ids"], features["positions"], training=training)


class _CNNForFit(keras.Model):
  """The CNN with the task's on-device augmentation (its generator) in the training call."""

  def __init__(self, inner: keras.Model, augment):
    super().__init__(name="cnn_for_fit")
    self.inner, self._augment = inner, augment

  def call(self, images, training=False):
    if training:
      images, _ = self._augment(images)
    return tf.cast(self.inner(images, training=training), tf.float32)


def fit_model_and_data(task) -> tuple[keras.Model, keras.losses.Loss, tf.data.Dataset]:
  """The task's model wrapped for `fit`, its equivalent Keras loss, and `(x, y[, sample_weight])` batches."""
  ds = train_dataset(task)
  if isinstance(task, TransformerLM):
    model = _LMForFit(task.model)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    ds = ds.map(lambda f: (f, f["targets"], tf.cast(tf.not_equal(f["targets"], PAD_ID), tf.float32)))
  else:
    model = _CNNForFit(task.model, task.augment)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ds = ds.map(lambda b: (b["image"], b["label"]))
  return model, loss, ds


class TaskKerasFit:
  """The task's model, `compile(steps_per_execution=N)` with the equivalent loss and the task's optimizer, `fit`."""

  def __init__(self, spec: Spec, n: int, precision: str, jit_compile: bool, weights=None):
    self.n = n
    self.task, _ = built_task(spec, precision, weights)
    self.model, loss, self.dataset = fit_model_and_data(self.task)
    self.model.compile(
      optimizer=self.task.optimizer, loss=loss, steps_per_execution=n, jit_compile=bool(jit_compile)
    )
    begin = time.perf_counter()
    history = self.model.fit(self.dataset, epochs=1, steps_per_epoch=n, verbose=0)
    self.warmup_secs = time.perf_counter() - begin
    self.first_loss = float(history.history["loss"][0]) if n == 1 else None

  def measure(self, calls: int) -> tuple[int, float]:
    clock = FitClock()
    self.model.fit(self.dataset, epochs=1, steps_per_epoch=calls * self.n, verbose=0, callbacks=[clock])
    return calls * self.n, clock.end - clock.start


class TaskOurs:
  """The executor's `TrainProgram(steps_per_loop=N)` over the task, made ready by `Program.prepare`."""

  def __init__(
    self,
    spec: Spec,
    n: int,
    precision: str,
    jit_compile: bool,
    model_dir: str,
    weights=None,
    collect_per_example: bool = True,
  ):
    self.n = n
    self.task, self.runtime = built_task(spec, precision, weights)
    self.program = TrainProgram(
      self.task, steps_per_loop=n, jit_compile=jit_compile, collect_per_example=collect_per_example
    )
    begin = time.perf_counter()
    self.compile_secs = self.program.prepare(self.runtime, model_dir)
    result = self.program.run()
    self.warmup_secs = time.perf_counter() - begin
    self.first_loss = result.metrics["loss"] if n == 1 else None

  def measure(self, calls: int) -> tuple[int, float]:
    begin = time.perf_counter()
    for _ in range(calls):
      self.program.run()
    return calls * self.n, time.perf_counter() - begin


def initial_weights(spec: Spec, precision: str) -> list[np.ndarray]:
  """One set of initial weights for every contender of a configuration."""
  task, _ = built_task(spec, precision)
  return task.model.get_weights()


def build(what: str, factory, *args, **kwargs):
  """The contender `factory(*args, **kwargs)`, under a watchdog of 120 s (these warm-ups take 5-60 s here)."""
  with watchdog(f"building {what}", secs=120.0):
    return factory(*args, **kwargs)


def contenders(
  spec: Spec, n: int, precision: str, jit_compile: bool, model_dir: str, with_no_per_example: bool = False
) -> dict[str, Any]:
  """limit, keras, ours (and `ours-nope`: ours with `collect_per_example=False`), built from one set of weights."""
  weights = initial_weights(spec, precision)
  tag = f"{spec.name} {precision} xla={jit_compile} N={n}"
  out = {
    "limit": build(f"limit {tag}", TaskLimit, spec, n, precision, jit_compile, weights),
    "keras": build(f"keras {tag}", TaskKerasFit, spec, n, precision, jit_compile, weights),
    "ours": build(
      f"ours {tag}", TaskOurs, spec, n, precision, jit_compile, os.path.join(model_dir, "ours"), weights
    ),
  }
  if with_no_per_example:
    out["ours-nope"] = build(
      f"ours-nope {tag}",
      TaskOurs,
      spec,
      n,
      precision,
      jit_compile,
      os.path.join(model_dir, "ours_nope"),
      weights,
      collect_per_example=False,
    )
  return out


# ----- The machine's peak -----------------------------------------------------


def matmul_peak(dtype: tf.DType, size: int = 1024, chain: int = 8, repeats: int = 3) -> float:
  """FLOP/s of a chain of `chain` square `size` x `size` matmuls in `dtype` (best of `repeats` timed calls)."""
  rng = np.random.default_rng(0)
  a = tf.constant(rng.normal(size=(size, size)) / np.sqrt(size), dtype)
  x = tf.constant(rng.normal(size=(size, size)), dtype)

  @tf.function
  def run(a, x):
    for _ in tf.range(chain):
      x = tf.linalg.matmul(a, x)
    return x

  run(a, x).numpy()
  best = float("inf")
  for _ in range(repeats):
    begin = time.perf_counter()
    run(a, x).numpy()
    best = min(best, time.perf_counter() - begin)
  return 2.0 * size**3 * chain / best


# ----- The section ------------------------------------------------------------


def workload(args, model_dir: str) -> dict:
  """The table of one workload (`args.workload`); {(precision, xla): rates and ratios}, plus the peaks."""
  spec = SPECS[args.workload]
  unknown = set(args.precisions.split(",")) - set(PRECISIONS) | set(args.xla.split(",")) - {"off", "on"}
  if unknown:
    raise ValueError(f"--precisions/--xla: unknown {sorted(unknown)}")
  n = 100
  steps = 100 if args.quick else 300
  flops = spec.flops_per_step()
  say(
    f"== workload {spec.name}: {spec.unit}/sec at N={n} (median of {args.repeats} repeats), paired ratios; "
    f"{spec.units_per_step()} {spec.unit}/step, {flops / 1e9:.3f} GFLOP/step (analytic) =="
  )
  say(f"  sizes: {spec.task_kwargs}")
  peaks = {"float32": matmul_peak(tf.float32), "bfloat16": matmul_peak(tf.bfloat16)}
  say(
    f"  matmul peak (1024^2 chain): float32 {peaks['float32'] / 1e9:.1f} GFLOP/s, "
    f"bfloat16 {peaks['bfloat16'] / 1e9:.1f} GFLOP/s"
  )
  say(
    f"{'precision':15} {'xla':>5} {'limit':>9} {'keras':>9} {'ours':>9} {'ours/limit':>10} {'ours/keras':>10} "
    f"{'keras/limit':>11} {'ours GFLOP/s':>12} {'% peak':>7} | {'warm-up s: limit':>16} {'keras':>6} {'ours':>6}"
  )
  results: dict[Any, Any] = {"peaks": peaks}
  for precision in args.precisions.split(","):
    for xla in [{"off": False, "on": True}[x] for x in args.xla.split(",")]:
      where = os.path.join(model_dir, f"{precision}_{xla}")
      live = contenders(spec, n, precision, xla, where, with_no_per_example=spec.name == "images")
      samples = measure_interleaved(live, steps, args.repeats)
      rate = {name: samples.sps(name) * spec.units_per_step() for name in samples.rounds}
      ratios = {
        "ours/limit": samples.ratio("ours", "limit"),
        "ours/keras": samples.ratio("ours", "keras"),
        "keras/limit": samples.ratio("keras", "limit"),
      }
      if "ours-nope" in live:
        ratios["ours-nope/limit"] = samples.ratio("ours-nope", "limit")
      achieved = samples.sps("ours") * flops
      peak = peaks["float32" if precision == "float32" else "bfloat16"]
      results[(precision, xla)] = {**rate, **ratios, "gflops": achieved / 1e9}
      w = {k: c.warmup_secs for k, c in live.items()}
      say(
        f"{precision:15} {'on' if xla else 'off':>5} {rate['limit']:>9.0f} {rate['keras']:>9.0f} "
        f"{rate['ours']:>9.0f} {ratios['ours/limit']:>10.3f} {ratios['ours/keras']:>10.3f} "
        f"{ratios['keras/limit']:>11.3f} {achieved / 1e9:>12.2f} {100 * achieved / peak:>6.1f}% | "
        f"{w['limit']:>16.1f} {w['keras']:>6.1f} {w['ours']:>6.1f}"
      )
      if "ours-nope" in live:
        say(
          f"{'':21} ours with collect_per_example=False: {rate['ours-nope']:.0f} {spec.unit}/s, "
          f"/limit {ratios['ours-nope/limit']:.3f}"
        )
  say()
  if ("float32", False) not in results:
    return results
  head = results[("float32", False)]
  say(
    f"  targets (float32, no XLA, N=100): ours/limit >= 0.98: "
    f"{'met' if head['ours/limit'] >= 0.98 else 'MISSED'} ({head['ours/limit']:.3f}); ours/keras >= 1.0: "
    f"{'met' if head['ours/keras'] >= 1.0 else 'MISSED'} ({head['ours/keras']:.3f})"
  )
  say(f"ours/limit@100={head['ours/limit']:.3f} ours/keras@100={head['ours/keras']:.3f}")
  return results


def add_workload_flag(parser) -> None:
  """`--workload=lm|images`, `--precisions`, `--xla` (for `bench/run.py` and this script)."""
  parser.add_argument("--workload", choices=sorted(SPECS), default=None, help="A compute-bound workload.")
  parser.add_argument(
    "--precisions", default=",".join(PRECISIONS), help=f"Comma-separated subset of {','.join(PRECISIONS)}."
  )
  parser.add_argument("--xla", default="off,on", help="Comma-separated subset of off,on (jit_compile).")


def main():
  args = parse_args(__doc__.splitlines()[0], extra_flags=add_workload_flag)
  if args.workload is None:
    args.workload = "lm"
  start(args)
  with tempfile.TemporaryDirectory(prefix="bench_workload_") as model_dir:
    workload(args, model_dir)


if __name__ == "__main__":
  main()
