"""Train-loop throughput of the executor against a hand-written loop and Keras `fit`.

Usage: python bench/run.py [--quick] [--repeats=N] [--sections=throughput,options,cycle,startup,decode]

One process (plus fresh child processes for start-up times), one workload
family (`bench/bench_workload.py`): a small MLP on in-memory data, where the
per-step framework overhead dominates, and a medium one, where compute does.
Each contender has its own copy of the same model, optimizer and data:

  limit  a hand-written `tf.function`: N steps in a `tf.range` loop over an
         iterator (tape, Keras model, `optimizer.apply`), nothing else;
  keras  `model.compile(steps_per_execution=N)` + `model.fit`;
  ours   the executor's `TrainProgram(steps_per_loop=N)` through its public API.

Steps/sec are medians of `--repeats` repeats (5; 3 with `--quick`); each
repeat runs the contenders in turns over a few short rounds, and ratios are
medians of the per-round ratios (paired, so that the load of this shared
machine falls on both sides alike). Tracing and the first loop are excluded
and reported separately (warm-up). Sections:

  throughput  limit, keras, ours at N = 1, 10, 100, 1000 (medium: 1, 10, 100)
  options     small, N=100: XLA, no tf.data prefetch, ours' per-loop host costs
  cycle       a SimpleProgramSchedule cycle (train, eval, decode) against the
              bare hand-written loops; traces per program after the cycles
  startup     seconds from process start to the first finished train loop
              (executor CLI, executor API, Keras fit), medians of 3
  decode      a DecodeProgram whose post-processing sleeps: wall per decode
              against max(device, host)

The last line is `ours/limit@100=<ratio> ours/keras@100=<ratio>` (small).
"""

import argparse
import contextlib
import datetime
import faulthandler
import functools
import logging as std_logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging  # noqa: E402
from bench_task import BenchTask  # noqa: E402
from bench_workload import MEDIUM, SMALL, Workload, loss_fn, make_dataset, make_model, make_optimizer  # noqa: E402

from core.runtime import Runtime  # noqa: E402
from executor.schedule import SimpleProgramSchedule  # noqa: E402
from programs import DecodeProgram, EvalProgram, TrainProgram  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = ("throughput", "options", "cycle", "startup", "decode")


def median(values):
  return statistics.median(values) if values else float("nan")


def say(text: str = "") -> None:
  print(text, flush=True)


# ----- Contenders -----------------------------------------------------------
#
# Each one is built (traced, first loop run: its warm-up), then `measure(calls)`
# runs `calls` loops of N steps and returns (steps, seconds).


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


class _FitClock(keras.callbacks.Callback):
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
    clock = _FitClock()
    self.model.fit(self.dataset, epochs=1, steps_per_epoch=calls * self.n, verbose=0, callbacks=[clock])
    return calls * self.n, clock.end - clock.start


def build_program(program, runtime: Runtime, model_dir: str) -> float:
  """What the executor does to a program before the first cycle; returns the compile secs."""
  program.build(runtime)
  program.setup(runtime, model_dir)
  return program.compile()


class Ours:
  """The executor's `TrainProgram(steps_per_loop=N)` over `BenchTask`, through the public API."""

  def __init__(self, workload: Workload, n: int, model_dir: str, jit_compile=None, prefetch: bool = True):
    self.n = n
    self.task = BenchTask(workload.name, prefetch=prefetch)
    self.runtime = Runtime()
    self.runtime.build([self.task])
    self.program = TrainProgram(self.task, steps_per_loop=n, jit_compile=jit_compile)
    start = time.perf_counter()
    self.compile_secs = build_program(self.program, self.runtime, model_dir)
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
      program._loop(program._iterator, self.n)
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
  between contenders within a round.
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


# ----- Sections ---------------------------------------------------------------


def throughput(args, model_dir: str) -> dict:
  """Table 1: limit, keras, ours at several N, small and medium."""
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


def options(args, model_dir: str) -> dict:
  """Table 2: small, N=100: XLA, no prefetch, and where ours' per-loop host time goes."""
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
    program._loop(program._iterator, n)
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
      program._loop(program._iterator, n)
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


