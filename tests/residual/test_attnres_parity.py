"""Parity with the PyPI reference ``attn-res==0.1.0`` (torch) with shared weights.

Test requirement: ``pip install --no-deps attn-res==0.1.0`` (and torch). Documented differences
(depthbench_jax/residual/attnres.py), checked here as relations:
* readout: the reference returns the *sum* of the final sources; ours aggregates them with a
  zero-init query, i.e. at init the *mean*. We feed the reference's final norm ``sum / S``.
* key norm: the reference's keys are gain-free; ours carry a learnable gain g (paper/README),
  so ours(w, g) == reference(w * g).
* RoPE layout: the reference rotates interleaved pairs (2i, 2i+1), ours LLaMA's halves
  (i, i + hd/2), with the same frequencies; permuting the q/k projection columns maps one to the
  other exactly.
* block schedule: the reference's block size is ``floor(2L / n_blocks)`` sublayers, ours the K3
  ``ceil(2L / n_blocks)`` in sublayers by default (``block_unit='layer'``: whole layers); the
  configs below pick sizes where both agree.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests import helpers

import residual_testkit as kit
from depthbench_jax.model.transformer import Transformer

torch = helpers.required("torch")
attn_res = helpers.required("attn_res")

D, HEADS, KV, FF, VOCAB = 32, 4, 2, 88, kit.VOCAB
HD = D // HEADS
# our rotate-half dim j <- reference interleaved dim PERM[j]
PERM = np.concatenate([np.arange(0, HD, 2), np.arange(1, HD, 2)])


def _t(x):
  return x.detach().numpy().astype(np.float32)


def _heads(w, n):  # torch Linear weight [n*HD, D] -> our DenseGeneral kernel [D, n, HD]
  return _t(w).T.reshape(D, n, HD)


def copy_reference_weights(ref, params, n_layers, key_gain=None):
  """Our params with every reference weight copied in (RoPE permutation on q/k)."""
  p = jax_tree_copy(params)
  p["embed"]["embedding"] = _t(ref.token_emb.weight)
  p["residual_io"]["final_norm"]["scale"] = _t(ref.out_norm.weight)
  p["residual_io"]["readout_query"] = np.zeros(D, np.float32)
  lay = p["layers"]
  for i, sub in enumerate(ref.layers):
    layer, is_mlp = divmod(i, 2)
    res = lay["residual"]
    gain = np.ones(D, np.float32) if key_gain is None else key_gain[i]
    query = _t(sub.attn_res.pseudo_query) / gain  # reference query = ours * gain
    if not is_mlp:
      res["input_layernorm"]["scale"][layer] = _t(sub.norm.weight)
      res["attn_res_query_attn"][layer], res["attn_res_key_norm_attn"][layer] = query, gain
      a = lay["self_attn"]
      a["q_proj"]["kernel"][layer] = _heads(sub.fn.w_q.weight, HEADS)[..., PERM]
      a["k_proj"]["kernel"][layer] = _heads(sub.fn.w_k.weight, KV)[..., PERM]
      a["v_proj"]["kernel"][layer] = _heads(sub.fn.w_v.weight, KV)
      a["o_proj"]["kernel"][layer] = _t(sub.fn.w_o.weight).T.reshape(HEADS, HD, D)
    else:
      res["post_attention_layernorm"]["scale"][layer] = _t(sub.norm.weight)
      res["attn_res_query_mlp"][layer], res["attn_res_key_norm_mlp"][layer] = query, gain
      m = lay["mlp"]
      m["gate_proj"]["kernel"][layer] = _t(sub.fn.w_gate.weight).T
      m["up_proj"]["kernel"][layer] = _t(sub.fn.w_up.weight).T
      m["down_proj"]["kernel"][layer] = _t(sub.fn.w_down.weight).T
  return p


def jax_tree_copy(tree):
  if isinstance(tree, dict):
    return {k: jax_tree_copy(v) for k, v in tree.items()}
  return np.array(tree, np.float32)


class MeanInsteadOfSum(torch.nn.Module):
  """The documented readout relation: our zero-query readout = reference sum / S."""

  def __init__(self, norm, n_sources):
    super().__init__()
    self.norm, self.n_sources = norm, n_sources

  def forward(self, h):
    return self.norm(h / self.n_sources)


def reference_model(mode, n_layers, n_blocks=8, seed=0):
  torch.manual_seed(seed)
  cfg = attn_res.TransformerConfig(
      d_model=D, n_layers=2 * n_layers, n_heads=HEADS, n_kv_heads=KV, vocab_size=VOCAB,
      max_seq_len=64, attn_res_mode=mode, n_blocks=n_blocks, eps=1e-6)
  ref = attn_res.AttnResTransformer(cfg).eval()
  assert cfg.d_ff == FF
  with torch.no_grad():  # non-zero pseudo-queries and norm gains: a non-trivial mixture
    for sub in ref.layers:
      sub.attn_res.pseudo_query.normal_(0.0, 1.0)
      sub.norm.weight.add_(0.1 * torch.randn(D))
    ref.out_norm.weight.add_(0.1 * torch.randn(D))
  return ref


def compare(ref, name, n_layers, n_sources, residual=None, key_gain=None):
  cfg = kit.tiny_cfg(name, n_layers=n_layers, residual=residual, n_kv_heads=KV, ffn_dim=FF,
                     tie_embeddings=True, norm_eps=1e-6)
  params = copy_reference_weights(ref, kit.init(cfg), n_layers, key_gain)
  tokens = kit.text_batch(2, 16)
  ref.out_norm = MeanInsteadOfSum(ref.out_norm, n_sources)
  with torch.no_grad():
    want = ref(torch.from_numpy(tokens).long()).numpy()
  got = np.asarray(jax.jit(Transformer(cfg).apply)({"params": params}, tokens))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_full_attnres_matches_reference():
  n_layers = 2
  ref = reference_model(attn_res.AttnResMode.FULL, n_layers)
  gain = 1 + 0.2 * np.random.RandomState(0).randn(2 * n_layers, D).astype(np.float32)
  compare(ref, "attnres_full", n_layers, n_sources=2 * n_layers + 1, key_gain=gain)


@pytest.mark.parametrize("ref_blocks,residual,n_sources", [
    (3, {"n_blocks": 3}, 4),                            # 2-sublayer blocks = 1 layer each
    (2, {"n_blocks": 2, "block_unit": "sublayer"}, 3),  # 3-sublayer blocks straddle layers
])
def test_block_attnres_matches_reference(ref_blocks, residual, n_sources):
  ref = reference_model(attn_res.AttnResMode.BLOCK, 3, n_blocks=ref_blocks, seed=1)
  compare(ref, "attnres_block", 3, n_sources=n_sources, residual=residual)


def test_readout_difference_is_real():
  """Without the sum/S relation the reference's readout differs from ours (the check can fail)."""
  ref = reference_model(attn_res.AttnResMode.FULL, 2)
  cfg = kit.tiny_cfg("attnres_full", n_layers=2, n_kv_heads=KV, ffn_dim=FF, tie_embeddings=True)
  params = copy_reference_weights(ref, kit.init(cfg), 2)
  params["residual_io"]["readout_query"] = np.full(D, 0.5, np.float32)
  tokens = kit.text_batch(2, 16)
  ref.out_norm = MeanInsteadOfSum(ref.out_norm, 5)
  with torch.no_grad():
    want = ref(torch.from_numpy(tokens).long()).numpy()
  got = np.asarray(Transformer(cfg).apply({"params": params}, tokens))
  assert not np.allclose(got, want, atol=1e-3)
