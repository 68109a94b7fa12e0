"""Table 5: a DecodeProgram whose post-processing sleeps: wall per decode against max(device, host).

Usage: python bench/decode.py [--quick] [--repeats=N]
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import time  # noqa: E402

import numpy as np  # noqa: E402
from bench_task import BenchTask  # noqa: E402
from bench_workload import MEDIUM, Workload  # noqa: E402
from harness import median, run_alone, say  # noqa: E402

from programs import DecodeProgram  # noqa: E402
from programs.core.runtime import Runtime  # noqa: E402


def decode_overlap(args, model_dir: str, workload: Workload = MEDIUM) -> dict:
  """A DecodeProgram whose postprocess_decode sleeps, serial vs overlapped; {"ratio": ...}.

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
  decode.prepare(runtime, model_dir)
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


if __name__ == "__main__":
  run_alone(decode_overlap, __doc__)
