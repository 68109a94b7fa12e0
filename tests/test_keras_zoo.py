"""The Keras zoo's acceptance suite: eight models as keras.io users write them (`tests/keras_zoo/`), each through
its gin file, must

1. resume exactly: a `--deterministic` run killed with SIGKILL mid-run (after the train loop of step 25, the last
   checkpoint at step 20) and started again ends with every checkpoint tensor bit-identical to an uninterrupted
   run's, a saved input iterator state giving the same batches (`runs.state_differences`), and the same eval
   metrics;
2. train and evaluate as `fit` and `evaluate` do: from the same weights and RNG seeds, on the same batches in the
   same order, the train loops' metrics equal `fit`'s epochs' logs under `fit`'s names, the weights equal after
   them, and the eval program's metrics equal `evaluate`'s;
3. export (`executor export`) a SavedModel whose `serving_default` takes the model's inputs alone, under the
   model's names, in a process importing TensorFlow and numpy only, and predicts what `model.predict` does;
4. refuse what cannot run as `fit` runs it in one line naming the feature and what to do instead.

`multi_io@bfloat16` is the multi-input model again under `Runtime.precision = 'mixed_bfloat16'`, checked against `fit`
(check 2) only: a kill -9 resume in bfloat16 is `tests/test_resume.py`'s.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from faults_util import Executor, kill_all
from keras_zoo import HERE, ZOO, fit_check, runs

from programs.core.errors import ConfigError

NAMES = list(ZOO)
# The 16-bit variant of a model is checked against fit only (bf16 kill -9 resume: tests/test_resume.py).
RUN_NAMES = [name for name in NAMES if "@" not in name]
LOOPS = 2  # Train loops (fit epochs) compared with fit.
SERVED_ROWS = 6
SHORT_RUN = [
  "Executor.max_steps = 5",
  "SimpleProgramSchedule.eval_programs = []",
]  # One train loop, no evaluation.


@pytest.fixture(autouse=True)
def _no_stray_processes():
  yield
  kill_all()


# The uninterrupted run of each model: its model_dir, or why it failed.
_references: dict[str, object] = {}


def start_reference(name: str, folder) -> Executor | None:
  """Starts the model's uninterrupted `--deterministic` run (one per session; None when it has run)."""
  return None if name in _references else runs.start(ZOO[name], folder / "reference")


def finish_reference(name: str, folder, run: Executor | None) -> object:
  """Waits for the run `start_reference` started; its model_dir, or the log of its failure."""
  if run is not None:
    code = run.finish(timeout=300)
    _references[name] = folder / "reference" if code == 0 else f"exited with {code}:\n{run.tail(20)}"
  return _references[name]


def reference(name: str, folder) -> object:
  return finish_reference(name, folder, start_reference(name, folder))


@pytest.fixture(scope="session")
def zoo_dirs(tmp_path_factory):
  return {name: tmp_path_factory.mktemp(name) for name in RUN_NAMES}


# ---------------------------------------------------------------------------------------------- 1. resume


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_NAMES)
def test_kill_9_mid_run_resumes_bit_exactly(zoo_dirs, name):
  folder = zoo_dirs[name]
  model = ZOO[name]
  marker = folder / "held"
  killed = runs.start(model, folder / "run", hold=marker)
  uninterrupted = start_reference(name, folder)  # Beside the run to kill: two cores.
  runs.wait_for_file(killed, marker)
  latest = runs.latest_checkpoint(folder / "run")
  assert latest is not None and latest.endswith("ckpt-20"), f"held at step 25 with {latest} the latest"
  killed.kill()
  assert killed.returncode == -signal.SIGKILL
  expected = finish_reference(name, folder, uninterrupted)
  assert not isinstance(expected, str), f"the uninterrupted run failed: {expected}"
  resumed = runs.start(model, folder / "run")
  exporter = start_export(name)  # Beside the resumed run: two cores.
  code = resumed.finish(timeout=300)
  finish_export(name, exporter)
  assert code == 0, resumed.tail(20)
  assert re.search(r"Restored .*ckpt-20 at step 20", resumed.log), resumed.tail(20)
  final_a, final_b = runs.latest_checkpoint(expected), runs.latest_checkpoint(folder / "run")
  assert final_a.endswith(f"ckpt-{runs.MAX_STEPS}") and final_b.endswith(f"ckpt-{runs.MAX_STEPS}")
  differences = runs.state_differences(model, final_a, final_b)
  assert not differences, "the resumed run's final checkpoint differs:\n" + "\n".join(differences)
  program = f"eval_{model.eval_split}"
  assert runs.last_metrics(folder / "run", program) == runs.last_metrics(expected, program)


