"""The code blocks of README.md and docs/*.md, and the markers that say which of them run as tests.

A marker is an HTML comment on the line right before a fenced block (invisible on GitHub and in the site):

    <!-- test: file NAME -->        the block is written to the file NAME of the page's folder
    <!-- test: run -->              the block runs with `bash -e` in the page's folder
    <!-- test: run with ARGS -->    the same, ARGS added to each `executor` command that trains or evaluates
    <!-- test: python -->           the block runs as a Python script in the page's folder
    <!-- test: gin -->              the block, a gin fragment, is parsed against the executor's configurables
    <!-- test: by tests/NAME.py --> the named test runs the block
    <!-- untested: REASON -->       the block does not run; REASON says why

Every `python`, `sh`, `bash` and `gin` block carries a marker; `text` blocks show output and need none.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COPYABLE = ("python", "sh", "bash", "gin")
_FENCE = re.compile(
  r"^(?P<indent>[ ]*)```(?P<language>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S
)
_MARKER = re.compile(r"^\s*<!--\s*(?P<verb>test|untested):\s*(?P<what>.*?)\s*-->\s*$")
_TEST = re.compile(
  r"^(?:file (?P<file>[\w./-]+)|run(?: with (?P<args>.+))?|(?P<python>python)|(?P<gin>gin)|by (?P<by>tests/\w+\.py))$"
)


@dataclasses.dataclass(frozen=True)
class Block:
  """One fenced code block of a page, with its marker."""

  page: str  # Relative to the repository: README.md, docs/own-task.md, ...
  line: int  # Of the opening fence, 1-based.
  language: str
  body: str  # Dedented to the fence.
  verb: str | None = None  # 'test', 'untested' or None (no marker).
  what: str = ""  # What follows the verb.

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"

  @property
  def test(self) -> re.Match | None:
    """The parsed `test:` marker, or None (untested, unmarked or malformed)."""
    return _TEST.match(self.what) if self.verb == "test" else None

  @property
  def kind(self) -> str:
    """'file', 'run', 'python', 'gin' or 'by' for a block that runs as a test; '' otherwise."""
    match = self.test
    if match is None:
      return ""
    if match.group("file"):
      return "file"
    for kind in ("python", "gin", "by"):
      if match.group(kind):
        return kind
    return "run"


def pages() -> list[Path]:
  """README.md and every page of the site."""
  return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
  """The fenced blocks of `page`, in order."""
  text = page.read_text()
  lines = text.splitlines()
  out = []
  for match in _FENCE.finditer(text):
    line = text.count("\n", 0, match.start()) + 1
    indent = len(match.group("indent"))
    body = "".join(
      row[indent:] if row[:indent].isspace() else row for row in match.group("body").splitlines(True)
    )
    previous = lines[line - 2] if line >= 2 else ""
    marker = _MARKER.match(previous)
    verb, what = (marker.group("verb"), marker.group("what")) if marker else (None, "")
    out.append(Block(str(page.relative_to(REPO)), line, match.group("language"), body, verb, what))
  return out


def all_blocks() -> list[Block]:
  return [b for page in pages() for b in blocks(page)]


def marked_by(test_file: str) -> list[Block]:
  """The blocks whose marker says `test: by tests/<test_file>`."""
  return [b for b in all_blocks() if b.kind == "by" and b.test.group("by") == f"tests/{test_file}"]


def count_lines() -> list[str]:
  """One line per page: its copyable blocks that run as tests and those that do not."""
  rows = []
  for page in pages():
    copyable = [b for b in blocks(page) if b.language in COPYABLE]
    tested = sum(b.verb == "test" for b in copyable)
    rows.append(
      f"{str(page.relative_to(REPO)):24s} {tested:3d} run as tests  {len(copyable) - tested:3d} untested"
    )
  return rows
