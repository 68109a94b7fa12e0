"""The command line: `executor` (train, eval, continuous eval) and `executor report`."""
