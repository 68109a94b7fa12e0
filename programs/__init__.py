"""Programs: units of compiled work over the runtime, traced once, run many times."""

from programs.decode import DecodeProgram
from programs.eval import EvalProgram
from programs.loop import LoopOptions, LoopResult, build_loop_fn
from programs.program import Program, ProgramResult
from programs.train import NonFiniteLossError, TrainProgram
from programs.train_and_decode import TrainAndDecodeProgram

__all__ = [
  "DecodeProgram",
  "EvalProgram",
  "LoopOptions",
  "LoopResult",
  "NonFiniteLossError",
  "Program",
  "ProgramResult",
  "TrainAndDecodeProgram",
  "TrainProgram",
  "build_loop_fn",
]
