"""Table 3: a SimpleProgramSchedule cycle (train, eval, decode) against bare hand-written loops.

Usage: python bench/cycle.py [--quick] [--repeats=N]

Also the traces per program after all the cycles (the last one shorter): 0 extra.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import functools  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from bench_task import BenchTask  # noqa: E402
from bench_workload import SMALL, Workload, loss_fn, make_dataset  # noqa: E402
from harness import Limit, median, run_alone, say  # noqa: E402

from executor.schedule import SimpleProgramSchedule  # noqa: E402
from programs import DecodeProgram, EvalProgram, TrainProgram  # noqa: E402
from programs.core.runtime import Runtime  # noqa: E402


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
  """A SimpleProgramSchedule cycle against the bare loops, and traces per program; ratio, extra traces."""
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
  schedule.build(runtime)  # The schedule's own state (cycle counters), as the executor does.
  compile_secs = {p.name: p.prepare(runtime, model_dir) for p in schedule.programs}
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
      iterator = train.input.iterator if program is train else iter(program.dataset)
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


if __name__ == "__main__":
  run_alone(cycle, __doc__)