class BareLoops:
  """Hand-written train, eval and decode `tf.function`s over one model: the best a cycle can be."""

  def __init__(self, workload: Workload, n: int):
    self.train = Limit(workload, n)
    self.test = make_dataset(workload, "test")
    model = self.train.model

    self.batches = workload.test_batches

    @tf.function
    def evaluate(iterator, num_batches):
      total, count = tf.constant(0.0), tf.constant(0.0)
      for _ in tf.range(num_batches):
        x, y = next(iterator)
        size = tf.cast(tf.shape(y)[0], tf.float32)
        total += loss_fn(y, model(x, training=False)) * size
        count += size
      return total / count

    @tf.function
    def decode(iterator, num_batches):
      predictions = tf.TensorArray(tf.int32, size=num_batches, infer_shape=False)
      labels = tf.TensorArray(tf.int32, size=num_batches, infer_shape=False)
      for i in tf.range(num_batches):
        x, y = next(iterator)
        predictions = predictions.write(i, tf.argmax(model(x, training=False), -1, output_type=tf.int32))
        labels = labels.write(i, y)
      return predictions.concat(), labels.concat()

    self._evaluate, self._decode = evaluate, decode
    self.run_eval(), self.run_decode()

  def run_train(self):
    return self.train.run_loop()

  def run_eval(self):
    return self._evaluate(iter(self.test), tf.constant(self.batches)).numpy()

  def run_decode(self):
    predictions, labels = (t.numpy() for t in self._decode(iter(self.test), tf.constant(self.batches)))
    return float(np.mean(predictions == labels))

  def cycle(self):
    self.run_train()
    self.run_eval()
    self.run_decode()


