"""What every benchmark section shares: the contenders, how they are measured, children, flags.

A contender is built (traced, first loop run: its warm-up), then
`measure(calls)` runs `calls` loops of N steps and returns (steps, seconds):

  Limit         a hand-written `tf.function`: N steps in a `tf.range` loop over
                an iterator (tape, Keras model, `optimizer.apply`), nothing else;
  KerasFit      `model.compile(steps_per_execution=N)` + `model.fit`;
  Ours          the executor's `TrainProgram(steps_per_loop=N)` through its public API;
  OursLoopOnly  Ours' compiled loop called directly, without its host work.

`measure_interleaved` runs contenders in rotating turns and keeps per-round
samples, so that ratios are paired (the load of this shared machine falls on
both sides alike). `parse_args`, `start` and `run_alone` make a section a
script; `children.py` has what the sections that spawn processes share.
"""

import argparse
import contextlib
import datetime
import faulthandler
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging  # noqa: E402
from bench_task import BenchTask  # noqa: E402
from bench_workload import Workload, loss_fn, make_dataset, make_model, make_optimizer  # noqa: E402

from programs import TrainProgram  # noqa: E402
from programs.core.runtime import Runtime  # noqa: E402


def median(values):
  return statistics.median(values) if values else float("nan")


def say(text: str = "") -> None:
  print(text, flush=True)


# ----- Contenders -----------------------------------------------------------


class Limit:
  """A hand-written `tf.function`: N train steps in a `tf.range` loop, nothing else.

  With `jit_compile=True` the step (not the loop: XLA has no iterator ops) is
  compiled with XLA, as Keras does.
  """

  def __init__(self, workload: Workload, n: int, jit_compile=None, prefetch: bool = True):
    self.n = n
    self.model = model = make_model(workload)
    optimizer = make_optimizer()
    optimizer.build(model.trainable_variables)
    self.iterator = iter(make_dataset(workload, "train", prefetch))

    def step(x, y):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      variables = model.trainable_variables
      optimizer.apply(tape.gradient(loss, variables), variables)
      return loss

    if jit_compile:
      step = tf.function(step, jit_compile=True)

    def loop(iterator, num_steps):
      loss = tf.constant(0.0)
      for _ in tf.range(num_steps):
        loss = step(*next(iterator))
      return loss

    self.loop = tf.function(loop)
    start = time.perf_counter()
    self.run_loop()
    self.warmup_secs = time.perf_counter() - start

  def run_loop(self):
    return self.loop(self.iterator, tf.constant(self.n)).numpy()

  def measure(self, calls: int) -> tuple[int, float]:
    start = time.perf_counter()
    for _ in range(calls):
      self.run_loop()
    return calls * self.n, time.perf_counter() - start


class FitClock(keras.callbacks.Callback):
  """Stamps the first execution's start (after the epoch's iterator exists) and the epoch's end.

  It hooks no `*_batch_end`, so Keras keeps its default asynchronous dispatch
  of batch-end callbacks.
  """

  def __init__(self):
    super().__init__()
    self.start = self.end = None

  def on_train_batch_begin(self, batch, logs=None):
    if self.start is None:
      self.start = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.end = time.perf_counter()


class KerasFit:
  """`model.compile(steps_per_execution=N)` and `model.fit(steps_per_epoch=calls * N)`."""

  def __init__(self, workload: Workload, n: int, jit_compile=False, prefetch: bool = True):
    self.n = n
    self.model = make_model(workload)
    self.model.compile(
      optimizer=make_optimizer(),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      steps_per_execution=n,
      jit_compile=jit_compile,
    )
    self.dataset = make_dataset(workload, "train", prefetch)
    start = time.perf_counter()
    self.model.fit(self.dataset, epochs=1, steps_per_epoch=n, verbose=0)
    self.warmup_secs = time.perf_counter() - start

  def measure(self, calls: int) -> tuple[int, float]:
    clock = FitClock()
    self.model.fit(self.dataset, epochs=1, steps_per_epoch=calls * self.n, verbose=0, callbacks=[clock])
    return calls * self.n, clock.end - clock.start


class Ours:
  """The executor's `TrainProgram(steps_per_loop=N)` over `BenchTask`, made ready by `Program.prepare`."""

  def __init__(self, workload: Workload, n: int, model_dir: str, jit_compile=None, prefetch: bool = True):
    self.n = n
    self.task = BenchTask(workload.name, prefetch=prefetch)
    self.runtime = Runtime()
    self.runtime.build([self.task])
    self.program = TrainProgram(self.task, steps_per_loop=n, jit_compile=jit_compile)
    start = time.perf_counter()
    self.compile_secs = self.program.prepare(self.runtime, model_dir)
    self.program.run()
    self.warmup_secs = time.perf_counter() - start

  def measure(self, calls: int) -> tuple[int, float]:
    start = time.perf_counter()
    for _ in range(calls):
      self.program.run()
    return calls * self.n, time.perf_counter() - start


