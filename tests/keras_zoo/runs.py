"""How the zoo tests run a model: `executor` processes (fork-server children, `faults_util`), a kill at a held
train loop, and the comparison of two runs' checkpoints, tensor by tensor, the saved input iterator included."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from faults_util import Executor, checkpoint_state

from keras_zoo import ZooModel

MAX_STEPS = 40  # What every zoo gin file says.
HOLD_STEP = 25  # The kill: after the train loop ending here (the last checkpoint is ckpt-20).
ITERATOR_BATCHES = 12  # Batches drawn from each saved iterator state to compare them.


def train_args(model: ZooModel, model_dir: Path, *params: str, flags: tuple[str, ...] = ()) -> list[str]:
  """The command line of a `--deterministic` training run of `model`."""
  args = [f"--gin_file={model.gin_file}", f"--model_dir={model_dir}", "--deterministic", *flags]
  return args + [f"--gin_param={p}" for p in [*model.params, *params]]


def start(model: ZooModel, model_dir: Path, *params: str, hold: Path | None = None) -> Executor:
  """Starts a training run of `model` in `model_dir` (log beside it); with `hold`, it holds after the train loop
  of `HOLD_STEP`, once `hold` (its marker file) is written."""
  flags: tuple[str, ...] = ()
  if hold is not None:
    flags = ("--module=keras_zoo.hold",)
    params = (
      *params,
      "Executor.actions = [@HoldAfterLoop()]",
      f"HoldAfterLoop.step = {HOLD_STEP}",
      f"HoldAfterLoop.marker = '{hold}'",
    )
  log = (
    model_dir.parent
    / f"{model_dir.name}{'_held' if hold else ''}{len(list(model_dir.parent.glob('*.log')))}.log"
  )
  return Executor(train_args(model, model_dir, *params, flags=flags), log)


def wait_for_file(executor: Executor, path: Path, timeout: float = 180) -> None:
  """Waits until `path` exists (failing with the log's tail if the process ends first)."""
  deadline = time.monotonic() + timeout
  while not path.exists():
    if executor.returncode is not None or time.monotonic() > deadline:
      why = f"exited with {executor.returncode}" if executor.returncode is not None else f"{timeout}s passed"
      executor.kill()
      raise AssertionError(f"{path.name} never appeared ({why}); log tail:\n{executor.tail(25)}")
    time.sleep(0.02)


def latest_checkpoint(model_dir: Path) -> str | None:
  return tf.train.latest_checkpoint(str(model_dir / "checkpoints"))


# The saved input iterator states: one serialized state per input pipeline (`programs.core.input_state`).
ITERATOR_STATES = "/pipelines/.ATTRIBUTES/ITERATOR_STATES"


def _iterator_state(path: str, key: str) -> bytes:
  """The saved iterator state of the first (on one worker, the only) input pipeline."""
  return bytes(tf.train.load_checkpoint(path).get_tensor(key)[0])


def iterator_keys(path: str) -> list[str]:
  """The checkpoint's saved input iterator states."""
  return sorted(
    k for k in tf.train.load_checkpoint(path).get_variable_to_dtype_map() if k.endswith(ITERATOR_STATES)
  )


def batches_after(model: ZooModel, paths: list[str], key: str, count: int) -> list[list]:
  """For each checkpoint of `paths`, the next `count` train batches of the model's pipeline with the iterator
  state `key` of that checkpoint put back (as a resumed run puts it back: the pipeline built under the run's
  saved input seed)."""
  import gin

  from executor.cli.config import parse_config
  from executor.executor import Executor as Run
  from programs.core import input_state

  parse_config([str(model.gin_file)], list(model.params), [str(Path(__file__).resolve().parent.parent)], [])
  try:
    run = Run(str(Path(paths[0]).parent.parent / "never_written"))
    run.runtime.build(run.tasks)
    task = run.tasks[0]
    out = []
    for path in paths:
      run.runtime.resume_input_seed(path)
      iterator = iter(run.runtime.worker_dataset(task, task.train_split))  # As the train input reads it.
      input_state.restore(iterator, _iterator_state(path, key))
      out.append([tf.nest.map_structure(lambda t: t.numpy(), next(iterator)) for _ in range(count)])
    return out
  finally:
    gin.clear_config()


def state_differences(model: ZooModel, a: str, b: str) -> list[str]:
  """What differs between two checkpoints, one line per tensor: missing, another dtype or shape, or the largest
  difference of values. Empty when they are bit-identical.

  A saved input iterator state is compared by what it does, not by its bytes: the next batches it gives, put back
  into the model's pipeline. Its bytes hold the prefetch buffer as it was at the save, which depends on how far
  tf.data's background threads had read ahead (the same elements, a timing-dependent number of them).
  """
  state_a, state_b = checkpoint_state(a), checkpoint_state(b)
  for state in (state_a, state_b):  # Compared below, by the batches they give.
    for key in [k for k in state if k.endswith(ITERATOR_STATES)]:
      del state[key]
  lines = [f"{k}: only in {Path(a).parent.parent.name}" for k in sorted(state_a.keys() - state_b.keys())]
  lines += [f"{k}: only in {Path(b).parent.parent.name}" for k in sorted(state_b.keys() - state_a.keys())]
  for key in sorted(state_a.keys() & state_b.keys()):
    x, y = state_a[key], state_b[key]
    if x.dtype != y.dtype or x.shape != y.shape:
      lines.append(f"{key}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
    elif not np.array_equal(x, y):
      if x.dtype.kind in "biuf":
        gap = np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))
        lines.append(f"{key}: max |difference| {gap:.3g} ({np.sum(x != y)} of {x.size} values)")
      else:
        lines.append(f"{key}: differs")
  keys_a, keys_b = iterator_keys(a), iterator_keys(b)
  lines += [f"{k}: only in {Path(a).parent.parent.name}" for k in sorted(set(keys_a) - set(keys_b))]
  lines += [f"{k}: only in {Path(b).parent.parent.name}" for k in sorted(set(keys_b) - set(keys_a))]
  for key in sorted(set(keys_a) & set(keys_b)):
    next_a, next_b = batches_after(model, [a, b], key, ITERATOR_BATCHES)
    for i, (batch_a, batch_b) in enumerate(zip(next_a, next_b)):
      leaves_a, leaves_b = tf.nest.flatten(batch_a), tf.nest.flatten(batch_b)
      if len(leaves_a) != len(leaves_b) or not all(np.array_equal(p, q) for p, q in zip(leaves_a, leaves_b)):
        lines.append(f"{key}: the saved iterator states give different batches (the first: batch {i + 1})")
        break
  return lines