def cycle(args, model_dir: str) -> dict:
  """Table 3: a SimpleProgramSchedule cycle against the bare loops, and traces per program."""
  workload, n = SMALL, 100
  m = k = workload.test_batches
  cycles = args.cycles
  say(
    f"== cycle: small, train {n} steps + eval {m} batches + decode {k} batches; "
    f"{args.cycle_rounds} paired rounds of {cycles} cycles back to back, medians, ms per cycle =="
  )
  task = BenchTask(workload.name)
  runtime = Runtime()
  runtime.build([task])
  schedule = SimpleProgramSchedule(
    task,
    train_program=functools.partial(TrainProgram, steps_per_loop=n),
    train_executions_per_eval=1,
    eval_programs=[
      functools.partial(EvalProgram, split="test", steps_per_loop=n),
      functools.partial(DecodeProgram, split="test", steps_per_loop=n),
    ],
  )
  train, evaluate, decode = schedule.programs
  if hasattr(schedule, "build"):  # The schedule's own state (cycle counters), as the executor does.
    schedule.build(runtime)
  for program in schedule.programs:
    program.build(runtime)
  for program in schedule.programs:
    program.setup(runtime, model_dir)
  compile_secs = {p.name: p.compile() for p in schedule.programs}
  traces_after_compile = {p.name: p.trace_count for p in schedule.programs}
  start = time.perf_counter()
  schedule.run()
  for p in schedule.programs:
    p.wait()
  first_cycle = time.perf_counter() - start
  traces_after_first = {p.name: p.trace_count for p in schedule.programs}
  bare = BareLoops(workload, n)

  def run_cycles(fn):
    start = time.perf_counter()
    for _ in range(cycles):
      fn()
    decode.wait()
    return (time.perf_counter() - start) / cycles

  def ours_cycle():
    schedule.run()

  def ours_alone():
    # Each program run on its own (the decode's post-processing waited for),
    # then its compiled loop function alone, without the program's host work.
    times = []
    for fn in (train.run, evaluate.run, lambda: (decode.run(), decode.wait())):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    for program in (train, evaluate, decode):
      iterator = train._iterator if program is train else iter(program.dataset)
      start = time.perf_counter()
      program._loop(iterator, n)
      times.append(time.perf_counter() - start)
    return times

  def bare_alone():
    t0 = time.perf_counter()
    bare.run_train()
    t1 = time.perf_counter()
    bare.run_eval()
    t2 = time.perf_counter()
    bare.run_decode()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2

  # Paired rounds: each runs `cycles` cycles of ours and of the bare loops, in
  # an order that alternates, so that the load of this shared machine falls
  # on both alike; the ratio is the median of the per-round ratios.
  samples = {"schedule": [], "bare": []}
  parts = {"ours": [], "bare": []}
  for r in range(args.cycle_rounds):
    order = [("schedule", ours_cycle), ("bare", bare.cycle)]
    for name, fn in order if r % 2 == 0 else order[::-1]:
      samples[name].append(run_cycles(fn))
  for _ in range(args.cycle_rounds):
    parts["ours"].append(ours_alone())
    parts["bare"].append(bare_alone())
  # A shorter last train loop (as at max_steps) must not retrace either.
  schedule.run(steps_left=n // 2 + 1)
  decode.wait()
  traces_end = {p.name: p.trace_count for p in schedule.programs}
  iterator_secs = []
  for _ in range(20):
    start = time.perf_counter()
    iter(evaluate.dataset)
    iterator_secs.append(time.perf_counter() - start)
  cyc, bare_cyc = median(samples["schedule"]), median(samples["bare"])
  ratio = median([a / b for a, b in zip(samples["schedule"], samples["bare"])])
  say(f"  SimpleProgramSchedule cycle   {1e3 * cyc:8.2f} ms")
  say(f"  bare loops (train+eval+decode){1e3 * bare_cyc:8.2f} ms")
  say(f"  cycle/bare = {ratio:.3f} (paired)   (first cycle: {1e3 * first_cycle:.1f} ms, excluded)")
  for i, name in enumerate(("train", "eval", "decode")):
    o = median([p[i] for p in parts["ours"]])
    loop = median([p[i + 3] for p in parts["ours"]])
    b = median([p[i] for p in parts["bare"]])
    say(
      f"    {name:6} alone: ours {1e3 * o:6.2f} ms (its compiled loop alone {1e3 * loop:6.2f} ms), "
      f"bare {1e3 * b:6.2f} ms, ours-bare {1e3 * (o - b):+6.2f} ms"
    )
  say(
    f"    (a fresh eval/decode iterator, made by ours and bare alike: {1e3 * median(iterator_secs):.2f} ms)"
  )
  extra = sum(traces_end[name] - traces_after_first[name] for name in traces_end)
  say(f"  compile s: {', '.join(f'{k} {v:.2f}' for k, v in compile_secs.items())}")
  say(
    f"  traces per program: after compile {traces_after_compile}, after 1 cycle {traces_after_first}, "
    f"after {2 + args.cycle_rounds * (cycles + 1)} cycles (the last one shorter) {traces_end}"
  )
  say(f"  extra traces after the first cycle: {extra}")
  say()
  for p in schedule.programs:
    p.close()
  return {"ratio": ratio, "extra_traces": extra}


def _run_to_marker(cmd, marker: str, env) -> tuple[float, dict[str, float]]:
  """Seconds from spawning `cmd` until a line containing `marker`; and of each `PHASE` line."""
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  phases, found, lines = {}, None, []
  for line in proc.stdout:
    now = time.perf_counter() - start
    lines.append(line)
    if line.startswith("PHASE "):
      phases[line.split()[1]] = now
    if found is None and marker in line:
      found = now
  proc.wait()
  if found is None or proc.returncode:
    raise RuntimeError(
      f"{' '.join(cmd)} exited {proc.returncode} without '{marker}':\n" + "".join(lines[-20:])
    )
  return found, phases


def startup(args, model_dir: str, workload: Workload = SMALL, n: int = 100) -> dict:
  """Table 4: fresh process to first finished train loop: executor CLI and API vs Keras fit."""
  say(f"== start-up: fresh process to the first finished train loop (small, N={n}), median of 3 ==")
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
  child = os.path.join(HERE, "startup_child.py")
  gin_file = os.path.join(model_dir, "startup.gin")
  with open(gin_file, "w") as f:
    f.write(
      "import bench_task\nimport executor\nimport programs\n\n"
      "Executor.task = @BenchTask()\n"
      f"BenchTask.workload = '{workload.name}'\n"
      f"Executor.max_steps = {n}\n"
      "Executor.schedule = @SimpleProgramSchedule\n"
      "SimpleProgramSchedule.train_program = @TrainProgram\n"
      f"TrainProgram.steps_per_loop = {n}\n"
    )
  cli = shutil.which("executor", path=os.path.dirname(sys.executable)) or shutil.which("executor")
  cli_cmd = [cli] if cli else [sys.executable, "-m", "executor.cli.main"]
  samples = {"keras fit": [], "executor API": [], "executor CLI": []}
  phases = {name: [] for name in samples}
  for r in range(3):
    runs = {
      "keras fit": lambda: _run_to_marker(
        [sys.executable, child, "keras", workload.name, str(n)], "PHASE first_loop", env
      ),
      "executor API": lambda r=r: _run_to_marker(
        [sys.executable, child, "api", workload.name, str(n), os.path.join(model_dir, f"api_{r}")],
        "PHASE first_loop",
        env,
      ),
      "executor CLI": lambda r=r: _run_to_marker(
        cli_cmd + [f"--model_dir={os.path.join(model_dir, f'cli_{r}')}", f"--gin_file={gin_file}"],
        f"train step {n}:",
        env,
      ),
    }
    for name in list(runs)[r % 3 :] + list(runs)[: r % 3]:
      secs, ph = runs[name]()
      samples[name].append(secs)
      phases[name].append(ph)
  keras_secs = median(samples["keras fit"])
  for name, values in samples.items():
    ph = {k: median([p[k] for p in phases[name] if k in p]) for k in phases[name][0]}
    detail = ", ".join(f"{k} at {v:.2f}" for k, v in ph.items())
    say(
      f"  {name:13} {median(values):6.2f} s  x{median(values) / keras_secs:.2f} of keras"
      f"   [{', '.join(f'{v:.2f}' for v in values)}]{'  phases: ' + detail if detail else ''}"
    )
  say()
  return {name: median(v) for name, v in samples.items()}


def decode_overlap(args, model_dir: str, workload: Workload = MEDIUM) -> dict:
  """Table 5: a DecodeProgram whose postprocess_decode sleeps, serial vs overlapped.

  Each repeat runs `decode_runs` decodes serially (`async_postprocess=False`:
  device time from the run, host time = wall - device) and then as many
  overlapped; the ratio is the overlapped steady-state period (between
  consecutive `run()` returns) over max(device, host) of the same repeat.
  """
  runs = args.decode_runs
  task = BenchTask(workload.name)
  runtime = Runtime()
  runtime.build([task])
  decode = DecodeProgram(task, split="test", steps_per_loop=100, async_postprocess=False)
  build_program(decode, runtime, model_dir)
  decode.run()

  def serial_runs():
    decode.async_postprocess = False
    devices, walls = [], []
    for _ in range(runs):
      start = time.perf_counter()
      devices.append(decode.run().secs)
      walls.append(time.perf_counter() - start)
    return median(devices), median(walls)

  def overlapped_runs():
    decode.async_postprocess = True
    start = time.perf_counter()
    returns = []
    for _ in range(runs):
      decode.run()
      returns.append(time.perf_counter())
    decode.wait()
    return median(np.diff(returns).tolist()), time.perf_counter() - start

  device, wall0 = serial_runs()
  host0 = wall0 - device
  task.postprocess_sleep_secs = round(device, 3)  # Host work about as long as the device's: the hardest case.
  say(
    f"== decode overlap: {workload.name}, {workload.test_batches} batches per decode, "
    f"postprocess_decode sleeps {1e3 * task.postprocess_sleep_secs:.0f} ms; {runs} decodes serial, then "
    f"{runs} overlapped, {args.repeats} repeats ==="
  )
  rows = []
  for _ in range(args.repeats):
    device, serial = serial_runs()
    period, total = overlapped_runs()
    rows.append((device, serial - device, serial, period, total))
  ratio = median([period / max(device, host) for device, host, _, period, _ in rows])
  device, host, serial, period, total = (median(column) for column in zip(*rows))
  ideal = max(device, host)
  say(
    f"  device {1e3 * device:.1f} ms, host {1e3 * host:.1f} ms (sleep + records, summaries), "
    f"serial {1e3 * serial:.1f} ms per decode"
  )
  say(
    f"  overlapped: {1e3 * period:.1f} ms per decode in steady state = x{ratio:.3f} of max(device, host) "
    f"(paired); {runs} decodes {1e3 * total:.0f} ms (pipelined bound "
    f"{1e3 * (device + (runs - 1) * ideal + host):.0f} ms, serial {1e3 * runs * serial:.0f} ms)"
  )
  say(f"  (host work of a decode without the sleep: {1e3 * host0:.1f} ms)")
  say()
  decode.close()
  return {"ratio": ratio}


RUNNERS = {
  "throughput": throughput,
  "options": options,
  "cycle": cycle,
  "startup": startup,
  "decode": decode_overlap,
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="Fewer repeats and steps: a few minutes.")
  parser.add_argument("--repeats", type=int, default=None, help="Repeats per measure (5; 3 with --quick).")
  parser.add_argument("--sections", default=",".join(SECTIONS), help=f"Comma-separated subset of {SECTIONS}.")
  args = parser.parse_args()
  args.repeats = args.repeats or (3 if args.quick else 5)
  args.small_steps = 600 if args.quick else 3000
  args.pairs = 30 if args.quick else 100
  args.medium_steps = 100 if args.quick else 300
  args.cycles = 3
  args.cycle_rounds = 30 if args.quick else 100
  args.decode_runs = 4 if args.quick else 6
  sections = args.sections.split(",")
  unknown = set(sections) - set(SECTIONS)
  if unknown:
    parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel("ERROR")  # Every contender has its own tf.functions: no retracing warnings.
  warnings.filterwarnings("ignore", message=".*`shuffle=True` was passed.*")
  say(
    f"bench/run.py{' --quick' if args.quick else ''}: {datetime.date.today()}, {platform.machine()}, "
    f"{os.cpu_count()} CPUs, TF {tf.__version__}, Keras {keras.__version__}, Python {platform.python_version()}"
  )
  say()
  results = {}
  with tempfile.TemporaryDirectory(prefix="bench_run_") as model_dir:
    for section in SECTIONS:
      if section not in sections:
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
