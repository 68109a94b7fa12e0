"""The installed distribution: two top-level packages, no clash with a user's own `tasks/` or `core/`, and an
import that changes nothing about the process."""

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
from conftest import REPO

from executor.cli.config import parse_config
from programs.core.errors import ConfigError

PRODUCT_PACKAGES = {"executor", "programs"}


def _python(code, cwd, env=None, timeout=300):
  env = dict(env or os.environ)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # As a user's shell has it.
  return subprocess.run(
    [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
  )


def _user_experiments(root):
  """A user's folder of experiments, as docs/own-task.md lays it out, with packages named like ours used to be."""
  (root / "tasks").mkdir(parents=True)
  (root / "core").mkdir()
  (root / "configs").mkdir()
  (root / "core" / "__init__.py").write_text("SCALE = 2.0  # The user's own core package.\n")
  (root / "tasks" / "__init__.py").write_text("")
  (root / "tasks" / "mine.py").write_text(
    textwrap.dedent(
      """\
      import gin
      import keras
      import numpy as np
      import tensorflow as tf

      from core import SCALE
      from executor import Task, array_dataset


      @gin.configurable
      class LineFit(Task):
        splits = ("train", "test")

        def build(self):
          self.model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])

        def dataset(self, split, input_context, start_example=0):
          x = np.random.default_rng(0 if split == "train" else 1).uniform(-1, 1, (256, 1)).astype("float32")
          arrays = {"x": x, "y": SCALE * x + 1}
          return array_dataset(arrays, input_context, self.global_batch_size, split == "train", 0, start_example)

        def compute_loss(self, batch, training):
          error = self.model(batch["x"], training=training) - batch["y"]
          loss = tf.reduce_mean(tf.square(error))
          return loss, {"mse": (loss, tf.cast(tf.shape(error)[0], tf.float32))}, {}
      """
    )
  )
  (root / "configs" / "mine.gin").write_text(
    textwrap.dedent(
      """\
      import tasks.mine

      Executor.task = @LineFit()
      Executor.max_steps = 40
      LineFit.global_batch_size = 16
      TrainProgram.steps_per_loop = 20
      SimpleProgramSchedule.eval_programs = [@EvalProgram]
      """
    )
  )


@pytest.mark.slow
def test_the_wheel_installs_only_the_product_packages_and_a_users_tasks_and_core_never_clash(tmp_path):
  # Built from a copy: setuptools writes build/ and *.egg-info beside the sources (a stale build/lib of this
  # checkout would end up in the wheel).
  source = tmp_path / "source"
  source.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / name, source / name)
  for name in ("executor", "programs", "gin"):
    shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
  wheels = tmp_path / "wheels"
  built = subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--no-deps",
      "--no-build-isolation",
      "-w",
      str(wheels),
      str(source),
    ],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert built.returncode == 0, built.stderr[-3000:]
  (wheel,) = wheels.glob("*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
  assert top_level == PRODUCT_PACKAGES, sorted(top_level)
  assert "executor/gin_configs/quickstart.gin" in names

  # Installed from the wheel (not this checkout) into a folder of its own, which comes first on sys.path.
  site = tmp_path / "site"
  installed = subprocess.run(
    [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert installed.returncode == 0, installed.stderr[-3000:]
  experiments = tmp_path / "experiments"
  _user_experiments(experiments)
  env = dict(os.environ, PYTHONPATH=str(site))
  where = _python("import executor, programs; print(executor.__file__, programs.__file__)", experiments, env)
  assert where.returncode == 0 and where.stdout.count(str(site)) == 2, where

  command = [os.path.join(os.path.dirname(sys.executable), "executor")]
  search = [f"--gin_search_path={experiments}", f"--gin_search_path={experiments / 'configs'}"]
  runs = {
    "mine": [*search, "--gin_file=mine.gin"],
    "quickstart": [*search, "--gin_file=quickstart", "--gin_param=Executor.max_steps=250"],
  }
  for name, args in runs.items():
    model_dir = tmp_path / "runs" / name
    out = subprocess.run(
      [*command, *args, f"--model_dir={model_dir}"],
      cwd=experiments,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert out.returncode == 0, (name, out.stderr[-3000:])
    assert (
      out.stderr.rstrip()
      .splitlines()[-1]
      .endswith(f"Done at step {40 if name == 'mine' else 250}: {model_dir}")
    )
    assert (model_dir / "checkpoints" / "checkpoint").exists()


def test_importing_the_package_changes_no_process_setting(tmp_path):
  code = textwrap.dedent(
    """\
    import os, sys, threading
    before = os.fstat(2)
    import executor, programs, executor.tasks.spirals
    after = os.fstat(2)
    print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"), (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino),
          [t.name for t in threading.enumerate() if "filter" in t.name])
    """
  )
  out = _python(code, tmp_path, dict(os.environ, PYTHONPATH=str(REPO)))
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split("\n")[-2] == "None True []", out.stdout


@pytest.mark.parametrize(
  "first", ["programs", "programs.core.task", "executor.tasks.lm", "executor.cli.main", "executor"]
)
def test_each_package_imports_first_without_a_cycle_and_programs_needs_no_executor(first, tmp_path):
  code = f"import sys, {first}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {{'executor', 'programs'}}))"
  out = _python(code, tmp_path, dict(os.environ, PYTHONPATH=str(REPO)))
  assert out.returncode == 0, out.stderr[-3000:]
  loaded = out.stdout.strip().splitlines()[-1]
  assert loaded == ("['programs']" if first.startswith("programs") else "['executor', 'programs']"), loaded


def test_executor_help_exits_0(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "executor.cli.main", "--help"],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert "USAGE: executor --model_dir=DIR --gin_file=FILE" in out.stdout and "--gin_search_path" in out.stdout


@pytest.mark.parametrize(
  "statement,new",
  [
    ("import tasks.spirals", "import executor.tasks.spirals instead"),
    ("import tasks.lm", "import executor.tasks.lm instead"),
    ("import core", "import programs.core instead (in Python: from executor import Task, Runtime, ...)"),
    (
      "import core.data",
      "import programs.core.data instead (in Python: from executor import Task, Runtime, ...)",
    ),
  ],
)
def test_a_gin_file_importing_an_old_path_gets_one_line_naming_the_new_one(statement, new, tmp_path):
  gin_file = tmp_path / "old.gin"
  gin_file.write_text(f"{statement}\nExecutor.max_steps = 10\n")
  with pytest.raises(ConfigError) as error:
    parse_config([str(gin_file)], [])
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(
    f"gin file '{gin_file}': '{statement}' names the old path of a module that moved: "
  )
  assert message.endswith(new), message


def test_an_old_path_as_module_flag_is_named_too_and_a_users_missing_module_is_a_plain_error(tmp_path):
  with pytest.raises(
    ConfigError, match=r"^--module 'tasks.reverse': .* import executor.tasks.reverse instead$"
  ):
    parse_config([], [], modules=["tasks.reverse"])
  gin_file = tmp_path / "mine.gin"
  gin_file.write_text("import tasks.mine\n")
  with pytest.raises(ConfigError, match=r"cannot import tasks.mine: No module named 'tasks'"):
    parse_config([str(gin_file)], [])
