"""Start-up children of `bench/startup.py`: from a fresh process to the first finished train loop.

Usage: python bench/startup_child.py {keras,api} WORKLOAD STEPS MODEL_DIR

Imports only what its contender needs, builds the model and data, traces,
runs one train loop of STEPS steps and prints `PHASE <name>` lines as it goes
(the parent timestamps them on arrival); `PHASE first_loop` ends the measure.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def phase(name: str) -> None:
  print(f"PHASE {name}", flush=True)


def keras_fit(workload_name: str, steps: int) -> None:
  import keras
  import tensorflow as tf  # noqa: F401
  from bench_workload import WORKLOADS, make_dataset, make_model, make_optimizer

  phase("imported")
  workload = WORKLOADS[workload_name]
  model = make_model(workload)
  model.compile(
    optimizer=make_optimizer(),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    steps_per_execution=steps,
  )
  dataset = make_dataset(workload)
  phase("built")

  class FirstLoop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      phase("first_loop")

  model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[FirstLoop()])


def executor_api(workload_name: str, steps: int, model_dir: str) -> None:
  from absl import logging
  from bench_task import BenchTask

  from programs import TrainProgram
  from programs.core.runtime import Runtime

  phase("imported")
  logging.set_verbosity(logging.WARNING)
  task = BenchTask(workload_name)
  runtime = Runtime()
  runtime.build([task])
  train = TrainProgram(task, steps_per_loop=steps)
  phase("built")
  train.prepare(runtime, model_dir)
  phase("traced")
  train.run()
  phase("first_loop")
  train.close()


def main() -> None:
  kind, workload_name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
  if kind == "keras":
    keras_fit(workload_name, steps)
  elif kind == "api":
    executor_api(workload_name, steps, sys.argv[4])
  else:
    raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
  main()
