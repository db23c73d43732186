"""``python -m depthbench_jax.systems.fusion_probe``: what a per-layer slice costs inside a fusion.

Inside a scanned stack every per-layer array reaches the backward loop as a dynamic slice of a
stacked one (a layer's params ``[L, ...][l]``, its saved residuals). XLA fuses such a slice into
its consumer. On XLA:CPU (jax 0.10, 2 Zen 5 cores, thirtieth session) a fused loop that reads a
dynamic slice along its innermost, vectorised axis ran 2.5-3.3x slower than the same loop over
a plain array (``gain``, ``streams``); a slice broadcast along that axis (a per-token scalar,
``scalar``) cost nothing extra (0.96-1.04x). HC's step holds two such loops: the streams'
cotangent ``dH`` (the norm gains, once the loop is XLA's rather than YNNPACK's) and the
rematerialised update ``M H + w_out y`` (``H`` and ``y`` sliced from the saved stacks). Taking
the slices out of HC's ``dH`` loops (identity-dot barriers) cut their profiled time by ~30 ms a
step but the step by only ~1% (benchmarks/README.md): a diagnostic, not yet a lever.

Each form here is timed three ways, interleaved (``bench.interleaved``): with the slice fused
(``sliced``), with it first materialised by an identity dot (``materialised``; XLA:CPU keeps a
dot as its own op), and on the layer's array passed in (``plain``: the loop alone, as when the
slice is already materialised for another consumer). Shapes are the bench's HC at 8x512
(``[B, T, n, d]`` = [8, 128, 4, 512], L = 8). Prints one JSON line per form: the medians, the
ratios sliced / plain and sliced / materialised, and the largest difference between the outputs
relative to the largest output (rounding only: the loops are compiled apart).

  gain    ``c H + sum_e P_e w_e + sum_j A_j G_j``, w = gain[l] * W   (a gain along d, sliced)
  streams ``sum_i M[:, i] H_l[i]``                                  (the stream state, sliced)
  scalar  ``H * s[l]``, s [L, B, T, n]                            (sliced, broadcast along d)
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Sequence

import jax
import jax.numpy as jnp

from depthbench_jax.errors import OneLineParser
# The stream map whose fused loops are probed, as HC's update and VJP run it.
from depthbench_jax.residual.streams import _mix

SHAPE = {"B": 8, "T": 128, "n": 4, "d": 512, "L": 8}


def materialise(x: jax.Array, block: int = 16) -> jax.Array:
  """``x`` through an identity dot (``x.reshape(-1, block) @ I``, ``block`` dividing
  ``x.size``): the same values (exact, subnormals aside: XLA:CPU's dot flushes them to zero;
  a zero's sign aside: -0 + 0 = +0), but its own op, at ``block`` multiply-adds an element."""
  eye = jnp.eye(block, dtype=x.dtype)
  flat = jax.lax.dot_general(x.reshape(-1, block), eye, (((1,), (0,)), ((), ())),
                             precision=jax.lax.Precision.HIGHEST)
  return flat.reshape(x.shape)


def _gain_form(inputs, take):
  stack, w, coef, mix, g, h = inputs
  gain = take(stack)                                                          # [d]
  w = gain[:, None] * w                                                       # [d, e]
  out = coef[..., -1:] * h
  for e in range(w.shape[1]):
    out = out + coef[..., e:e + 1] * w[:, e]
  return out + _mix(mix, g)


FORMS = {
    "gain": _gain_form,
    "streams": lambda inputs, take: _mix(inputs[1], take(inputs[0])),
    "scalar": lambda inputs, take: inputs[1] * take(inputs[0])[..., None],
}


def form_inputs(form: str, key: jax.Array) -> tuple:
  """Random inputs of ``form``; the first is the stacked array the layer index slices."""
  b, t, n, d, layers = (SHAPE[k] for k in ("B", "T", "n", "d", "L"))
  k = jax.random.split(key, 6)
  if form == "gain":
    return (jax.random.normal(k[0], (layers, d)), jax.random.normal(k[1], (d, 6)),
            jax.random.normal(k[2], (b, t, n, 7)), jax.random.normal(k[3], (b, t, n, n)),
            jax.random.normal(k[4], (b, t, n, d)), jax.random.normal(k[5], (b, t, n, d)))
  if form == "streams":
    return jax.random.normal(k[0], (layers, b, t, n, d)), jax.random.normal(k[1], (b, t, n, n))
  return (jax.random.normal(k[0], (layers, b, t, n)), jax.random.normal(k[1], (b, t, n, d)))


def probe(form: str, rounds: int) -> dict:
  from depthbench_jax.bench import interleaved
  inputs = form_inputs(form, jax.random.PRNGKey(0))
  layer = SHAPE["L"] // 2
  index = jnp.int32(layer)
  plain = (inputs[0][layer],) + inputs[1:]

  def take(stack, i, materialised: bool):
    sliced = jax.lax.dynamic_index_in_dim(stack, i, keepdims=False)
    return materialise(sliced) if materialised else sliced

  variants = {  # The index is an argument: a constant one would fold into a static slice.
      "sliced": (inputs, lambda s, i: take(s, i, False)),
      "materialised": (inputs, lambda s, i: take(s, i, True)),
      "plain": (plain, lambda s, i: s),
  }
  runs = {}
  for name, (args, taker) in variants.items():
    fn = jax.jit(lambda args, i, taker=taker: FORMS[form](args, lambda s: taker(s, i)))
    runs[name] = lambda fn=fn, args=args: jax.block_until_ready(fn(args, index))
  outputs = {name: run() for name, run in runs.items()}
  med = {name: statistics.median(t) for name, t in interleaved(runs, rounds).items()}
  scale = float(jnp.max(jnp.abs(outputs["plain"])))
  return {"form": form, "device": jax.devices()[0].device_kind,
          **{f"{name}_ms": 1e3 * seconds for name, seconds in med.items()},
          "sliced_over_plain": med["sliced"] / med["plain"],
          "sliced_over_materialised": med["sliced"] / med["materialised"],
          "max_rel_difference": max(float(jnp.max(jnp.abs(out - outputs["plain"]))) / scale
                                    for out in outputs.values())}


def main(argv: Sequence[str] | None = None) -> int:
  ap = OneLineParser(prog="python -m depthbench_jax.systems.fusion_probe",
                     description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--forms", default=",".join(FORMS),
                  help=f"comma-separated, from: {', '.join(FORMS)}")
  ap.add_argument("--rounds", type=int, default=21)
  args = ap.parse_args(argv)
  forms = [f for f in args.forms.split(",") if f]
  unknown = [f for f in forms if f not in FORMS]
  if unknown or not forms:
    ap.error(f"--forms={args.forms!r}; allowed: a comma-separated subset of {', '.join(FORMS)}")
  if args.rounds < 1:
    ap.error(f"--rounds={args.rounds}; allowed: an integer >= 1")
  for form in forms:
    print(json.dumps(probe(form, args.rounds)), flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
