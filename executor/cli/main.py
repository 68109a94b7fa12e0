"""The `executor` command: gin files and bindings in, a run in `--model_dir` out.

`executor report --model_dir=DIR` prints a report of a run (steps,
checkpoints, the last value of every summary scalar) from its files only.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

_USAGE = """
USAGE: executor --model_dir=DIR --gin_file=FILE [--gin_file=...] [--gin_param=BINDING ...]
                [--gin_search_path=DIR ...] [--module=NAME ...] [--deterministic] [--seed=N]
                [--dry_run] [--verbosity=1]
         trains (or resumes training) with the configured schedule of programs in DIR.
       executor --mode=eval [--checkpoint_path=CKPT] --model_dir=DIR [--gin_file=FILE ...]
         evaluates and decodes DIR's latest checkpoint (or CKPT) once (default config: the run's).
       executor --mode=continuous_eval --watch_dir=TRAIN_DIR --model_dir=DIR [--gin_file=FILE ...]
         evaluates and decodes each new checkpoint of TRAIN_DIR once, into DIR (default config: TRAIN_DIR's).
       executor report --model_dir=DIR
         prints the latest step, the checkpoints kept and the last value of
         every summary scalar of the run in DIR, from its files only.
       executor report DIR [DIR ...]   (or a folder of runs)
         prints one table comparing the runs: differing hparams, last step, last and best metrics.
       executor export --model_dir=DIR [--checkpoint_path=CKPT] [--export_dir=EXPORT_DIR]
         writes a SavedModel of DIR's latest checkpoint (or CKPT) to EXPORT_DIR/<step> (default DIR/export).
       The run's config is its operative_config.gin, and the --gin_search_path and --module its training used
       (DIR/command.json) unless given: a command on DIR works from any folder.
       executor index FILES...
         counts the records of TFRecord FILES once and writes records.index.json
         beside them (read by record_dataset; never rebuilt on restart).
"""

FLAGS = flags.FLAGS
_HELP_FLAGS = {"-h", "-?", "--help", "--helpshort"}
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
flags.DEFINE_multi_string(
  "gin_search_path",
  [],
  "Folder(s) searched for --gin_file files, their includes and (put on sys.path) the modules they import or "
  "--module names: a task in its own folder.",
)
flags.DEFINE_multi_string(
  "module", [], "Python module(s) imported before the gin files are parsed, e.g. the one defining your task."
)
flags.DEFINE_bool(
  "dry_run",
  False,
  "Check and compile everything the mode would run (config, programs, inputs, checkpoint), print the plan, "
  "write nothing.",
)
flags.DEFINE_bool("deterministic", False, "Op determinism and fixed seeds, for exact reproducibility.")
flags.DEFINE_integer("seed", 0, "Random seed used with --deterministic.")
flags.DEFINE_string(
  "checkpoint_path", None, "With --mode=eval: evaluate/decode this checkpoint instead of model_dir's latest."
)
MODES = ("train", "eval", "continuous_eval")
flags.DEFINE_enum(
  "mode",
  None,
  list(MODES),
  "train: run the schedule (the default). eval: evaluate and decode one checkpoint once (the default with "
  "--checkpoint_path). continuous_eval: evaluate every new checkpoint of --watch_dir once (the default with "
  "--watch_dir).",
)
flags.DEFINE_string(
  "export_dir",
  None,
  "With `executor export`: where the SavedModel goes (as <step>/); default model_dir/export.",
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
  mode: str | None = None,
  gin_search_paths=(),
  modules=(),
  dry_run: bool = False,
) -> int:
  """Parses the config, builds the executor and runs one of its modes; returns the final global step.

  Args:
    model_dir: The run's directory.
    gin_files: Gin files, applied in order; for an evaluation, the run's `operative_config.gin` when empty (the
      training run's, `watch_dir`'s, for a continuous one).
    gin_params: Gin bindings, applied after the files.
    deterministic: Op determinism and fixed seeds.
    seed: The seed with `deterministic`.
    checkpoint_path: With mode 'eval': the checkpoint to evaluate.
    watch_dir: With mode 'continuous_eval': the training run's model_dir.
    mode: 'train', 'eval' or 'continuous_eval'; None: 'continuous_eval' with `watch_dir`, 'eval' with
      `checkpoint_path`, else 'train' (which evaluates once when the schedule has no train loops).
    gin_search_paths: Folders searched for gin files, includes and (on `sys.path`) modules; when empty, those the
      run recorded (`executor/command_record.py`; a training run records those it used).
    modules: Modules imported before the gin files are parsed; when empty, those the run recorded.
    dry_run: Check and compile everything the mode would run, print the plan, write nothing.

  Raises:
    ConfigError: for bad input, before anything is written.
  """
  from executor import startup_log
  from executor.cli.config import parse_run_config
  from executor.model_dir import check_model_dir
  from programs.core.errors import ConfigError
  from programs.core.runtime import enable_determinism

  if mode is None:
    mode = "continuous_eval" if watch_dir else "eval" if checkpoint_path else "train"
  if mode not in MODES:
    raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
  if mode == "continuous_eval" and not watch_dir:
    raise ConfigError("--mode=continuous_eval needs --watch_dir, the model_dir of the training run")
  if watch_dir and mode != "continuous_eval":
    raise ConfigError("--watch_dir goes with --mode=continuous_eval")
  if checkpoint_path and mode == "continuous_eval":
    raise ConfigError("--checkpoint_path goes with --mode=eval")
  check_model_dir(model_dir)
  run_dir = watch_dir if mode == "continuous_eval" else model_dir  # Whose config the flags not given are.
  record = parse_run_config(run_dir, gin_files, gin_params, gin_search_paths, modules, mode != "train")
  if deterministic:
    enable_determinism(seed)
  try:
    executor = _build_executor(model_dir)
  finally:
    startup_log.stop_filter()  # Start-up is over (the device is set up): stderr is passed on untouched.
  executor.command_record = record  # A training run writes it into model_dir.
  if dry_run:
    print(_as_config_error(executor.dry_run, mode, checkpoint_path, watch_dir), flush=True)
    return executor.runtime.step()
  if mode == "continuous_eval":
    return max(_as_config_error(executor.evaluate_continuously, watch_dir), 0)  # The latest step evaluated.
  elif mode == "eval" or checkpoint_path:
    if mode == "train" and executor.schedule.trains:
      raise ConfigError(
        f"--checkpoint_path '{checkpoint_path}' evaluates one checkpoint: add --mode=eval "
        "(or set SimpleProgramSchedule.train_executions_per_eval = 0)"
      )
    _as_config_error(executor.evaluate, checkpoint_path)
  else:
    _as_config_error(executor.run)
  return executor.runtime.step()


def export(
  model_dir: str,
  gin_files=(),
  gin_params=(),
  checkpoint_path: str | None = None,
  export_dir: str | None = None,
  gin_search_paths=(),
  modules=(),
) -> str:
  """Exports a checkpoint of the run in `model_dir` as a SavedModel; returns its path.

  Args:
    model_dir: The run's directory.
    gin_files: The config; the run's `operative_config.gin` when empty.
    gin_params: Gin bindings, applied after the files.
    checkpoint_path: The checkpoint; model_dir's latest when None.
    export_dir: The SavedModel goes to `export_dir/<step>`; `model_dir/export` when None.
    gin_search_paths: Folders searched for gin files, includes and modules; the run's recorded ones when empty.
    modules: Modules imported before the gin files are parsed; the run's recorded ones when empty.

  Raises:
    ConfigError: for bad input, before anything is written.
  """
  import os

  from executor import startup_log
  from executor.cli.config import parse_run_config
  from programs.core.errors import ConfigError

  if not model_dir:
    raise ConfigError("export needs --model_dir, the run to export")
  if not os.path.isdir(model_dir):
    raise ConfigError(f"model_dir '{model_dir}' does not exist or is not a directory")
  parse_run_config(model_dir, gin_files, gin_params, gin_search_paths, modules, operative=True)
  try:
    executor = _build_executor(model_dir)
  finally:
    startup_log.stop_filter()
  return _as_config_error(executor.export, checkpoint_path, export_dir)


def _build_executor(model_dir: str, **kwargs):
  from executor.cli.suggest import with_suggestion
  from executor.executor import Executor
  from programs.core.errors import ConfigError

  try:
    return Executor(model_dir=model_dir, **kwargs)
  except ConfigError as e:
    # Our messages name the culprit; gin appends "In call to configurable ..." on a second line.
    raise ConfigError(str(e).splitlines()[0]) from None
  except (ValueError, TypeError) as e:
    # Gin appends "In call to configurable 'X' (...)" naming the binding.
    raise ConfigError(with_suggestion(" ".join(str(e).split()))) from None


def _as_config_error(mode, *args):
  """Runs `mode(*args)`; a bad value gin passed to a configurable built there becomes a ConfigError."""
  from executor.cli.suggest import with_suggestion
  from programs.core.errors import ConfigError

  try:
    return mode(*args)
  except (ValueError, TypeError) as e:
    if "In call to configurable" not in str(e):
      raise
    raise ConfigError(with_suggestion(" ".join(str(e).split()))) from None


def _one_line(error: Exception) -> str:
  return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def _main(argv) -> int:
  if len(argv) > 1 and argv[1] == "report":
    from executor import startup_log

    startup_log.stop_filter()
    return _report(argv[2:])
  if len(argv) > 1 and argv[1] == "index":
    return _index(argv[2:])
  exporting = len(argv) > 1 and argv[1] == "export"
  if exporting and len(argv) > 2:
    raise app.UsageError(f"Unexpected arguments after export: {' '.join(argv[2:])}")
  if len(argv) > 1 and not exporting:
    raise app.UsageError(
      f"Unexpected arguments: {' '.join(argv[1:])} (the subcommands are `report`, `export` and `index`)"
    )
  from executor import startup_log
  from executor.cli import failures
  from programs.core.errors import ConfigError, RunError

  if FLAGS.verbosity < 1:
    startup_log.quiet_python_logs()
  try:
    if exporting:
      path = export(
        FLAGS.model_dir,
        FLAGS.gin_file,
        FLAGS.gin_param,
        FLAGS.checkpoint_path,
        FLAGS.export_dir,
        gin_search_paths=FLAGS.gin_search_path,
        modules=FLAGS.module,
      )
      print(path, flush=True)
      return 0
    step = run(
      FLAGS.model_dir,
      FLAGS.gin_file,
      FLAGS.gin_param,
      FLAGS.deterministic,
      FLAGS.seed,
      FLAGS.checkpoint_path,
      FLAGS.watch_dir,
      FLAGS.mode,
      gin_search_paths=FLAGS.gin_search_path,
      modules=FLAGS.module,
      dry_run=FLAGS.dry_run,
    )
  except (ConfigError, RunError) as e:  # Printed once, as the last line; a RunError's traceback at -v 1.
    startup_log.stop_filter()
    if isinstance(e, RunError) and FLAGS.verbosity >= 1:
      logging.exception("The op that failed during the run (the last line says where):")
    print(f"executor: error: {_one_line(e)}", file=sys.stderr)
    return 2
  except FloatingPointError as e:  # A non-finite loss or checkpoint: the message says where.
    print(f"executor: error: {_one_line(e)}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # A second Ctrl-C.
    print(f"executor: {failures.interrupted(FLAGS.model_dir)}", file=sys.stderr)
    return 130
  except Exception as e:  # A full or read-only disk, a lost worker: no bug, one line and its own status.
    message, status = failures.ended(e, FLAGS.model_dir) or (None, None)
    if message is None:
      raise
    print(f"executor: error: {message}", file=sys.stderr)
    return status
  finally:
    startup_log.stop_filter()
  logging.info("Done at step %d: %s", step, FLAGS.model_dir)
  return 0


def _report(paths: list[str]) -> int:
  """Prints the report of `--model_dir` (or of the one run given), or the table comparing runs; the exit status."""
  import logging as std_logging

  from executor.cli.compare import compare, is_run
  from executor.cli.report import report
  from programs.core.errors import ConfigError

  # TensorBoard's event reader logs every file it opens at INFO.
  std_logging.getLogger("tensorboard").setLevel(std_logging.WARNING)
  try:
    if paths and FLAGS.model_dir:
      raise ConfigError("report takes --model_dir=DIR or run folders as arguments, not both")
    if len(paths) == 1 and is_run(paths[0]):
      text = report(paths[0])
    elif paths:
      text = compare(paths)
    else:
      text = report(FLAGS.model_dir)
  except ConfigError as e:
    print(f"executor: error: {e}", file=sys.stderr)
    return 2
  sys.stdout.write(text)
  sys.stdout.flush()
  return 0


def _index(files) -> int:
  """`executor index FILES...`: writes the record index beside the files (once, before training)."""
  from programs.core.errors import ConfigError
  from programs.core.records import write_index

  try:
    if not files:
      raise ConfigError("index needs the record files to index: executor index FILES...")
    for path in write_index(files):
      print(f"executor: wrote {path}")
  except ConfigError as e:
    print(f"executor: error: {_one_line(e)}", file=sys.stderr)
    return 2
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
    "gin_search_path",
    "module",
    "deterministic",
    "seed",
    "checkpoint_path",
    "mode",
    "watch_dir",
    "export_dir",
    "dry_run",
  ):
    FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
  if _HELP_FLAGS & set(sys.argv[1:]):
    # absl prints the help, then exits with status 1; asking for help is no failure.
    app.usage(shorthelp=True, writeto_stdout=True)
    sys.exit(0)
  app.run(_main)


if __name__ == "__main__":
  main()
