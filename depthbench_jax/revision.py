"""Which code made a result: the git commit of this checkout, recorded by training and the bench.

A run's ``summary.json`` carries ``code``, one entry per commit its sessions ran (a run resumed
after a ``git pull`` trained under two), so a comparison across code versions can be seen.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Sequence


def code_revision() -> dict[str, Any]:
  """``{'commit': HEAD, 'dirty': uncommitted changes}`` of the checkout running.

  ``$DEPTHBENCH_COMMIT``, if set, names the commit instead: a copy of the tree on a device
  machine can carry a stale ``.git`` (seen: HEAD at the session's first commit, so "dirty").
  ``$DEPTHBENCH_DIRTY`` (anything but '' or '0') says the copy held uncommitted changes: the
  device tool copies the working tree, so a device run before a commit timed other code than
  the named commit's. Outside a git checkout (an installed wheel) both are None."""
  if os.environ.get("DEPTHBENCH_COMMIT"):
    return {"commit": os.environ["DEPTHBENCH_COMMIT"],
            "dirty": os.environ.get("DEPTHBENCH_DIRTY", "") not in ("", "0")}
  outside = {"commit": None, "dirty": None}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  git = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True,
                                  timeout=10)
  try:
    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return outside
  if head.returncode != 0:
    return outside
  return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def history(earlier: Sequence[dict], current: dict) -> list[dict]:
  """The revisions of a run's sessions, ``current`` appended unless it is the last one."""
  earlier = list(earlier or [])
  return earlier if earlier and earlier[-1] == current else earlier + [current]


def label(code: Sequence[dict] | None) -> str:
  """``'1a2b3c4d5e6f'`` for a run's last revision (``+dirty`` with uncommitted changes, ``(+N
  earlier)`` when resumed under other commits); ``''`` when unrecorded."""
  if not code:
    return ""
  last = code[-1]
  text = (last.get("commit") or "unknown")[:12] + ("+dirty" if last.get("dirty") else "")
  return text + (f" (+{len(code) - 1} earlier)" if len(code) > 1 else "")


def result_label(result: dict) -> str:
  """``label`` of a bench result's one ``code`` record; ``'unknown'`` for results from before
  the field."""
  return label([result["code"]] if result.get("code") else None) or "unknown"
