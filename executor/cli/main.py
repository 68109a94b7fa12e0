"""The `executor` command: gin files and bindings in, a run in `--model_dir` out.

`executor report --model_dir=DIR` prints a report of a run (steps,
checkpoints, the last value of every summary scalar) from its files only.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

_USAGE = """
USAGE: executor --model_dir=DIR --gin_file=FILE [--gin_file=...] [--gin_param=BINDING ...]
                [--deterministic] [--seed=N] [--checkpoint_path=CKPT]
         runs (or resumes) the configured schedule of programs in DIR.
       executor --mode=continuous_eval --watch_dir=TRAIN_DIR --model_dir=DIR --gin_file=FILE ...
         evaluates and decodes each new checkpoint of TRAIN_DIR once, into DIR.
       executor report --model_dir=DIR
         prints the latest step, the checkpoints kept and the last value of
         every summary scalar of the run in DIR, from its files only.
"""

FLAGS = flags.FLAGS
flags.DEFINE_string(
  "model_dir",
  None,
  "Directory of the run: checkpoints, summaries, analysis. With `executor report`: the run to report on.",
)
flags.DEFINE_multi_string(
  "gin_file", [], "Gin file(s), applied in order; looked up as given, then in the package's gin/ folder."
)
flags.DEFINE_multi_string(
  "gin_param", [], "Gin binding(s), applied after the files, e.g. --gin_param='Executor.max_steps=100'."
)
flags.DEFINE_bool("deterministic", False, "Op determinism and fixed seeds, for exact reproducibility.")
flags.DEFINE_integer("seed", 0, "Random seed used with --deterministic.")
flags.DEFINE_string(
  "checkpoint_path",
  None,
  "Evaluate/decode this checkpoint once (with "
  "SimpleProgramSchedule.train_executions_per_eval=0) instead of model_dir's latest.",
)
flags.DEFINE_enum(
  "mode",
  "train",
  ["train", "continuous_eval"],
  "train: run the schedule. continuous_eval: evaluate every new checkpoint of --watch_dir once.",
)
flags.DEFINE_string(
  "watch_dir", None, "With --mode=continuous_eval: the model_dir of the training run to watch."
)


def run(
  model_dir: str,
  gin_files,
  gin_params,
  deterministic: bool = False,
  seed: int = 0,
  checkpoint_path: str | None = None,
  watch_dir: str | None = None,
) -> int:
  """Parses the config, builds the executor and runs it; returns the final step.

  Raises:
    ConfigError: for bad input, before anything is written.
  """
  from executor.cli.config import parse_config
  from executor.executor import enable_determinism
  from executor.model_dir import check_model_dir

  check_model_dir(model_dir)
  parse_config(gin_files, gin_params)
  if deterministic:
    enable_determinism(seed)
  executor = _build_executor(model_dir, checkpoint_path=checkpoint_path, watch_dir=watch_dir)
  return executor.run()


def _build_executor(model_dir: str, **kwargs):
  from core.errors import ConfigError
  from executor.executor import Executor

  try:
    return Executor(model_dir=model_dir, **kwargs)
  except ConfigError as e:
    # Our messages name the culprit; gin appends "In call to configurable ..." on a second line.
    raise ConfigError(str(e).splitlines()[0]) from None
  except (ValueError, TypeError) as e:
    # Gin appends "In call to configurable 'X' (...)" naming the binding.
    raise ConfigError(" ".join(str(e).split())) from None


def _main(argv) -> int:
  if len(argv) > 1 and argv[1] == "report":
    if len(argv) > 2:
      raise app.UsageError(f"Unexpected arguments after report: {' '.join(argv[2:])}")
    return _report()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])} (the only subcommand is `report`)")
  from core.errors import ConfigError
  from executor.cli import failures

  try:
    step = run(
      FLAGS.model_dir,
      FLAGS.gin_file,
      FLAGS.gin_param,
      FLAGS.deterministic,
      FLAGS.seed,
      FLAGS.checkpoint_path,
      _watch_dir(),
    )
  except ConfigError as e:
    logging.error("%s", e)
    print(f"executor: error: {e}", file=sys.stderr)
    return 2
  except FloatingPointError as e:  # A non-finite loss or checkpoint: the message says where.
    logging.error("%s", e)
    print(f"executor: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # A second Ctrl-C.
    print(f"executor: {failures.interrupted(FLAGS.model_dir)}", file=sys.stderr)
    return 130
  except Exception as e:  # A full or read-only disk is no bug: say so on one line.
    message = failures.storage_error(e, FLAGS.model_dir)
    if message is None:
      raise
    logging.error("%s", message)
    print(f"executor: error: {message}", file=sys.stderr)
    return 1
  logging.info("Done at step %d", step)
  return 0


def _watch_dir() -> str | None:
  from core.errors import ConfigError

  if FLAGS.mode == "continuous_eval" and not FLAGS.watch_dir:
    raise ConfigError("--mode=continuous_eval needs --watch_dir, the model_dir of the training run")
  if FLAGS.mode == "train" and FLAGS.watch_dir:
    raise ConfigError("--watch_dir goes with --mode=continuous_eval")
  return FLAGS.watch_dir


def _report() -> int:
  """Prints the report of `--model_dir`; returns the exit status."""
  import logging as std_logging

  from core.errors import ConfigError
  from executor.cli.report import report

  # TensorBoard's event reader logs every file it opens at INFO.
  std_logging.getLogger("tensorboard").setLevel(std_logging.WARNING)
  try:
    text = report(FLAGS.model_dir)
  except ConfigError as e:
    print(f"executor: error: {e}", file=sys.stderr)
    return 2
  sys.stdout.write(text)
  sys.stdout.flush()
  return 0


def main() -> None:
  """Console-script entry point."""
  # absl's usage text is __main__'s docstring (the console script has none).
  main_module = sys.modules.get("__main__")
  if main_module is not None and (not main_module.__doc__ or main_module.__doc__ == __doc__):
    main_module.__doc__ = _USAGE
  # absl's --help lists the key flags of the module named by argv[0].
  for name in (
    "model_dir",
    "gin_file",
    "gin_param",
    "deterministic",
    "seed",
    "checkpoint_path",
    "mode",
    "watch_dir",
  ):
    FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
  app.run(_main)


if __name__ == "__main__":
  main()
