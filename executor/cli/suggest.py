"""'Did you mean ...': suggestions for a misspelt gin configurable or parameter.

Gin names what it does not know ("No configurable matching 'TrainProgam'", "Configurable 'TrainProgram' doesn't
have a parameter named 'steps_per_lop'", or, for a class that takes `**kwargs`, Python's "unexpected keyword
argument" when it is called); `with_suggestion` appends the closest known names (difflib) to such a message.
"""

from __future__ import annotations

import difflib
import inspect
import re

import gin

_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching (?:reference )?'@?([^'()]+)(?:\(\))?'")
_UNKNOWN_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'|not recognized: \{'([^']+)'")
_IN_CALL = re.compile(r"In call to configurable '([^']+)'")


def with_suggestion(message: str) -> str:
  """`message` with "Did you mean ...?" after the sentence that names an unknown configurable or parameter."""
  names, end = _suggestions(message)
  if not names:
    return message
  hint = f" Did you mean {' or '.join(repr(n) for n in names)}?"
  dot = message.find(".", end)
  at = dot + 1 if dot >= 0 else len(message)
  return message[:at] + hint + message[at:]


def _suggestions(message: str) -> tuple[list[str], int]:
  """(close names, where the sentence naming the unknown one ends)."""
  match = _UNKNOWN_PARAMETER.search(message)
  if match:
    return _close(match.group(2), parameters_of(match.group(1))), match.end()
  match = _UNKNOWN_CONFIGURABLE.search(message)
  if match:
    return _close_selector(match.group(1)), match.end()
  keyword = _UNEXPECTED_KEYWORD.search(message)
  if keyword:
    # Gin names every configurable the call went through, innermost first (a subclass passes **kwargs on).
    known = [name for call in _IN_CALL.finditer(message) for name in parameters_of(call.group(1))]
    return _close(keyword.group(1) or keyword.group(2), known), len(message)
  return [], 0


def _close(word: str, candidates) -> list[str]:
  return difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.6)


def _registry():
  return gin.config._REGISTRY  # Gin has no public listing of its configurables.


def _close_selector(selector: str) -> list[str]:
  """Registered names close to `selector` (a scope prefix `dev/` is kept as written)."""
  scope, _, name = selector.rpartition("/")
  known: dict[str, str] = {}  # Candidate spelling -> the name to suggest (the shortest unambiguous one).
  for complete, _ in _registry().items():
    minimal = _registry().minimal_selector(complete)
    for spelling in (minimal, complete, complete.rsplit(".", 1)[-1]):
      known.setdefault(spelling, minimal)
  matches = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
  found = list(dict.fromkeys(known[m] for m in matches))
  return [f"{scope}/{n}" if scope else n for n in found]


def parameters_of(selector: str) -> list[str]:
  """The parameter names the configurable `selector` accepts (for a class, those of every `__init__` in its MRO).

  A class whose `__init__` takes `**kwargs` usually passes them to its base class (a Task subclass to `Task`), so
  the bases' parameters count too.
  """
  selector = selector.rpartition("/")[2]
  configurable = _registry().get_match(selector)
  if configurable is None:
    return []
  wrapped = configurable.wrapped
  if inspect.isclass(wrapped):
    functions = [c.__init__ for c in inspect.getmro(wrapped) if "__init__" in vars(c)]
  else:
    functions = [wrapped]
  names = []
  for fn in functions:
    try:
      signature = inspect.signature(fn)
    except (TypeError, ValueError):
      continue
    names += [
      p.name
      for p in signature.parameters.values()
      if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
  return names
