"""The fusion probe (depthbench_jax/systems/fusion_probe.py): its barrier is exact, its forms
compute what they say, its flags are checked."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.systems import fusion_probe


def test_materialise_is_an_exact_identity_that_stays_its_own_op():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 32)) * 1e6
  x = x.at[0, 0, 0].set(1e-30).at[1, 2, 3].set(3e38).at[2, 0, 1].set(-0.0)
  # Bit for bit (assert_array_equal takes -0.0 for +0.0): every value but the zero's sign.
  bits = lambda a: np.asarray(a).view(np.uint32)
  differ = bits(fusion_probe.materialise(x)) != bits(x)
  assert np.argwhere(differ).tolist() == [[2, 0, 1]]   # -0.0 + 0 = +0.0, as the docstring says
  hlo = jax.jit(lambda v: fusion_probe.materialise(v) * 2.0).lower(x).compile().as_text()
  entry = hlo[hlo.index("\nENTRY"):].splitlines()
  # The dot is a top-level op of its own and the multiply a separate one that reads it.
  dots = [line for line in entry if 'op_name="jit(<lambda>)/dot_general"' in line]
  muls = [line for line in entry if 'op_name="jit(<lambda>)/mul"' in line]
  assert len(dots) == 1 and len(muls) == 1
  dot_name = dots[0].split("=")[0].strip()
  assert dot_name in muls[0].split("fusion(")[1]


def test_forms_compute_their_equations():
  layer = 3
  take = lambda stack: stack[layer]
  stack, w, coef, mix, g, h = fusion_probe.form_inputs("gain", jax.random.PRNGKey(1))
  got = fusion_probe.FORMS["gain"]((stack, w, coef, mix, g, h), take)
  wg = stack[layer][:, None] * w
  want = (coef[..., -1:] * h + jnp.einsum("btne,de->btnd", coef[..., :6], wg) +
          jnp.einsum("btji,btid->btjd", mix, g))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  stack, mix = fusion_probe.form_inputs("streams", jax.random.PRNGKey(2))
  got = fusion_probe.FORMS["streams"]((stack, mix), take)
  np.testing.assert_allclose(got, jnp.einsum("btji,btid->btjd", mix, stack[layer]),
                             rtol=1e-5, atol=1e-4)


def test_probe_prints_a_line_per_form_with_both_times_and_rounding_apart(capsys):
  assert fusion_probe.main(["--forms=scalar,streams", "--rounds=1"]) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["form"] for r in rows] == ["scalar", "streams"]
  for r in rows:
    assert r["max_rel_difference"] < 1e-6
    assert min(r["sliced_ms"], r["materialised_ms"], r["plain_ms"]) > 0
    assert r["sliced_over_materialised"] == pytest.approx(r["sliced_ms"] / r["materialised_ms"])
    assert r["sliced_over_plain"] == pytest.approx(r["sliced_ms"] / r["plain_ms"])


@pytest.mark.parametrize("argv, field", [(["--forms=gain,nope"], "--forms='gain,nope'"),
                                         (["--rounds=0"], "--rounds=0")])
def test_bad_flags_name_the_field_and_the_allowed_values(argv, field, capsys):
  with pytest.raises(SystemExit):
    fusion_probe.main(argv)
  err = capsys.readouterr().err
  assert field in err and "allowed" in err
