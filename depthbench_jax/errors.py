"""One error type for bad user input, raised before any compute starts, and the one way a CLI
reports it (and keeps library INFO logs off its console)."""

import argparse
import math
import numbers
import os
import sys
from typing import Callable, NoReturn


class ConfigError(ValueError):
  """A config field or flag has a value outside what is allowed.

  The message always names the field and the allowed values, e.g.
  ``config.model.n_heads=7 does not divide d_model=64; allowed: a divisor of d_model``.
  """


class HostsDiffer(ConfigError):
  """The processes of one run were given other runs (hosts out of step, ``main.check_same_run``),
  do not share its results dir (``main.check_results_shared``) or read other train data
  (``config_check.check_same_data``). main.py exits ``HOSTS_DIFFER`` on it: the sweep stops
  there, since every later run would fail alike."""


HOSTS_DIFFER = 4


def is_positive_number(x) -> bool:
  """A finite real > 0, not a bool (True is 1): an LR, a parameter target, a gain. A string
  ('1e-3') and inf (KEEL's alpha made every logit NaN) are not."""
  return isinstance(x, numbers.Real) and not isinstance(x, bool) and 0 < x < math.inf


def fail(message: str, code: int = 2) -> NoReturn:
  """Ends a CLI with one ``error: <message>`` line on stderr and exit status ``code``."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
  """``argparse.ArgumentParser`` whose refusals (a bad type, a choice not offered, a value the
  CLI checks itself via ``error``) are ``fail``'s one ``error:`` line, exit 2, like every other
  CLI here: argparse printed its usage block first (``--help`` still prints it). A flag is
  spelled whole: argparse took ``--results`` for ``--results_dir`` and ``--dry`` for
  ``--dry_run``, which run_sweep.sh reads itself, so a 'dry run' wrote the report and a
  relative results dir landed in the repo."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("allow_abbrev", False)
    super().__init__(*args, **kwargs)

  def error(self, message: str) -> NoReturn:
    """``message``, with the usage as what is allowed where argparse names none (an
    unrecognized or missing argument; a bad choice lists its own)."""
    if "allowed" not in message and "choose from" not in message:
      message += f"; allowed: {' '.join(self.format_usage().split()[1:])}"
    fail(message)


def quiet_logs() -> None:
  """Unless ``DEPTHBENCH_VERBOSE`` is set (to anything but '' or '0'): absl logs at WARNING
  (orbax logs every save and restore at INFO, a screenful per checkpoint read) and TensorFlow's
  oneDNN ops off (clu's writers import TensorFlow, which computes nothing here but says at INFO,
  past TF_CPP_MIN_LOG_LEVEL, that they are on; off, it says nothing). Call before TF is
  imported."""
  if os.environ.get("DEPTHBENCH_VERBOSE", "") not in ("", "0"):
    return
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def flag_error_line(err: Exception, usage: str) -> str:
  """The first line of a flag-parsing failure (absl names the flag: ``flag --x=v: ...``), with
  ``usage`` as what is allowed unless the line already says."""
  text = str(err).strip()
  line = text.splitlines()[0] if text else type(err).__name__
  return line if "allowed" in line else f"{line}; allowed: {usage}"


def refuse_arguments(rest: list, usage: str) -> list:
  """``rest`` (absl's leftovers: the program, then anything not a flag) if it holds the program
  alone, else one ``fail`` line naming the rest. They were dropped without a word: an unquoted
  glob after ``--path`` (``--path /data/*.parquet``) tokenized the first file alone, and
  ``diagnose --workdir results/x/*/`` diagnosed the first run alone, each exiting 0."""
  if len(rest) > 1:
    shown = ", ".join(repr(a) for a in rest[1:4]) + (", ..." if len(rest) > 4 else "")
    fail(f"unexpected argument{'s' if len(rest) > 2 else ''} {shown}: not a flag; allowed: "
         f"{usage} (quote a glob, e.g. --path='/data/*.parquet', or loop over the folders)")
  return rest


def absl_flags_parser(usage: str) -> Callable[[list], list]:
  """An ``app.run(main, flags_parser=...)``: an unknown, mistyped, out-of-range or missing flag
  is one ``fail`` line naming it (absl's own is a FATAL line and exit 1), and so is an
  argument that is no flag (``refuse_arguments``)."""

  def parse(argv: list) -> list:
    from absl import flags  # pylint: disable=g-import-not-at-top
    try:
      rest = flags.FLAGS(argv)
    except flags.Error as err:
      fail(flag_error_line(err, usage))
    return refuse_arguments(rest, usage)

  return parse
