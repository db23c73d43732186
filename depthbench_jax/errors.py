"""One error type for bad user input, raised before any compute starts, and the one way a CLI
reports it."""

import sys
from typing import NoReturn


class ConfigError(ValueError):
  """A config field or flag has a value outside what is allowed.

  The message always names the field and the allowed values, e.g.
  ``config.model.n_heads=7 does not divide d_model=64; allowed: a divisor of d_model``.
  """


def fail(message: str, code: int = 2) -> NoReturn:
  """Ends a CLI with one ``error: <message>`` line on stderr and exit status ``code``."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)
