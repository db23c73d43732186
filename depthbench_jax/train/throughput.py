"""Training throughput and ETA that leave out the compile, evals, diagnostics and saves.

  steps/s = (steps in the window) / (window's wall time - its pauses)
  ETA     = (steps left) x (wall time since the first step finished - one-offs) / (steps since)

The window runs from one progress line to the next. The first step after a (re)start holds
the jit compile (seconds to minutes at scale), so the clock starts when its result is ready;
the first window then measures steady steps only. Evals, diagnostics and checkpoint saves run
between windows' steps on the host and device; they are timed as pauses and taken out of the
rate, so ``perf/steps_per_s`` and ``perf/mfu`` are the training step's own. The ETA keeps them
in, at the share they had so far, since the run will pay them again, except what runs inside
``one_off`` (the first eval and the first diagnostics of a session hold their jit compiles: the
ETA jumped from 19 s to 35 s with 10 s left, at scale minutes of compile spread over every step
left would add hours). Before any steady step
is timed (a progress line on the first step: ``log_every=1``, or a resume one step before a
multiple of it) neither is known: the rate is None and the ETA inf. They once read the first
step's own time, the compile: 0.18 steps/s and an ETA of 15 min for a session of 20 s, in
metrics.jsonl and TensorBoard too.

The caller must have the device idle at ``first_step_done``, ``read`` and around ``pause``
(the loop fetches the step metrics there, which waits for every dispatched step).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator


class StepClock:
  """Steps/s over each window between progress lines, and the run's ETA (module docstring)."""

  def __init__(self, start_step: int, now: Callable[[], float] = time.monotonic):
    self._now = now
    self._started = now()
    self._steady_since: tuple[float, int] | None = None   # (time, step) after the first step
    self._window: tuple[float, int] = (self._started, start_step)
    self._paused_s = 0.0
    self._one_off_s = 0.0   # since the first step: left out of the ETA's pace
    self._seen: set[str] = set()   # kinds of work ``first_of`` has seen

  @property
  def first_step_s(self) -> float | None:
    """Wall time of the first step after the (re)start: compile + one step."""
    return None if self._steady_since is None else self._steady_since[0] - self._started

  def first_step_done(self, step: int) -> None:
    """The first step's result is ready: start the steady clock here."""
    now = self._now()
    self._steady_since = (now, step)
    self._window, self._paused_s, self._one_off_s = (now, step), 0.0, 0.0

  @contextlib.contextmanager
  def one_off(self) -> Iterator[None]:
    """Time spent inside is left out of the ETA's pace (a compile the run pays once); call it
    inside a ``pause`` to leave it out of steps/s too."""
    start = self._now()
    try:
      yield
    finally:
      self._one_off_s += self._now() - start

  def first_of(self, kind: str) -> contextlib.AbstractContextManager:
    """``one_off`` the first time ``kind`` runs in this session (it holds its jit compile), a
    no-op after."""
    if kind in self._seen:
      return contextlib.nullcontext()
    self._seen.add(kind)
    return self.one_off()

  @contextlib.contextmanager
  def pause(self) -> Iterator[None]:
    """Time spent inside is left out of the window's steps/s."""
    start = self._now()
    try:
      yield
    finally:
      self._paused_s += self._now() - start

  def read(self, step: int) -> float | None:
    """Steps/s since the last read (or the first step), pauses excluded; starts a new window.
    None when no steady step is in it (a line on the first step itself: only the compile)."""
    now = self._now()
    since, since_step = self._window
    steps, seconds = step - since_step, now - since - self._paused_s
    self._window, self._paused_s = (now, step), 0.0
    if steps <= 0:
      return None
    return steps / max(seconds, 1e-9)

  def eta_s(self, step: int, total_steps: int) -> float:
    """Seconds left at the pace since the first step, pauses included, one-offs not."""
    left = total_steps - step
    if left <= 0:
      return 0.0
    if self._steady_since is None or step <= self._steady_since[1]:
      return float("inf")   # only the compile step so far: no pace to read
    since, since_step = self._steady_since
    return left * (self._now() - since - self._one_off_s) / (step - since_step)
