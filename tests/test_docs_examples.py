"""The code blocks of README.md and docs/*.md run as written (the markers are described in tests/docs_blocks.py).

Each page runs in a fresh folder outside the repository, its marked blocks in page order, as a user who copies
them would: files written, shell blocks through the installed `executor` command, Python blocks as scripts. Gin
fragments are parsed against the executor's configurables in this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_blocks import COPYABLE, REPO, Block, all_blocks, blocks, count_lines, pages

from executor.cli.config import parse_config

# The README's two contract commands, kept exactly.
INSTALL_AND_RUN = (
  "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && "
  "executor --gin_file=gin/quickstart.gin --model_dir=/tmp/quickstart"
)
TEST_COMMAND = "python -m pytest -q"
# A run's log holds none of these (TensorFlow's start-up notices and internals that the command leaves out).
NOISE = (
  "cuInit",
  "oneDNN",
  "absl::InitializeLog",
  "cuda drivers",
  "Sharding callback",
  "Path not found",
  "No path found after",
)


def _page_name(page: Path) -> str:
  return str(page.relative_to(REPO))


RUNNABLE_PAGES = [
  _page_name(p) for p in pages() if any(b.kind in ("file", "run", "python") for b in blocks(p))
]


def test_every_copyable_block_is_marked_and_every_marker_is_understood():
  problems = []
  for block in all_blocks():
    if block.language in COPYABLE and block.verb is None:
      problems.append(
        f"{block.where}: a {block.language} block without a <!-- test: ... --> or <!-- untested: ... -->"
      )
    if block.verb == "untested" and not block.what:
      problems.append(f"{block.where}: untested, but no reason given")
    if block.verb == "test" and not block.kind:
      problems.append(f"{block.where}: marker 'test: {block.what}' is none of those in tests/docs_blocks.py")
    if block.kind == "run" and block.language not in ("sh", "bash"):
      problems.append(f"{block.where}: 'test: run' on a {block.language or 'plain'} block")
    if block.kind in ("python", "gin") and block.language != block.kind:
      problems.append(f"{block.where}: 'test: {block.kind}' on a {block.language or 'plain'} block")
    if block.kind == "by":
      test_file = REPO / block.test.group("by")
      if not test_file.is_file() or "marked_by(" not in test_file.read_text():
        problems.append(f"{block.where}: {block.test.group('by')} does not run the blocks marked for it")
  assert not problems, "\n".join(problems)
  print("\n".join(count_lines()))  # With -s: the counts per page (the run's summary shows them too).


def test_the_readme_keeps_its_contract_commands_and_stays_short():
  text = (REPO / "README.md").read_text()
  bodies = [b.body.strip() for b in blocks(REPO / "README.md")]
  assert INSTALL_AND_RUN in bodies and TEST_COMMAND in bodies
  assert len(text.splitlines()) <= 250
  assert not re.search(r"\bissue \d+", text, re.I), "release notes go to CHANGELOG.md, in user terms"


def test_the_changelog_names_no_issue_numbers():
  text = (REPO / "CHANGELOG.md").read_text()
  assert "## [Unreleased]" in text and re.search(r"^## \[\d+\.\d+\.\d+\] - \d{4}-\d\d-\d\d$", text, re.M)
  assert not re.search(r"\bissues? \d+|#\d+\b", text, re.I)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.kind == "gin"], ids=lambda b: b.where)
def test_a_gin_fragment_parses_against_the_configurables(block, tmp_path):
  path = tmp_path / "fragment.gin"
  path.write_text(block.body)
  parse_config([str(path)], [])


def _env() -> dict[str, str]:
  env = dict(os.environ)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # As a user's shell has it.
  env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
  return env


def _shell(block: Block) -> str:
  """The block as a bash script; `run with ARGS` adds ARGS to each `executor` command that trains or evaluates."""
  args = block.test.group("args")
  if not args:
    return block.body
  wrapper = (
    "executor() {\n"
    '  case "$1" in report|export|index) command executor "$@" ;;\n'
    f'  *) command executor "$@" {args} ;;\n'
    "  esac\n"
    "}\n"
  )
  return wrapper + block.body


def run_page(page: str, folder: Path) -> list[tuple[Block, subprocess.CompletedProcess]]:
  """Runs the marked blocks of `page` in `folder`, in order; each must succeed. Returns what each run printed."""
  assert shutil.which("executor", path=_env()["PATH"]), (
    "the `executor` command is not installed: pip install -e ."
  )
  ran = []
  for block in blocks(REPO / page):
    if block.kind == "file":
      target = folder / block.test.group("file")
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(block.body)
      continue
    if block.kind == "run":
      command = ["bash", "-e", "-o", "pipefail", "-c", _shell(block)]
    elif block.kind == "python":
      command = [sys.executable, "-c", block.body]
    else:
      continue
    result = subprocess.run(command, cwd=folder, env=_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (
      f"{block.where} exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    )
    ran.append((block, result))
  return ran


def _last_line(text: str) -> str:
  return text.rstrip("\n").splitlines()[-1]


def _check_readme(folder, ran):
  (train, train_result), (report, report_result) = ran
  assert train.body.startswith("executor --gin_search_path=.") and report.body.startswith("executor report")
  # The log says each thing once: no TensorFlow start-up notices, and the last line is the outcome.
  for noise in NOISE:
    assert noise not in train_result.stderr, noise
  assert re.search(r"\] Done at step 500: runs/first$", _last_line(train_result.stderr))
  assert (folder / "runs/first/checkpoints").is_dir()
  eval_part = report_result.stdout.split("\n  eval_test/\n")[1]
  mse = re.search(r"^\s*mse\s+([\d.e+-]+)", eval_part, re.M)
  assert mse and float(mse.group(1)) < 1e-3, report_result.stdout


def _check_own_task(folder, ran):
  run = folder / "runs/line"
  records = [
    json.loads(line) for line in (run / "decode_test/decoder_out_500.jsonl").read_text().splitlines()
  ]
  assert len(records) == 1024 and set(records[0]) == {"x", "prediction"}
  assert (run / "export/500/saved_model.pb").is_file()
  assert (run / "eval_operative_config.gin").is_file()
  served = next(r.stdout for b, r in ran if "saved_model.load" in b.body)
  assert [round(float(v)) for v in re.findall(r"-?\d+\.\d+", served)] == [2, -1], served


def _check_actions(folder, ran):
  ((_, result),) = ran
  assert "New best accuracy" in result.stderr


def _check_resume(folder, ran):
  resumed, changed, warm = (r for _, r in ran)
  assert "Done at step 500" in resumed.stderr and "Restored" in resumed.stderr
  assert _last_line(resumed.stderr).endswith("Done at step 1000: runs/resumed")
  assert "Adam.learning_rate: 0.003 -> 0.0003" in changed.stderr
  loaded = warm.stdout
  assert "logits" in loaded and "hidden" in loaded, loaded


def _check_cli(folder, ran):
  assert not (folder / "runs/planned").exists()
  assert (folder / "runs/continuous/eval_test/metrics.jsonl").is_file()
  assert (folder / "runs/train/export/500/saved_model.pb").is_file()


CHECKS = {
  "README.md": _check_readme,
  "docs/own-task.md": _check_own_task,
  "docs/actions.md": _check_actions,
  "docs/resume.md": _check_resume,
  "docs/cli.md": _check_cli,
}


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_a_page_runs_as_written(page, tmp_path):
  folder = tmp_path / "user"
  folder.mkdir()
  assert REPO not in folder.parents
  ran = run_page(page, folder)
  if page in CHECKS:
    CHECKS[page](folder, ran)
