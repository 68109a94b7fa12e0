"""Restart time at scale: seconds from process start to the first finished train loop after a restart at step P.

Usage: python bench/resume.py [--quick] [--repeats=N] [--timeout=SECS] [--positions=0,10000,100000,1000000]
       [--tasks=lm_shards,quickstart,augmented,plain_mirrored,plain_2workers]

Three tasks: the LM reading TFRecord shards (`gin/lm.gin` with `TransformerLM.train_files`, the shards written
once by `python -m executor.tasks.lm.prepare`, 10 steps per loop), the quickstart (`gin/quickstart.gin`: spirals, in-memory points,
shuffled) and `augment_task.AugmentedImages` (`bench/augment.gin`: every
example a PNG decoded, randomly cropped and flipped in the input map). For
each, one CLI run trains one loop into a base model_dir. For each position P
a copy of it gets its checkpoint rewritten with the step counters set to P
(the global step, every `*_input_position`, the optimizer's iterations: what
an uninterrupted run would hold at step P; no training), then a fresh
`python -m executor.cli.main` process restores it and is timed until it logs
its first finished train loop (`train step P+N:`). The input position is
checked in the checkpoint that run leaves (P+N).

`plain_mirrored` and `plain_2workers` restart a user's plain TFRecord pipeline without `start_example`
(`plain_records.PlainRecordSpirals`: `TFRecordDataset(files).repeat().shuffle().map(parse).batch()`, 10 steps per
loop) on two logical CPUs, and on two worker processes on 127.0.0.1 (the chief timed). Such a pipeline resumes
from the iterator states its checkpoints hold: a restart at P gets, besides the counters, each pipeline's state
after P steps (built under the run's seeds and advanced on the host, once per P, before the restarts: see
`plain_records`), and its log must say it resumed from them, with no replay. With `--replay` they keep the
states of the base checkpoint, which belong to another position: the restart replays the P steps, as every
restart of such a pipeline on these strategies did before its iterators were saved, and its log must say so.

A restart that has not logged that line after `--timeout` seconds is killed
and shown as `>T s (timeout)`; larger positions of the same task are then not
run (the time to restore grows with P when the position is replayed, so they
would time out too) and are shown as `>T s (not run)`. The ratio is
t(P)/t(0); `replay ms/step` is (t(P) - t(0)) / P.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import plain_records  # noqa: E402
import tensorflow as tf  # noqa: E402
from children import HERE, child_env, cli_command, run_to_marker  # noqa: E402
from harness import median, say, start  # noqa: E402

ROOT = os.path.dirname(HERE)
# name: (gin file, train steps per loop)
TASKS = {
  "quickstart": (os.path.join(ROOT, "gin", "quickstart.gin"), 250),
  "augmented": (os.path.join(HERE, "augment.gin"), 100),
}


def _is_counter(key: str) -> bool:
  """Whether a checkpoint key holds a step counter that a run at step P has at P."""
  name = key.split("/.ATTRIBUTES/")[0]
  optimizer_iterations = ("optimizer/iteration", "optimizer/inner_optimizer.Siteration")  # OptimizerState's.
  return name == "global_step" or name.endswith("_input_position") or name.endswith(optimizer_iterations)


_STATES, _POSITIONS = (
  "train_input/pipelines/.ATTRIBUTES/ITERATOR_STATES",
  "train_input/pipelines/.ATTRIBUTES/POSITIONS",
)
PLAIN = {"plain_mirrored": "mirrored", "plain_2workers": "2 workers"}


def set_position(checkpoint_dir: str, position: int, iterator_states: list[bytes] | None = None) -> list[str]:
  """Rewrites the latest checkpoint in place with its step counters at `position`; returns the keys set.

  With `iterator_states` (one per input pipeline, after `position` steps), the train input's saved iterator states
  are set too, with the input position they belong to. Every other tensor, and the object graph, are written back
  unchanged, so the checkpoint restores into the same objects as before.
  """
  prefix = tf.train.latest_checkpoint(checkpoint_dir)
  if prefix is None:
    raise ValueError(f"no checkpoint in {checkpoint_dir}")
  reader = tf.train.load_checkpoint(prefix)
  keys = sorted(reader.get_variable_to_dtype_map())
  counters = [k for k in keys if _is_counter(k)]
  if not any(k.split("/")[0].endswith("_input_position") for k in counters):
    raise ValueError(f"{prefix} has no *_input_position counter to set; its keys: {keys}")
  dtypes = reader.get_variable_to_dtype_map()
  # Input positions count examples: steps times the global batch size the run saved beside them.
  batch = {
    k.split("/")[0][: -len("_global_batch_size")]: int(reader.get_tensor(k))
    for k in keys
    if "_global_batch_size/" in k
  }

  def value(key):
    name = key.split("/")[0]
    if name.endswith("_input_position"):
      return position * batch.get(name[: -len("_input_position")], 1)
    return position

  tensors = [
    tf.constant(value(k), dtypes[k]) if k in counters else tf.constant(reader.get_tensor(k)) for k in keys
  ]
  if iterator_states is not None:
    if _STATES not in keys:
      raise ValueError(f"{prefix} holds no saved input iterator states ({_STATES})")
    pipelines = len(iterator_states)
    tensors[keys.index(_STATES)] = tf.constant(iterator_states)
    tensors[keys.index(_POSITIONS)] = tf.constant([position * batch.get("train", 1)] * pipelines, tf.int64)
    counters += [_STATES, _POSITIONS]
  del reader
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys), tensors=tensors)
  return counters


def input_position(model_dir: str) -> int:
  """The train input position in the latest checkpoint of `model_dir`, in steps."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")))
  names = {k.split("/")[0]: k for k in reader.get_variable_to_dtype_map()}
  batch = (
    int(reader.get_tensor(names["train_global_batch_size"])) if "train_global_batch_size" in names else 1
  )
  return int(reader.get_tensor(names["train_input_position"])) // batch


