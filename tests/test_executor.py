"""The executor's main loop: tracing, evaluate-once schedules, max_steps edges."""

from conftest import read_scalars

from executor.cli.config import parse_config
from executor.cli.main import run
from executor.executor import Executor


def _executor(model_dir, *params):
  parse_config(
    ["gin/spirals.gin"], ["TrainProgram.steps_per_loop = 20", "DecodeProgram.num_batches = 2", *params]
  )
  return Executor(model_dir=str(model_dir))


def test_no_program_is_traced_twice_across_cycles(tmp_path):
  executor = _executor(tmp_path / "run", "Executor.max_steps = 110", "Checkpointer.save_interval_steps = 40")
  assert executor.run() == 110
  # 6 cycles, the last one shorter (10 steps): still one trace per program.
  assert {p.name: p.trace_count for p in executor.programs} == {"train": 1, "eval_test": 1, "decode_test": 1}
  assert [s for s, _ in read_scalars(tmp_path / "run" / "train")["loss"]] == [20, 40, 60, 80, 100, 110]


def test_evaluate_once_reads_the_latest_checkpoint_and_trains_nothing(tmp_path):
  model_dir = tmp_path / "run"
  assert (
    run(str(model_dir), ["gin/spirals.gin"], ["Executor.max_steps = 60", "TrainProgram.steps_per_loop = 30"])
    == 60
  )
  checkpoints = sorted(p.name for p in (model_dir / "checkpoints").iterdir())
  executor = _executor(
    model_dir, "SimpleProgramSchedule.train_executions_per_eval = 0", "EvalProgram.name = 'eval_once'"
  )
  assert executor.run() == 60
  assert executor.schedule.train_program is None
  assert [s for s, _ in read_scalars(model_dir / "eval_once")["accuracy"]] == [60]
  assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == checkpoints


def test_max_steps_already_reached_runs_nothing(tmp_path):
  model_dir = tmp_path / "run"
  params = ["Executor.max_steps = 40", "TrainProgram.steps_per_loop = 40"]
  assert run(str(model_dir), ["gin/spirals.gin"], params) == 40
  assert run(str(model_dir), ["gin/spirals.gin"], params) == 40
  assert len(read_scalars(model_dir / "train")["loss"]) == 1


def test_decode_trigger_interval_and_offset_survive_a_restart(tmp_path):
  model_dir = tmp_path / "run"
  params = [
    "TrainProgram.steps_per_loop = 10",
    "DecodeProgram.trigger_interval = 3",
    "DecodeProgram.trigger_offset = 1",
    "DecodeProgram.num_batches = 1",
  ]
  run(str(model_dir), ["gin/spirals.gin"], [*params, "Executor.max_steps = 50"])
  run(str(model_dir), ["gin/spirals.gin"], [*params, "Executor.max_steps = 100"])
  # Cycles 0..9 end at steps 10..100; decode runs in cycles 1, 4, 7: steps 20, 50, 80.
  assert [s for s, _ in read_scalars(model_dir / "decode_test")["accuracy"]] == [20, 50, 80]
  assert [s for s, _ in read_scalars(model_dir / "eval_test")["accuracy"]] == list(range(10, 110, 10))
