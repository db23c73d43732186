"""One error type for bad user input, raised before any compute starts."""


class ConfigError(ValueError):
  """A config field or flag has a value outside what is allowed.

  The message always names the field and the allowed values, e.g.
  ``config.model.n_heads=7 does not divide d_model=64; allowed: a divisor of d_model``.
  """