def _cli(model_dir: str, gin_file: str, max_steps: int, strategy: str | None = None) -> list[str]:
  params = plain_records.STRATEGIES[strategy][0] if strategy else []
  return cli_command() + [
    f"--model_dir={model_dir}",
    f"--gin_file={gin_file}",
    f"--gin_param=Executor.max_steps={max_steps}",
    *[f"--gin_param={p}" for p in params],
  ]


def _run(model_dir, gin_file, max_steps, strategy, timeout=None, output=None) -> float | None:
  """Seconds from spawning the run (every worker of its strategy) to its chief's first loop ending at max_steps."""
  workers = plain_records.STRATEGIES[strategy][1] if strategy else 1
  envs = plain_records.cluster_env(child_env(), workers)
  cmd = _cli(model_dir, gin_file, max_steps, strategy)
  others = plain_records.start_others(cmd, envs)
  try:
    secs, _ = run_to_marker(cmd, f"train step {max_steps}:", envs[0], timeout, output)
  finally:
    plain_records.wait_all(others, timeout=30 if secs is None else 600)
  return secs


def restart_secs(
  base: str,
  work: str,
  gin_file: str,
  n: int,
  position: int,
  timeout: float,
  strategy: str | None = None,
  iterator_states: list[bytes] | None = None,
) -> float | None:
  """Seconds from a fresh CLI process to its first train loop, restarted from `base` set at `position`."""
  model_dir = os.path.join(work, f"p{position}")
  shutil.rmtree(model_dir, ignore_errors=True)
  shutil.copytree(base, model_dir)
  set_position(os.path.join(model_dir, "checkpoints"), position, iterator_states)
  log: list[str] = []
  secs = _run(model_dir, gin_file, position + n, strategy, timeout, log)
  if secs is not None and strategy is not None and position:
    resumed = f"the input resumes at example {position * plain_records.BATCH} from its saved iterator state"
    replayed = any("replays" in line for line in log)
    if replayed if iterator_states is not None else not replayed:
      how = "resume from its saved iterator states" if iterator_states is not None else "replay"
      raise RuntimeError(f"{model_dir}: did not {how}:\n" + "".join(log[-20:]))
    if iterator_states is not None and not any(resumed in line for line in log):
      raise RuntimeError(f"{model_dir}: did not log '{resumed}':\n" + "".join(log[-20:]))
  if secs is not None and input_position(model_dir) != position + n:
    raise RuntimeError(
      f"{model_dir}: input position {input_position(model_dir)} after the run, not {position + n}"
    )
  shutil.rmtree(model_dir, ignore_errors=True)
  return secs


