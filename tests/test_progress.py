"""Progress lines in the log and profiler traces, from real runs."""

import re
import time

from executor.cli.main import run

PROGRESS = re.compile(
  r"Progress: step (\d+)/(\d+) \(([\d.]+)%\) \| ([\d.]+) steps/s \| ([\d.]+) examples/s \| loss ([\d.e+-]+) \| "
  r"ETA (\d+):(\d\d):(\d\d)"
)


def test_progress_lines_are_complete_and_sane(tmp_path, caplog):
  start = time.monotonic()
  with caplog.at_level("INFO"):
    run(
      str(tmp_path / "run"),
      ["gin/spirals.gin"],
      ["Executor.max_steps = 200", "TrainProgram.steps_per_loop = 50"],
    )
  wall = time.monotonic() - start
  matches = [PROGRESS.search(r.getMessage()) for r in caplog.records]
  matches = [m for m in matches if m]
  assert [int(m.group(1)) for m in matches] == [50, 100, 150, 200]
  for m in matches:
    step, max_steps, percent = int(m.group(1)), int(m.group(2)), float(m.group(3))
    steps_per_sec, examples_per_sec = float(m.group(4)), float(m.group(5))
    assert max_steps == 200 and abs(percent - 100 * step / 200) < 0.1
    assert steps_per_sec > 0 and abs(examples_per_sec - 64 * steps_per_sec) < 0.1 * examples_per_sec + 1
    eta = int(m.group(7)) * 3600 + int(m.group(8)) * 60 + int(m.group(9))
    # The steps left at the rate so far: at most that rate over the whole call (whatever the machine's load).
    assert 0 <= eta <= (200 - step) / step * wall + 1
  assert matches[-1].group(7, 8, 9) == ("0", "00", "00")


def test_profiler_writes_a_trace_of_the_chosen_loop(tmp_path):
  model_dir = tmp_path / "run"
  run(
    str(model_dir),
    ["gin/spirals.gin"],
    [
      "Executor.max_steps = 150",
      "TrainProgram.steps_per_loop = 50",
      "Executor.actions = [@Profiler()]",
      "Profiler.start_step = 50",
    ],
  )
  traces = list((model_dir / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 1000
