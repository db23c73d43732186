"""StepClock: steps/s without the compile or the pauses; ETA with the pauses."""

import pytest

from depthbench_jax.train.throughput import StepClock


class FakeTime:
  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_rate_leaves_out_compile_and_pauses_eta_keeps_pauses():
  now = FakeTime()
  clock = StepClock(start_step=0, now=now)
  now.t += 30.0                       # step 1: 30 s of compile + run
  clock.first_step_done(1)
  assert clock.first_step_s == pytest.approx(30.0)
  now.t += 9 * 0.5                    # steps 2..10 at 0.5 s each
  with clock.pause():
    now.t += 6.0                      # an eval at step 10
  assert clock.read(10) == pytest.approx(2.0)   # 9 steps in 4.5 s of training
  # ETA: 10.5 s of wall for 9 steps since the first (the eval included), 90 steps left.
  assert clock.eta_s(10, 100) == pytest.approx(90 * 10.5 / 9)
  now.t += 10 * 0.25                  # the next window: steps 11..20, faster
  assert clock.read(20) == pytest.approx(4.0)   # the eval belonged to the last window only
  assert clock.eta_s(100, 100) == 0.0


def test_line_on_the_first_step_has_no_rate_and_no_eta_yet():
  """A resume at step 29 under log_every=10: the line at step 30 held only the compile, and
  read 1 / its time (0.18 steps/s, ETA 15 min for a 20 s session), in metrics.jsonl too."""
  now = FakeTime()
  clock = StepClock(start_step=40, now=now)   # a resumed run
  assert clock.eta_s(40, 50) == float("inf")
  now.t += 4.0
  clock.first_step_done(41)
  assert clock.read(41) is None and clock.eta_s(41, 50) == float("inf")
  now.t += 9 * 0.1
  assert clock.read(50) == pytest.approx(10.0)   # the next window: steady steps only


def test_eta_leaves_out_the_first_eval_and_diagnostics_compile():
  """The first eval and diagnostics of a session hold their jit compiles (9.8 s against ~1 s
  after): spread over the steps left, the ETA went from 19 s to 35 s with 10 s left. Within
  ``first_of`` they leave the ETA's pace; later ones count, as every pause does."""
  now = FakeTime()
  clock = StepClock(start_step=0, now=now)
  now.t += 30.0
  clock.first_step_done(1)
  now.t += 9 * 1.0                    # steps 2..10 at 1 s
  with clock.pause(), clock.first_of("diagnostics"):
    now.t += 20.0                     # the first diagnostics: compile + 1 s
  assert clock.eta_s(10, 100) == pytest.approx(90 * 9.0 / 9)
  now.t += 10 * 1.0                   # steps 11..20
  with clock.pause(), clock.first_of("diagnostics"):
    now.t += 1.0                      # the second: a pause the run pays again
  assert clock.eta_s(20, 100) == pytest.approx(80 * 20.0 / 19)
  assert clock.read(20) == pytest.approx(19 / 19.0)   # steps/s leaves both out