class OursLoopOnly:
  """Ours' compiled loop function called directly: `TrainProgram.run` minus its host-side work."""

  def __init__(self, ours: Ours):
    self.ours, self.n, self.warmup_secs = ours, ours.n, 0.0

  def measure(self, calls: int) -> tuple[int, float]:
    program = self.ours.program
    start = time.perf_counter()
    for _ in range(calls):
      program._loop(program.input.iterator, self.n)
    return calls * self.n, time.perf_counter() - start


@contextlib.contextmanager
def watchdog(what: str, secs: float = 15.0):
  """Dumps every thread's stack to stderr if `what` takes longer than `secs` (this VM stalls at times)."""
  faulthandler.dump_traceback_later(secs, exit=False)
  start = time.perf_counter()
  try:
    yield
  finally:
    faulthandler.cancel_dump_traceback_later()
    if time.perf_counter() - start > secs:
      say(f"  (stall: {what} took {time.perf_counter() - start:.0f}s; stacks above)")


def build(what: str, factory, *args, **kwargs):
  """The contender `factory(*args, **kwargs)` (built, so warmed up), under a watchdog."""
  with watchdog(f"building {what}"):
    return factory(*args, **kwargs)


def try_build(what: str, factory, *args, **kwargs):
  """The contender, or the first line of the error that building it raised."""
  try:
    return build(what, factory, *args, **kwargs)
  except Exception as e:  # noqa: BLE001  (a failing option is a result, not a crash)
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"


class Samples:
  """Steps/sec of each contender in each round of each repeat."""

  def __init__(self, names):
    self.rounds = {name: [] for name in names}  # [(repeat, steps, secs)]

  def sps(self, name: str) -> float:
    """Median over repeats of the contender's steps/sec."""
    by_repeat = {}
    for r, steps, secs in self.rounds[name]:
      done, took = by_repeat.get(r, (0, 0.0))
      by_repeat[r] = (done + steps, took + secs)
    return median([steps / secs for steps, secs in by_repeat.values()])

  def ratio(self, a: str, b: str) -> float:
    """Median over rounds of a's steps/sec over b's in the same round (paired: robust to load drifts)."""
    return median([(sa / ta) / (sb / tb) for (_, sa, ta), (_, sb, tb) in zip(self.rounds[a], self.rounds[b])])


def measure_interleaved(contenders: dict, steps: int, repeats: int) -> Samples:
  """Runs about `steps` steps per contender per repeat, in up to 5 short rounds.

  In each round every contender runs once, in an order that rotates, so that
  the load of a shared machine falls on all of them alike; ratios are taken
  between contenders within a round. Contenders that are strings (a failed
  build) are left out.
  """
  live = {name: c for name, c in contenders.items() if not isinstance(c, str)}
  samples = Samples(live)
  n = max(c.n for c in live.values())
  rounds = max(1, min(5, steps // n))
  for r in range(repeats):
    for k in range(rounds):
      names = list(live)
      shift = (r * rounds + k) % len(names)
      for name in names[shift:] + names[:shift]:
        c = live[name]
        done, secs = c.measure(max(1, round(steps / (c.n * rounds))))
        samples.rounds[name].append((r, done, secs))
  return samples


# ----- Flags and the script around a section -----------------------------------


def parse_args(description: str, sections: tuple[str, ...] = (), extra_flags=None) -> argparse.Namespace:
  """The shared flags (`--quick`, `--repeats`; `--sections` when `sections`) and the sizes they imply.

  `extra_flags(parser)`, if given, adds a script's own flags.
  """
  parser = argparse.ArgumentParser(description=description)
  if extra_flags is not None:
    extra_flags(parser)
  parser.add_argument("--quick", action="store_true", help="Fewer repeats and steps: a few minutes.")
  parser.add_argument("--repeats", type=int, default=None, help="Repeats per measure (5; 3 with --quick).")
  if sections:
    parser.add_argument(
      "--sections", default=",".join(sections), help=f"Comma-separated subset of {sections}."
    )
  args = parser.parse_args()
  args.repeats = args.repeats or (3 if args.quick else 5)
  args.small_steps = 600 if args.quick else 3000
  args.pairs = 30 if args.quick else 100
  args.medium_steps = 100 if args.quick else 300
  args.cycles = 3
  args.cycle_rounds = 30 if args.quick else 100
  args.decode_runs = 4 if args.quick else 6
  if sections:
    args.sections = args.sections.split(",")
    unknown = set(args.sections) - set(sections)
    if unknown:
      parser.error(f"unknown sections {sorted(unknown)}; choose from {sections}")
  return args


def start(args: argparse.Namespace) -> None:
  """Quiets the logs (every contender has its own tf.functions: no retracing warnings); prints the header."""
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel("ERROR")
  warnings.filterwarnings("ignore", message=".*`shuffle=True` was passed.*")
  say(
    f"bench/{os.path.basename(sys.argv[0])}{' --quick' if args.quick else ''}: {datetime.date.today()}, "
    f"{platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}, Keras {keras.__version__}, "
    f"Python {platform.python_version()}"
  )
  say()


def run_alone(section, description: str) -> dict:
  """Runs one section as a script (`python bench/<section>.py [--quick] [--repeats=N]`); returns its results."""
  args = parse_args(description.splitlines()[0])
  start(args)
  with tempfile.TemporaryDirectory(prefix="bench_") as model_dir:
    return section(args, model_dir)