def last_metrics(model_dir: Path, program: str) -> dict[str, float]:
  """The last row of `program`'s metrics.jsonl, its timing columns left out."""
  rows = [json.loads(line) for line in (model_dir / program / "metrics.jsonl").read_text().splitlines()]
  timing = ("wall_time", "examples/sec", "global_step/sec", "steps/sec")
  return {k: v for k, v in rows[-1].items() if k not in timing}


def exports_of(model_dir: Path) -> list[Path]:
  return (
    sorted(p for p in (model_dir / "export").iterdir() if p.is_dir())
    if (model_dir / "export").exists()
    else []
  )


def export(model_dir: Path, log: Path) -> Executor:
  """Starts `executor export --model_dir=model_dir` (the run's operative config)."""
  return Executor(["export", f"--model_dir={model_dir}"], log)


def serving_job(export_dir: Path, inputs: dict[str, np.ndarray], folder: Path) -> list[str]:
  """Writes `inputs` for `serve.py`; returns the job (export, inputs file, output file)."""
  folder.mkdir(parents=True, exist_ok=True)
  # Strings as unicode arrays: an npz holds no object arrays (bytes) unless pickled.
  inputs = {k: np.char.decode(v.astype(bytes)) if v.dtype == object else v for k, v in inputs.items()}
  np.savez(folder / "inputs.npz", **inputs)
  return [str(export_dir), str(folder / "inputs.npz"), str(folder / "outputs.json")]


def environment_without_this_package() -> dict[str, str]:
  """The environment of a fresh serving process: no PYTHONPATH into this repository."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  return env