# ---------------------------------------------------------------------------------------------- 2. fit


def _eval_dataset(task, split: str) -> tf.data.Dataset:
  data = task.dataset_fn(split)
  if not isinstance(data, tf.data.Dataset):
    data = tf.data.Dataset.from_tensor_slices(tuple(data))
  return data.batch(task.global_batch_size)


@pytest.mark.parametrize("name", NAMES)
def test_train_and_eval_programs_equal_fit_and_evaluate(tmp_path, name):
  model = ZOO[name]
  rel = 1e-5 if model.precision == "float32" else 2e-3
  keras.utils.set_random_seed(0)
  executor, task, train, evaluate = fit_check.executor_of(model, tmp_path / "run")
  theirs = fit_check.keras_copy(task, model.precision)  # The initial weights and seeds.
  batches = fit_check.train_batches(executor, task, LOOPS * train.steps_per_loop)
  ours = [train.run().metrics for _ in range(LOOPS)]
  fit_args = {"class_weight": task.class_weight} if getattr(task, "class_weight", None) else {}
  history = theirs.fit(
    fit_check.as_dataset(batches), epochs=LOOPS, steps_per_epoch=train.steps_per_loop, verbose=0, **fit_args
  ).history
  problems = []
  for i, metrics in enumerate(ours):
    logs = {k: values[i] for k, values in history.items()}
    problems += [
      f"train loop {i + 1} vs epoch {i + 1}: {p}" for p in fit_check.differences(metrics, logs, rel)
    ]
  ours_weights, fit_weights = fit_check.paired_values(task.model, theirs)
  problems += [f"weights after training: {p}" for p in fit_check.differences(ours_weights, fit_weights, rel)]
  fit_check.copy_variables(task.model, theirs)
  expected = theirs.evaluate(_eval_dataset(task, model.eval_split), verbose=0, return_dict=True)
  problems += [f"eval: {p}" for p in fit_check.differences(evaluate.run().metrics, expected, rel)]
  assert not problems, "the executor and fit differ:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------- 3. export


def _model_inputs(model: keras.Model, features) -> dict[str, str | None]:
  """{name: dtype} of the inputs a client gives the model: the keys of a dict of `keras.Input`s, else each
  `keras.Input`'s name (a `Sequential`'s too); for a subclassed model (no declared inputs), the features' dict
  keys, else `inputs`, with the data's dtypes (None)."""
  try:
    declared = model.input if isinstance(model.input, dict) else None
  except (AttributeError, ValueError):  # A Sequential has no `input` (its `inputs` are declared).
    declared = None
  if declared is not None:
    return {name: declared[name].dtype for name in sorted(declared)}
  inputs = getattr(model, "inputs", None)
  if inputs:
    return {t.name: t.dtype for t in inputs}
  return {name: None for name in (sorted(features) if isinstance(features, dict) else ["inputs"])}


def _rows(task, split: str):
  """The first `SERVED_ROWS` examples' features of a split (numpy), in the order `dataset_fn` gives them."""
  data = task.dataset_fn(split)
  if not isinstance(data, tf.data.Dataset):
    data = tf.data.Dataset.from_tensor_slices(tuple(data))
  batch = tf.nest.map_structure(lambda t: t.numpy(), next(iter(data.batch(SERVED_ROWS))))
  x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
  return x


def _load(model_dir):
  """The task of a run with the weights of its latest checkpoint, as a notebook user loads it (`load_model`)."""
  from executor.cli.config import parse_config
  from executor.executor import Executor as Run

  # Keras names variables with process-wide counters (`dense_7`); a fresh session names them as the run did.
  keras.backend.clear_session()
  parse_config([str(model_dir / "operative_config.gin")], [], [str(HERE.parent)], [])
  try:
    return Run(str(model_dir)).load_model()
  finally:
    import gin

    gin.clear_config()


