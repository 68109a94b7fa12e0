"""Table 4: seconds from process start to the first finished train loop: executor CLI and API vs Keras fit.

Usage: python bench/startup.py [--quick] [--repeats=N]

Fresh child processes (`startup_child.py` for the API and Keras), medians of 3.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys  # noqa: E402

from bench_workload import SMALL, Workload  # noqa: E402
from children import HERE, child_env, cli_command, run_to_marker  # noqa: E402
from harness import median, run_alone, say  # noqa: E402


def startup(args, model_dir: str, workload: Workload = SMALL, n: int = 100) -> dict:
  """Fresh process to first finished train loop: executor CLI and API vs Keras fit; {contender: secs}."""
  say(f"== start-up: fresh process to the first finished train loop (small, N={n}), median of 3 ==")
  env = child_env()
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
  cli_cmd = cli_command()
  samples = {"keras fit": [], "executor API": [], "executor CLI": []}
  phases = {name: [] for name in samples}
  for r in range(3):
    runs = {
      "keras fit": lambda: run_to_marker(
        [sys.executable, child, "keras", workload.name, str(n)], "PHASE first_loop", env
      ),
      "executor API": lambda r=r: run_to_marker(
        [sys.executable, child, "api", workload.name, str(n), os.path.join(model_dir, f"api_{r}")],
        "PHASE first_loop",
        env,
      ),
      "executor CLI": lambda r=r: run_to_marker(
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


if __name__ == "__main__":
  run_alone(startup, __doc__)
