"""Steps/s of the train input path on 2 logical CPU replicas: the worker's own iterator against tf.distribute's.

Usage: python bench/input_path.py [--quick] [--repeats=N]

Now, a train program reads its worker's input pipeline with a plain `tf.data.Iterator` (whose state checkpoints
save) and its loop hands one element to each replica (`Runtime.per_replica`). Before, it read a distributed
iterator (`distribute_datasets_from_function`, fetching to the devices; its state cannot be saved). Both
contenders are `TrainProgram.run` (N=100 steps per call, host work included) over the same task, variables and
`MirroredStrategy` of two logical CPUs, for the small and medium workloads of `bench_workload.py`; they run in
rotating turns and the ratio now/before is the median of paired rounds. On CPUs there is no copy to a device.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from programs.core.runtime import configure_logical_cpus, mirrored_strategy  # noqa: E402

configure_logical_cpus(2)  # Before any op runs.

from bench_task import BenchTask  # noqa: E402
from bench_workload import MEDIUM, SMALL  # noqa: E402
from harness import build, measure_interleaved, run_alone, say  # noqa: E402

from programs import TrainProgram  # noqa: E402
from programs.core.runtime import Runtime  # noqa: E402

N = 100


class DistributedInputProgram(TrainProgram):
  """`TrainProgram` reading tf.distribute's distributed iterator, as it did before (the state is not saved)."""

  def setup(self, runtime, model_dir):
    super().setup(runtime, model_dir)
    self.input.dataset = runtime.distribute_dataset(self.task, self.split)
    self.input.iterator = iter(self.input.dataset)

  def _read_fn(self):
    return None


class Contender:
  """One train program on the shared runtime, run `calls` times per measure."""

  def __init__(self, program: TrainProgram, runtime: Runtime, model_dir: str):
    self.n, self.program = N, program
    program.prepare(runtime, model_dir)
    program.restored()
    program.run()
    self.warmup_secs = 0.0

  def measure(self, calls: int) -> tuple[int, float]:
    secs = 0.0
    for _ in range(calls):
      secs += self.program.run().secs
    return calls * self.n, secs


def input_path(args, model_dir: str) -> dict:
  """{workload: ratio of steps/s now / before}."""
  strategy = mirrored_strategy(num_logical_cpus=2)
  say(
    f"== input path: 2 logical CPU replicas, N={N}, steps/sec (median of {args.repeats} repeats), "
    "paired ratio now/before =="
  )
  ratios = {}
  for workload in (SMALL, MEDIUM):
    task = BenchTask(workload.name)
    runtime = Runtime(lambda: strategy)
    runtime.build([task])
    before = DistributedInputProgram(task, steps_per_loop=N, name="before")
    now = TrainProgram(task, steps_per_loop=N, name="now")
    contenders = {
      "before: distributed iterator": build("before", Contender, before, runtime, model_dir + "/b"),
      "now: worker iterator per replica": build("now", Contender, now, runtime, model_dir + "/n"),
    }
    steps = args.small_steps if workload is SMALL else args.medium_steps * 10
    samples = measure_interleaved(contenders, steps, args.repeats)
    for name in contenders:
      say(f"  {workload.name:7} {name:34} {samples.sps(name):>8.1f} steps/s")
    ratios[workload.name] = samples.ratio("now: worker iterator per replica", "before: distributed iterator")
    say(f"  {workload.name:7} {'ratio now/before':34} {ratios[workload.name]:>8.3f}")
  say()
  return ratios


if __name__ == "__main__":
  run_alone(input_path, __doc__)