# The export of each model's uninterrupted run: its folder, or why there is none.
_exports: dict[str, object] = {}


def start_export(name: str) -> Executor | None:
  """Starts `executor export` of the model's uninterrupted run (None: exported already, or no run to export)."""
  ref = _references.get(name)
  if name in _exports or ref is None:
    return None
  if isinstance(ref, str):
    _exports[name] = f"no uninterrupted run: {ref}"
    return None
  return runs.export(ref, ref.parent / "export.log")


def finish_export(name: str, exporter: Executor | None) -> object:
  """Waits for the export `start_export` started; the export's folder, or the log of its failure."""
  if exporter is not None:
    code = exporter.finish(timeout=300)
    exports = runs.exports_of(_references[name])
    _exports[name] = (
      exports[-1] if code == 0 and exports else f"executor export exited with {code}:\n{exporter.tail(15)}"
    )
  return _exports[name]


def _export_all(zoo_dirs) -> dict[str, object]:
  """{name: its uninterrupted run's export folder, or why there is none}: those not exported yet, two at a time."""
  for name in RUN_NAMES:
    reference(name, zoo_dirs[name])
  pending = [n for n in RUN_NAMES if n not in _exports]
  for pair in (pending[i : i + 2] for i in range(0, len(pending), 2)):
    exporters = {n: start_export(n) for n in pair}
    for n, exporter in exporters.items():
      finish_export(n, exporter)
  return {n: _exports[n] for n in RUN_NAMES}