def _lm_shards_gin(work: str) -> str:
  """`gin/lm.gin` reading TFRecord shards written once here by `executor.tasks.lm.prepare` (16 shards)."""
  from executor.tasks.lm.prepare import prepare

  shards = os.path.join(work, "lm_shards")
  prepare(shards, sequence_length=128)
  path = os.path.join(work, "lm_shards.gin")
  with open(path, "w") as f:
    f.write(
      f"include '{os.path.join(ROOT, 'gin', 'lm.gin')}'\n"
      f"TransformerLM.train_files = '{shards}/train-*.tfrecord'\n"
      "TrainProgram.steps_per_loop = 10\n"
      "SimpleProgramSchedule.eval_programs = []\n"  # Restart time only; no eval or decode after the loop.
    )
  return path


def _pow10(p: int) -> str:
  exponent = len(str(p)) - 1
  return f"10^{exponent}" if p > 1 and p == 10**exponent else str(p)


def resume(args, work: str) -> dict:
  """The table task x position; {(task, position): median seconds, or None past the timeout}."""
  t = args.timeout
  say(
    f"== resume: fresh process to the first finished train loop after a restart at step P, median of "
    f"{args.repeats}; timeout {t:.0f} s =="
  )
  say(f"{'task':14} {'P':>6} {'secs':>17} {'t(P)/t(0)':>10} {'replay ms/step':>15}   [each repeat]")
  results = {}
  tasks = {name: TASKS.get(name) for name in args.tasks}
  if "lm_shards" in tasks:
    tasks["lm_shards"] = (_lm_shards_gin(work), 10)
  for name in PLAIN:
    if name in tasks:
      tasks[name] = (plain_records.write_gin(work, 10), 10)
  for task, (gin_file, n) in tasks.items():
    base = os.path.join(work, task, "base")
    strategy = PLAIN.get(task)
    _run(base, gin_file, n, strategy)
    t0, timed_out = None, False
    for position in args.positions:
      states = None
      if strategy is not None and not timed_out and not args.replay:
        checkpoint = tf.train.latest_checkpoint(os.path.join(base, "checkpoints"))
        states = plain_records.iterator_states(checkpoint, gin_file, strategy, position)
      runs = []
      while not timed_out and len(runs) < args.repeats:
        runs.append(restart_secs(base, os.path.join(work, task), gin_file, n, position, t, strategy, states))
        timed_out = runs[-1] is None
      secs = results[(task, position)] = None if timed_out else median(runs)
      t0 = secs if position == 0 else t0
      row = f"{task:14} {_pow10(position):>6}"
      if secs is None:
        late = "(timeout)" if runs else "(not run)"
        say(f"{row} {f'>{t:.0f} s {late}':>17} {'>' + format(t / t0, '.1f') if t0 else '':>10}")
        continue
      replay = f"{1e3 * (secs - t0) / position:.3f}" if position else ""
      say(f"{row} {secs:>15.2f} s {secs / t0:>10.2f} {replay:>15}   [{', '.join(f'{v:.2f}' for v in runs)}]")
  say()
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="One repeat per position (else --repeats).")
  parser.add_argument("--repeats", type=int, default=None, help="Restarts per position (3; 1 with --quick).")
  parser.add_argument(
    "--timeout", type=float, default=120.0, help="Seconds before a restart counts as too slow."
  )
  parser.add_argument("--positions", default="0,10000,100000,1000000", help="Restart steps, smallest first.")
  parser.add_argument(
    "--replay", action="store_true", help="plain_*: restart without the iterator states of P (a replay)."
  )
  parser.add_argument(
    "--tasks",
    default="quickstart,augmented",
    help="Tasks to restart, in order (also: lm_shards, plain_mirrored, plain_2workers).",
  )
  args = parser.parse_args()
  args.tasks = args.tasks.split(",")
  known = {*TASKS, "lm_shards", *PLAIN}
  if set(args.tasks) - known:
    parser.error(f"--tasks: unknown {sorted(set(args.tasks) - known)}")
  args.repeats = args.repeats or (1 if args.quick else 3)
  args.positions = sorted(int(p) for p in args.positions.split(","))
  if args.positions[0] != 0:
    parser.error("--positions must include 0 (the reference of the ratios)")
  start(args)
  with tempfile.TemporaryDirectory(prefix="bench_resume_") as work:
    resume(args, work)
  return 0


if __name__ == "__main__":
  sys.exit(main())
