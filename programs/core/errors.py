"""Errors the executor raises for bad input, with messages that name the culprit."""


class ConfigError(ValueError):
  """Bad user input: a gin file, a binding, a path, a split or a value.

  Raised before any state on disk changes. The message names the thing at
  fault; the CLI prints it without a stack trace.
  """