@pytest.fixture(scope="session")
def served(zoo_dirs):
  """Every model's reference run exported and served in one fresh process with TensorFlow alone:
  {name: (what serve.py saw, the features given, `model.predict` of them), or why not}."""
  outcome: dict[str, object] = {}
  jobs, expected = {}, {}
  for name, export_dir in _export_all(zoo_dirs).items():
    if isinstance(export_dir, str):
      outcome[name] = export_dir
      continue
    try:
      task = _load(_references[name])
      x = _rows(task, ZOO[name].eval_split)
      # As tensors: Keras' predict takes no numpy array of strings (dtype object).
      prediction = task.model.predict(tf.nest.map_structure(tf.constant, x), verbose=0)
    except Exception as e:  # noqa: BLE001  (one model's failure is its test's)
      outcome[name] = f"load_model and predict: {type(e).__name__}: {e}"
      continue
    inputs = _model_inputs(task.model, x)
    leaves = [x[k] for k in inputs] if isinstance(x, dict) else tf.nest.flatten(x)
    # In the dtype of the model's inputs (a float32 `keras.Input` fed int64 one-hot vectors is served float32).
    features = {
      k: v if dtype in (None, "string") else v.astype(dtype) for (k, dtype), v in zip(inputs.items(), leaves)
    }
    expected[name] = (features, prediction)
    jobs[name] = runs.serving_job(export_dir, features, zoo_dirs[name] / "serving")
  if jobs:
    jobs_file = zoo_dirs[RUN_NAMES[0]].parent / "serving_jobs.json"
    jobs_file.write_text(json.dumps(list(jobs.values())))
    proc = subprocess.run(
      [sys.executable, str(HERE / "serve.py"), str(jobs_file)],
      env=runs.environment_without_this_package(),
      capture_output=True,
      text=True,
      timeout=300,
    )
    for name, job in jobs.items():
      try:
        result = json.loads(open(job[2]).read())
      except OSError:
        outcome[name] = f"serve.py exited with {proc.returncode}: {proc.stderr[-2000:]}"
        continue
      outcome[name] = (result, *expected[name])
  return outcome


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_NAMES)
def test_export_serves_the_model_inputs_alone_in_a_tensorflow_only_process(served, name):
  outcome = served[name]
  assert not isinstance(outcome, str), outcome
  result, features, prediction = outcome
  assert "error" not in result, f"serving_default with {sorted(features)}: {result['error']}"
  assert not result.get("modules"), f"the serving process imported {result['modules']}"
  assert result["inputs"] == sorted(features), f"serving_default takes {result['inputs']}"
  outputs = result["outputs"]
  expected = prediction if isinstance(prediction, dict) else {"(the one output)": prediction}
  if not isinstance(prediction, dict):
    assert len(outputs) == 1, f"one output expected, served {sorted(outputs)}"
    outputs = {"(the one output)": next(iter(outputs.values()))}
  assert set(outputs) == set(expected), f"served outputs {sorted(outputs)}, the model's {sorted(expected)}"
  for key, value in expected.items():
    np.testing.assert_allclose(np.asarray(outputs[key]), value, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_load_model_works_in_a_process_that_built_the_model_before(zoo_dirs):
  """A notebook builds the model to look at it, then loads a run's weights (`Executor.load_model`): Keras' name
  counters have moved on (`dense_7`), the checkpoint's weights must still load."""
  from keras_zoo import structured

  from executor.cli.config import parse_config
  from executor.executor import Executor as Run

  ref = reference("structured", zoo_dirs["structured"])
  assert not isinstance(ref, str), ref
  structured.heart_model()  # The user's first look at the model.
  parse_config([str(ref / "operative_config.gin")], [], [str(HERE.parent)], [])
  task = Run(str(ref)).load_model()
  reader = tf.train.load_checkpoint(runs.latest_checkpoint(ref))
  kernel = next(v for v in task.model.trainable_variables if v.path.endswith("kernel"))
  saved = [k for k in reader.get_variable_to_shape_map() if k.startswith("variables/") and "kernel" in k]
  assert any(np.array_equal(reader.get_tensor(k), kernel.numpy()) for k in saved)


# ---------------------------------------------------------------------------------------------- 4. refusals


def _refusal(tmp_path, name: str, *params: str, gin_text: str = "") -> str:
  """The one-line ConfigError a run of the model (with `params`, or `gin_text` after its gin file) stops with."""
  from executor.cli.main import run

  files = [str(ZOO[name].gin_file)]
  if gin_text:
    (tmp_path / "extra.gin").write_text(gin_text)
    files.append(str(tmp_path / "extra.gin"))
  with pytest.raises(ConfigError) as raised:
    run(str(tmp_path / "run"), files, list(params), gin_search_paths=[str(HERE.parent)])
  message = str(raised.value)
  assert "\n" not in message, f"not one line: {message}"
  assert not (tmp_path / "run").exists(), "a refused run left its model_dir"
  return message


def test_a_batched_timeseries_dataset_is_refused_naming_batch_size_none(tmp_path):
  # keras.io batches windows in timeseries_dataset_from_array(batch_size=256); KerasTask batches them itself.
  gin_text = "import keras_zoo.refusals\nKerasTask.dataset_fn = @batched_weather_windows\n"
  message = _refusal(tmp_path, "timeseries", gin_text=gin_text)
  assert re.search(r"batch", message) and "batch_size=None" in message, message


def test_a_learning_rate_scheduler_callback_is_refused_naming_a_schedule(tmp_path):
  gin_text = (
    "import keras_zoo.refusals\n"
    "KerasTask.callbacks = [@keras.callbacks.LearningRateScheduler()]\n"
    "keras.callbacks.LearningRateScheduler.schedule = @halve_every_epoch\n"
  )
  message = _refusal(tmp_path, "timeseries", gin_text=gin_text)
  assert "LearningRateScheduler" in message and "keras.optimizers.schedules" in message, message


def test_class_weight_with_several_outputs_is_refused_naming_sample_weights(tmp_path):
  message = _refusal(tmp_path, "multi_io", "KerasTask.class_weight = {0: 1.0, 1: 5.0}")
  assert "class_weight" in message and "sample_weight" in message, message


def test_class_weight_with_sample_weights_is_refused_naming_the_product(tmp_path):
  gin_text = "import keras_zoo.refusals\nKerasTask.dataset_fn = @weighted_fraud_data\n"
  message = _refusal(tmp_path, "imbalanced", gin_text=gin_text)
  assert "class_weight" in message and "sample weight" in message, message


def test_a_gan_without_call_trains_or_is_refused_naming_call(tmp_path):
  """keras.io's DCGAN defines no `call` (`fit` trains it: its `train_step` never calls the model). Training and
  exporting it either work, or stop with one line naming `call`, not blaming the data."""
  from executor.cli.main import export, run

  params = ["KerasTask.model_fn = @blob_gan_without_call", "Executor.max_steps = 5"]
  try:
    assert (
      run(str(tmp_path / "run"), [str(ZOO["gan"].gin_file)], params, gin_search_paths=[str(HERE.parent)]) == 5
    )
    import gin

    gin.clear_config()
    export(str(tmp_path / "run"), gin_search_paths=[str(HERE.parent)])
  except ConfigError as e:
    message = str(e)
    assert "\n" not in message and "call" in message, message
    assert "does not fit the examples" not in message, f"the data is not at fault: {message}"


def test_a_global_mixed_precision_policy_is_used_or_refused_naming_runtime_precision(tmp_path):
  """keras.io's mixed precision guide sets the policy in code (`set_global_policy`): the model trains under it, or
  the run stops in one line naming `Runtime.precision`; it is never silently trained in float32."""
  previous = keras.config.dtype_policy()
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    executor, task, _, _ = fit_check.executor_of(
      ZOO["mixed"], tmp_path / "run", ["Runtime.precision = 'float32'"]
    )
  except ConfigError as e:
    assert "\n" not in str(e) and "Runtime.precision" in str(e), str(e)
    return
  finally:
    keras.config.set_dtype_policy(previous)
  assert task.model.dtype_policy.name == "mixed_float16", f"built under {task.model.dtype_policy.name}"


def test_compile_arguments_the_programs_replace_are_named_in_the_log(tmp_path, caplog):
  """`compile(steps_per_execution=..., jit_compile=True)` is not what runs (the programs decide): one line says
  so, naming `TrainProgram.steps_per_loop` and `TrainProgram.jit_compile`."""
  from executor.cli.main import run

  gin_text = "import keras_zoo.refusals\nKerasTask.model_fn = @heart_model_compiled_for_speed\n"
  (tmp_path / "extra.gin").write_text(gin_text)
  files = [str(ZOO["structured"].gin_file), str(tmp_path / "extra.gin")]
  with caplog.at_level("INFO"):
    run(str(tmp_path / "run"), files, SHORT_RUN, gin_search_paths=[str(HERE.parent)])
  lines = [r.getMessage() for r in caplog.records]
  assert any(line.startswith("Final checkpoint at step 5") for line in lines), (
    "the run's log was not captured"
  )
  assert any("jit_compile" in line and "TrainProgram.jit_compile" in line for line in lines), (
    "no line on jit_compile"
  )
  assert any("steps_per_execution" in line and "TrainProgram.steps_per_loop" in line for line in lines), (
    "no line on steps_per_execution"
  )


def test_a_stateful_random_op_in_train_step_is_named_at_start_or_refused(tmp_path, caplog):
  """An unseeded `tf.random.uniform` in a `train_step` (keras.io's TF2-era DCGAN) draws from a stream no checkpoint
  holds, so a resumed run cannot be exact: the start-up log says which op and why (or the run is refused in one
  line naming it and `keras.random` with a `SeedGenerator`)."""
  from executor.cli.main import run

  (tmp_path / "extra.gin").write_text("import keras_zoo.refusals\nKerasTask.model_fn = @tf_random_gan\n")
  files = [str(ZOO["gan"].gin_file), str(tmp_path / "extra.gin")]
  try:
    with caplog.at_level("INFO"):
      run(str(tmp_path / "run"), files, SHORT_RUN, gin_search_paths=[str(HERE.parent)])
  except ConfigError as e:
    assert "\n" not in str(e) and "random" in str(e).lower() and "SeedGenerator" in str(e), str(e)
    return
  assert any(r.getMessage().startswith("Final checkpoint at step 5") for r in caplog.records), (
    "no log captured"
  )
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert any("random" in w.lower() and "resume" in w.lower() for w in warnings), warnings


def test_progress_lines_of_a_train_step_without_loss_show_the_losses_it_returns(tmp_path, caplog):
  """keras.io's GAN returns `d_loss` and `g_loss`, no `loss`: its progress lines show those, never `loss nan`."""
  from executor.cli.main import run

  with caplog.at_level("INFO"):
    run(str(tmp_path / "run"), [str(ZOO["gan"].gin_file)], SHORT_RUN, gin_search_paths=[str(HERE.parent)])
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Progress: step 5/5")]
  assert len(lines) == 1, "no progress line"
  assert re.search(r"\| d_loss [\d.]+ g_loss [\d.]+ \| ETA", lines[0]) and "nan" not in lines[0], lines[0]
