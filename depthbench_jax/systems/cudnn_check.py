"""``python -m depthbench_jax.systems.cudnn_check``: cuDNN flash attention against the blocked
XLA attention on this device, before a bench trusts it.

For each head dim (the 400M suite's 76 -> padded 80 and 56), bf16 q, k, v of shape
[B, T, 16, hd]: the largest |difference| of ``padded_dot_product_attention(..., 'cudnn')`` and
of its q/k/v gradients from the blocked ``causal_attention`` (both in bf16, each scaled by the
reference's largest |value|), and the fwd+bwd time of each, timed interleaved
(``bench.interleaved``) with the ratio cuDNN / blocked. Prints a JSON line per head dim; exits
1 if cuDNN cannot run here or the values differ by more than bf16 allows (``--tol``), so
``benchmarks/gpu_bench.sh`` falls back to ``--attention_kernel=xla``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Sequence

import jax
import jax.numpy as jnp

from depthbench_jax.errors import OneLineParser
from depthbench_jax.model.layers import causal_attention, padded_dot_product_attention


def fwd_bwd(attend):
  """``(q, k, v) -> (out, (dq, dk, dv))`` of ``sum(out * w)`` for a fixed random ``w``."""
  def loss(q, k, v, w):
    return jnp.sum(attend(q, k, v).astype(jnp.float32) * w)

  grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
  return jax.jit(lambda q, k, v, w: (attend(q, k, v), grad(q, k, v, w)[1]))


def compare(head_dim: int, batch: int, seq_len: int, heads: int, rounds: int,
            implementation: str = "cudnn") -> dict:
  from depthbench_jax.bench import interleaved
  keys = jax.random.split(jax.random.PRNGKey(head_dim), 4)
  q, k, v = (jax.random.normal(key, (batch, seq_len, heads, head_dim), jnp.bfloat16)
             for key in keys[:3])
  w = jax.random.normal(keys[3], (batch, seq_len, heads, head_dim), jnp.float32)
  cudnn = fwd_bwd(lambda q, k, v: padded_dot_product_attention(q, k, v, implementation))
  blocked = fwd_bwd(causal_attention)
  got, ref = cudnn(q, k, v, w), blocked(q, k, v, w)
  names = ("out", "dq", "dk", "dv")
  flat = lambda r: (r[0], *r[1])
  errors = {n: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) /
                     float(jnp.max(jnp.abs(b.astype(jnp.float32)))))
            for n, a, b in zip(names, flat(got), flat(ref))}
  times = interleaved({"cudnn": lambda: jax.block_until_ready(cudnn(q, k, v, w)),
                       "blocked": lambda: jax.block_until_ready(blocked(q, k, v, w))}, rounds)
  med = {n: statistics.median(t) for n, t in times.items()}
  return {"head_dim": head_dim, "shape": [batch, seq_len, heads, head_dim],
          "max_rel_error": errors, "cudnn_ms": 1e3 * med["cudnn"],
          "blocked_ms": 1e3 * med["blocked"], "cudnn_over_blocked": med["cudnn"] / med["blocked"]}


def main(argv: Sequence[str] | None = None) -> int:
  ap = OneLineParser(prog="python -m depthbench_jax.systems.cudnn_check",
                     description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--head_dims", default="76,56")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq_len", type=int, default=2048)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--rounds", type=int, default=10)
  ap.add_argument("--implementation", default="cudnn", choices=("cudnn", "xla"),
                  help="xla: the same padded path through XLA (runs anywhere; for tests)")
  ap.add_argument("--tol", type=float, default=0.05,
                  help="largest allowed |difference| / max|reference| (bf16 has 8 bits)")
  args = ap.parse_args(argv)
  # Refused as argparse refuses (exit 2), not as a failed check: gpu_bench.sh reads any
  # failure as "cuDNN cannot run here" (a typo was a traceback, --rounds=0 an 'error' row).
  parts = [h.strip() for h in args.head_dims.split(",")]
  if not all(p.isdigit() and int(p) > 0 for p in parts):
    ap.error(f"--head_dims={args.head_dims}; allowed: positive integers, comma-separated")
  for name in ("batch", "seq_len", "heads", "rounds"):
    if getattr(args, name) < 1:
      ap.error(f"--{name}={getattr(args, name)}; allowed: an integer >= 1")
  ok = True
  for hd in map(int, parts):
    try:
      row = compare(hd, args.batch, args.seq_len, args.heads, args.rounds,
                    args.implementation)
    except Exception as e:  # noqa: BLE001 - any failure means: do not bench on cuDNN.
      print(json.dumps({"head_dim": hd, "error": f"{type(e).__name__}: {e}"[:2000]}))
      ok = False
      continue
    row["ok"] = max(row["max_rel_error"].values()) <= args.tol
    ok &= row["ok"]
    print(json.dumps(row), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
