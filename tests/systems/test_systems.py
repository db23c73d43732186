"""Systems cost: analytic FLOPs against XLA's count, KV/state bytes, the paper's figures, the CLI,
the report section and the bench in its quick mode (no thresholds asserted: those live in the
bench's printed verdict)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import subprocess
import time

import jax
import ml_collections
import numpy as np
import pytest

from depthbench_jax.model.config import model_config_from
from depthbench_jax.residual import registry
from depthbench_jax.residual.base import static_prefix
from depthbench_jax.systems import costs, design_costs, flops, xla
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def model_cfg(design="preln", n_layers=2, d_model=64, n_heads=4, vocab=64, seq=64,
              n_kv_heads=None, **res):
  from configs import base
  from depthbench_jax.residual import registry
  m = base.get_config().model
  m.vocab_size, m.n_layers, m.d_model, m.n_heads = vocab, n_layers, d_model, n_heads
  m.n_kv_heads = n_kv_heads
  m.max_seq_len = seq
  m.residual = ml_collections.ConfigDict({**registry.get(design).defaults, "name": design, **res})
  return model_config_from(m)


def paper_shape(shape):
  from depthbench_jax import sweep
  module = sweep.load_config_module(os.path.join(ROOT, "configs", "suite_400m.py"))
  return model_config_from(module.get_config(f"arch=preln,shape={shape}").model)


@functools.lru_cache(maxsize=None)
def _tiny_prefill(design, kernel="xla", n_kv_heads=None):
  """XLA's prefill analysis and the analytic as-computed FLOPs of a tiny model at T=256."""
  cfg = dataclasses.replace(model_cfg(design, n_layers=3, d_model=64, vocab=256, seq=256,
                                      n_kv_heads=n_kv_heads), attention_kernel=kernel)
  return xla.prefill_analysis(cfg, 256, dtype="float32"), flops.prefill_flops(cfg, 256,
                                                                              causal=False)


@pytest.mark.parametrize("design,kernel,kv", [
    ("preln", "xla", None), ("hc", "xla", None), ("attnres_full", "xla", None),
    ("moda", "xla", None), ("preln", "fused", None),    # off-GPU 'fused' is blocked
    ("preln", "xla", 2)])   # GQA (the 1.6B layout): the T^2 term has every query head
def test_analytic_flops_match_xla_on_a_tiny_model(design, kernel, kv):
  # Small vocab and d so the design terms and the T^2 term are a visible share of the total:
  # at T=256 the blocked attention computes 9/16 of the T x T, and "as computed" vs the whole
  # T x T differ by ~20% of the total, so the 5% below tells them apart (and the T^2 term
  # counted over the KV heads alone, ~12%).
  out, analytic = _tiny_prefill(design, kernel, kv)   # analytic: the attention as computed
  assert out["xla_flops"] == pytest.approx(analytic, rel=0.05)
  # cost_analysis counts the scanned body once; the correction restores L - 1 layers.
  assert out["xla_flops_scanned"] < out["xla_flops"]
  assert out["peak_bytes"] > out["argument_bytes"] > 0


@pytest.mark.parametrize("design", ["hc", "mhc", "attnres_full", "attnres_block", "moda"])
def test_a_designs_analytic_terms_match_what_xla_counts_beyond_pre_ln(design):
  """The whole-model match above has ~1% headroom under its 5% (XLA counts ~4% of elementwise
  work besides), so a design term doubled passed it. The design's excess over Pre-LN, XLA's
  over analytic, isolates the design terms: measured 1.03 (mHC) to 1.10 (MoDA). mHC's and Block
  AttnRes's rules were otherwise checked only against hand values copied from their comments."""
  (pre_xla, pre_an), (out, analytic) = _tiny_prefill("preln"), _tiny_prefill(design)
  assert 0.9 < (out["xla_flops"] - pre_xla["xla_flops"]) / (analytic - pre_an) < 1.15


def test_xla_counts_a_depth_buffers_converts_and_its_slot_loops_once_as_the_caveat_says():
  """table.CONVENTION and xla.py say XLA's count is no check on a depth-reading design's term:
  bf16 counts each slot's convert (about 2x the term), fp32 counts the slot loops once (below
  the term as slots grow). Measured here per layer beyond Pre-LN, so the caveat is dropped the
  day XLA counts otherwise."""
  def excess_over_term(dtype, n_layers):
    per_layer = {}
    for design in ("preln", "attnres_full"):
      c = helpers.tiny_config(**{"model.residual.name": design, "model.n_layers": n_layers,
                                 "model.d_model": 128, "model.n_heads": 4,
                                 "model.max_seq_len": 256})
      cfg = xla.inference_config(model_config_from(c.model), dtype)
      per_layer[design] = xla._block_flops(cfg, xla.abstract_inference_params(cfg), 1, 256)
    term = 2 * (2 * n_layers + 1) * 4 * 128 * 256   # design_costs' computed depth reads
    return (per_layer["attnres_full"] - per_layer["preln"]) / term
  assert excess_over_term("bfloat16", 6) > 1.5
  assert 0.9 < excess_over_term("float32", 6) < 1.15
  assert excess_over_term("float32", 16) < 0.6


@pytest.mark.parametrize("design", ["preln", "attnres_full", "moda"])
def test_scan_body_correction_equals_an_unrolled_compile(design):
  """The scanned count, corrected, equals an unrolled compile's but for the masked depth reads:
  the unrolled loop knows each layer's index, so Full AttnRes and MoDA read there only the
  slots written so far, rounded up to 8 (``base.static_prefix``), while a scanned layer reads
  its whole buffer (``design_costs``' computed count). Full AttnRes's read is all contractions
  and multiply-adds (4 d FLOPs a slot), so the difference is exactly the slots skipped; MoDA
  skips those contractions and the masked slots' elementwise softmax work, which XLA counts
  and the convention leaves out."""
  cfg = model_cfg(design, n_layers=6)  # Full AttnRes and MoDA: the state grows with L
  t, sublayers = 32, 2 * cfg.n_layers
  scanned = xla.prefill_analysis(cfg, t, dtype="float32")["xla_flops"]
  unrolled = xla.prefill_analysis(dataclasses.replace(cfg, scan_layers=False), t,
                                  dtype="float32")["xla_flops"]
  tolerance = 0.002 * unrolled
  if design == "preln":
    assert abs(scanned - unrolled) <= tolerance
  elif design == "attnres_full":
    slots = sublayers + 1
    skipped = sum(slots - static_prefix(k + 1, slots) for k in range(sublayers))
    assert skipped > 0 and 4 * cfg.d_model * t * skipped > 5 * tolerance
    assert abs(scanned - unrolled - 4 * cfg.d_model * t * skipped) <= tolerance
  else:
    skipped = sum(sublayers - static_prefix(2 * l, sublayers) for l in range(cfg.n_layers))
    assert scanned - unrolled > 4 * cfg.d_model * t * skipped > 0


def test_causal_and_computed_attention_terms():
  cfg = model_cfg("preln", n_layers=4, d_model=64)
  t = 128                      # 4 query blocks of 32: 5/8 of the 4 L T^2 d of the whole T x T
  whole = 4 * cfg.n_layers * t * t * cfg.d_model
  computed, causal = flops.prefill_flops(cfg, t, causal=False), flops.prefill_flops(cfg, t)
  assert computed - causal == pytest.approx(whole * (5 / 8 - 1 / 2))
  moda = model_cfg("moda", n_layers=4, d_model=64)
  assert flops.computed_attention_share(moda, t) == 5 / 8   # MoDA's sequence part, blocked
  assert flops.train_flops_per_token(cfg, t) == pytest.approx(3 * causal / t)


def test_design_terms():
  pre, hc = model_cfg("preln"), model_cfg("hc", n_streams=4)
  n, d, L = 4, hc.d_model, hc.n_layers
  assert flops.design_flops_per_token(pre) == 0
  assert flops.design_flops_per_token(hc) == 2 * L * (2 * n * d * (n + 2) + 4 * n * d +
                                                      2 * n * n * d)
  full = model_cfg("attnres_full")
  causal = design_costs.extra_flops_per_token(full, causal=True)
  buffer = design_costs.extra_flops_per_token(full, causal=False)
  s = 2 * L + 1
  assert causal == 4 * d * (L * (2 * L + 1) + s) and buffer == 4 * d * (2 * L * s + s)
  moda = model_cfg("moda")
  assert flops.matmul_params(moda) - flops.matmul_params(pre) == L * 2 * d * d
  hd4 = 4 * moda.n_heads * moda.head_dim
  # L = 2: layer 1 reads layer 0's attention and FFN slots (2), or only its attention slot.
  assert design_costs.extra_flops_per_token(moda, causal=True) == hd4 * 2
  attention_only = model_cfg("moda", ffn_kv=False)
  assert flops.matmul_params(attention_only) == flops.matmul_params(pre)
  assert design_costs.extra_flops_per_token(attention_only, causal=True) == hd4 * 1
  assert design_costs.extra_flops_per_token(attention_only, causal=False) == hd4 * 2 * L * L


def test_design_terms_of_mhc_block_attnres_and_moda_by_hand():
  d, L, n = 64, 2, 4
  mhc = model_cfg("mhc", n_streams=n)
  # Per sublayer: phi on the flattened streams 2nd(n^2 + 2n), read 2nd, mix 2n^2 d, write 2nd.
  per_sublayer = 2 * n * d * (n * n + 2 * n) + 2 * n * d + 2 * n * n * d + 2 * n * d
  assert per_sublayer == 15360
  assert flops.design_flops_per_token(mhc) == 2 * L * per_sublayer
  # Block AttnRes, 2 blocks of 2 sublayers, slots b_0, b_1, b_2: sublayers read 1, 2, 2, 3
  # sources (causal) or all 3 (buffer); the readout reads 3. 4d per source read.
  block = model_cfg("attnres_block", n_blocks=2, block_unit="sublayer")
  assert design_costs.extra_flops_per_token(block, causal=True) == 4 * d * (8 + 3)
  assert design_costs.extra_flops_per_token(block, causal=False) == 4 * d * (12 + 3)
  # MoDA at 3 layers: layers 0, 1, 2 read 0, 2, 4 depth slots, 4 H hd = 4d FLOPs each.
  moda = model_cfg("moda", n_layers=3)
  assert design_costs.extra_flops_per_token(moda, causal=True) == 4 * d * 6


def test_a_new_design_declares_its_costs_on_its_registry_entry(monkeypatch):
  """flops.py reads a design's own ``Design.extra_matmul_params`` / ``extra_flops_per_token``,
  as its docstring says; Design had no such fields, so an eleventh design with a projection of
  its own could not declare it and its FLOPs, MFU and device-hours left it out."""
  from depthbench_jax.residual import preln, registry
  from depthbench_jax.residual.base import Design
  gated = Design(name="gated", layer=preln.PreLN, check=preln.DESIGN.check,
                 extra_matmul_params=lambda cfg: 2 * cfg.n_layers * cfg.d_model,
                 extra_flops_per_token=lambda cfg, causal: (5.0 if causal else 9.0) * cfg.d_model)
  monkeypatch.setitem(registry._MODULES, "gated", "unused")
  monkeypatch.setitem(registry._cache, "gated", gated)
  pre, new = model_cfg("preln"), model_cfg("gated")
  assert flops.matmul_params(new) - flops.matmul_params(pre) == 2 * new.n_layers * new.d_model
  assert flops.design_flops_per_token(new) == 5.0 * new.d_model
  assert flops.design_flops_per_token(new, causal=False) == 9.0 * new.d_model  # as computed
  assert flops.forward_flops_per_token(new, 64) - flops.forward_flops_per_token(pre, 64) == (
      4 * new.n_layers * new.d_model + 5 * new.d_model)


def test_matmul_params_follow_gqa():
  """Every parameter but the input table and the norm gains takes part in a matmul, with K < H
  KV heads too (the 1.6B Qwen3 layout): the count must match the model's own."""
  from depthbench_jax.model.transformer import count_params
  cfg = dataclasses.replace(model_cfg("preln", n_layers=3, d_model=64, n_heads=4), n_kv_heads=2)
  gains = (2 * cfg.n_layers + 1) * cfg.d_model
  assert flops.matmul_params(cfg) == (count_params(cfg)["total"] - cfg.vocab_size * cfg.d_model
                                      - gains)


@pytest.mark.parametrize("design", registry.names())
def test_matmul_params_are_the_models_own_kernels_for_every_design(design):
  """The analytic count (backbone + the design's ``extra_matmul_params``: MoDA's FFN depth-KV
  projections) against the ``kernel`` leaves the model really holds, plus the tied head (the
  input table, multiplied again): only Pre-LN with GQA was compared, the designs' terms with
  hand formulas alone. The designs' small dynamic weights (HC's W_alpha, mHC's phi) are FLOPs
  of their own (``design_flops_per_token``), no kernels."""
  import flax.linen as nn
  from depthbench_jax.model.transformer import abstract_params
  for tie in (False, True):
    cfg = dataclasses.replace(model_cfg(design, n_layers=3, d_model=64, n_heads=4),
                              n_kv_heads=2, tie_embeddings=tie)
    leaves = jax.tree_util.tree_leaves_with_path(nn.unbox(abstract_params(cfg)))
    kernels = sum(int(np.prod(a.shape)) for path, a in leaves
                  if getattr(path[-1], "key", None) == "kernel")
    assert flops.matmul_params(cfg) == kernels + tie * cfg.vocab_size * cfg.d_model, design


def test_device_hours_by_hand():
  # 3.6e18 FLOPs at 1e15 FLOP/s and MFU 0.5: 7200 s.
  assert costs.device_hours(3.6e18, 1e15, 0.5) == pytest.approx(2.0)


def test_kv_cache_and_state_bytes():
  for shape, per_token in (("16x1216", 38_912), ("70x640", 89_600)):
    cfg = paper_shape(shape)
    assert costs.kv_cache_elements_per_token(cfg) == per_token
    assert costs.kv_cache_bytes(cfg, 4096) == per_token * 4096 * 2  # bf16
    assert costs.kv_cache_bytes(cfg, 4096, batch=3, dtype="float32") == per_token * 4096 * 12
  gqa = dataclasses.replace(model_cfg("preln", n_layers=2, d_model=64, n_heads=4), n_kv_heads=2)
  assert costs.kv_cache_bytes(gqa, 10) == 2 * 2 * 2 * 16 * 10 * 2
  # The formula is the cache the decoder allocates (it was compared with copies of itself: a
  # cache of every query head's K/V, or fp32 under bf16 compute, read as the formula's bytes).
  from depthbench_jax.model import decode
  bf16 = dataclasses.replace(gqa, dtype="bfloat16")
  leaves = jax.tree_util.tree_flatten_with_path(jax.eval_shape(
      lambda: decode.init_cache(bf16, 3, 10)))[0]
  kv = [x for path, x in leaves if jax.tree_util.keystr(path).endswith(("_key']", "_value']"))]
  assert len(kv) == 2 and sum(x.size * x.dtype.itemsize for x in kv) == costs.kv_cache_bytes(
      bf16, 10, batch=3, dtype="bfloat16")
  t, d, L = 16, 64, 2
  assert costs.residual_state_bytes(model_cfg("preln"), t) == t * d * 2
  assert costs.residual_state_bytes(model_cfg("hc"), t) == 4 * t * d * 2
  # Full AttnRes: 2L+1 bf16 slots, their fp32 inverse RMS per token, fp32 presence per slot and
  # the int32 slot index (a lower bound let an fp32 buffer, twice the bytes, pass).
  slots = 2 * L + 1
  assert costs.residual_state_bytes(model_cfg("attnres_full"), t) == (
      slots * t * d * 2 + slots * t * 4 + slots * 4 + 4)
  # The fp32-stream control carries its state in fp32 (it was counted at the compute dtype).
  fp32_stream = dataclasses.replace(model_cfg("hc"), stream_dtype="float32")
  assert costs.residual_state_bytes(fp32_stream, t) == 4 * t * d * 4


def test_paper_figures_at_4096():
  shallow, deep = paper_shape("16x1216"), paper_shape("70x640")
  assert flops.paper_prefill_flops(shallow, 4096) / 1e12 == pytest.approx(2.98, abs=0.01)
  assert flops.paper_prefill_flops(deep, 4096) / 1e12 == pytest.approx(4.32, abs=0.01)
  assert costs.kv_cache_bytes(deep, 4096) / costs.kv_cache_bytes(shallow, 4096) > 2


def test_cli_and_report_section(tmp_path, capsys):
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems import __main__ as cli
  from depthbench_jax.systems.report_section import systems_table
  out = tmp_path / "sys"
  assert cli.main(["--config", os.path.join(ROOT, "configs", "smoke.py"), "--seq_len", "64",
                   "--designs", "preln,hc", "--shapes", "4x128", "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "| preln | 4x128 |" in text and "| hc | 4x128 |" in text and "causal" in text
  data = json.loads((out / "systems.json").read_text())
  assert {r["design"] for r in data["rows"]} == {"preln", "hc"}
  assert all(r["xla_flops"] > 0 and r["peak_bytes"] > 0 for r in data["rows"])
  assert {r["seq_len"] for r in data["curve"]} == {2048 * 2 ** i for i in range(7)}
  assert (out / "context_curve.png").stat().st_size > 1000
  # What compiled the XLA columns (they move with jax/XLA): the file said nothing of it.
  assert data["made_by"]["jax"] == jax.__version__ and data["made_by"]["backend"] == "cpu"
  assert f"XLA columns compiled by jax {jax.__version__} (cpu) at code" in (
      out / "systems.md").read_text()
  records = scorecard.collect_runs(os.path.join(ROOT, "tests", "fixtures", "results_small"))
  section = systems_table(records)
  assert "| preln | 16x1216 |" in section and "device-h" in section
  assert "hc 16x1216 2h00m" in section   # two LRs of 3600 s each, summed
  # Runs that record their device-hours (wall time x devices): summed beside the wall time;
  # the fixtures' summaries predate the field, so they show wall time alone.
  assert "device-hours (" not in section
  for r in records:
    r.update(device_hours=8.0, device_kind="NVIDIA H200")
  # A diverged run's time stops at its divergence: each sum says how many runs are such.
  section = systems_table(records)
  assert "hc 16x1216 2h00m = 16 device-hours (NVIDIA H200) over 2 runs, 1 stopped at" in section
  assert "hc 24x1024 2h00m = 16 device-hours (NVIDIA H200) over 2 runs, hc" in section
  assert "attnres_block 16x1216 1h00m = 8 device-hours (NVIDIA H200) over 1 run," in section


def test_cli_default_out_is_the_sweeps_results_dir(tmp_path, monkeypatch):
  """Without --out the table lands beside the sweep's runs, one level above each workdir: where
  the report's systems section looks for ``systems.json``."""
  from depthbench_jax import sweep
  from depthbench_jax.systems import __main__ as cli
  config = os.path.join(ROOT, "configs", "smoke.py")
  monkeypatch.chdir(tmp_path)
  assert cli.main(["--config", config, "--designs", "preln", "--shapes", "4x128",
                   "--xla", "false"]) == 0
  run_dir = sweep.list_runs(config)[0].workdir
  assert (tmp_path / os.path.dirname(run_dir) / "systems.json").exists()


def test_cli_flags_reach_every_row_and_bad_input_keeps_the_last_result(tmp_path, capsys):
  """--mfu, --peak_flops and --dtype reach each row, training FLOPs read the suite's own
  sequence length, --xla=false compiles nothing, the curve is Pre-LN's whatever the order of
  --designs; a bad --designs is one error naming the allowed designs, exit 2, files kept."""
  from depthbench_jax.systems import __main__ as cli
  out = tmp_path / "sys"
  argv = ["--config", os.path.join(ROOT, "configs", "smoke.py"), "--seq_len", "64",
          "--shapes", "4x128", "--xla", "false", "--out", str(out)]
  assert cli.main(argv + ["--designs", "hc,preln", "--mfu", "0.25", "--peak_flops", "2e15",
                          "--dtype", "float32"]) == 0
  data = json.loads((out / "systems.json").read_text())
  for row in data["rows"]:
    assert (row["mfu"], row["peak_flops"], row["dtype"]) == (0.25, 2e15, "float32")
    assert row["param_bytes"] == 4 * row["params_total"] and "xla_flops" not in row
    assert row["train_seq_len"] == 128   # configs/smoke.py's data.seq_len, not --seq_len
    # Its 120 steps x 8 x 128 tokens, as the dry run and the report cost it: the table gave
    # 20 tokens per parameter, 150x.
    assert (row["train_tokens"], row["train_tokens_from"]) == (120 * 8 * 128, "steps")
  assert data["curve_design"] == "preln"
  assert "XLA columns compiled by" not in (out / "systems.md").read_text()   # none compiled
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  capsys.readouterr()
  assert cli.main(argv + ["--designs", "nope"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  from depthbench_jax.residual import registry   # every registered design, an eleventh too
  assert err == [f"error: --designs: unknown ['nope']; allowed: {', '.join(registry.names())}"]
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_cli_keeps_a_table_of_other_options_unless_overwrite(tmp_path, capsys):
  """A one-shape check (or --xla=false, another --mfu, a rerun without the table's --measured)
  into the sweep's results dir silently replaced the suite's systems.json, which the report then
  merged for that shape only; now it is one error naming what differs, before any compile, the
  file kept; the same options or --overwrite replace it."""
  from depthbench_jax.systems import __main__ as cli
  from tests.systems.test_measured import bench_json
  out = tmp_path / "sys"
  argv = ["--config", os.path.join(ROOT, "configs", "smoke.py"), "--seq_len", "64",
          "--shapes", "4x128,8x96", "--xla", "false", "--out", str(out)]
  assert cli.main(argv[:-5] + ["4X128,8x96,04x128"] + argv[-4:] + ["--designs", "preln,hc"]) == 0
  full = (out / "systems.json").read_text()
  # One spelling of a shape: no second row of it, and the usual spelling reruns the same options.
  assert json.loads(full)["options"]["shapes"] == ["4x128", "8x96"]
  assert len(json.loads(full)["rows"]) == 4
  capsys.readouterr()
  for narrower in (["--designs", "preln,hc", "--shapes", "4x128"], ["--designs", "preln"],
                   ["--designs", "preln,hc", "--mfu", "0.3"],
                   ["--designs", "preln,hc", "--measured",
                    bench_json(tmp_path / "results-x.json", [("preln", 1e6, 100.0, 1.0)])],
                   ["--designs", "preln,hc", "--xla", "true"]):
    assert cli.main(argv + narrower) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --") and "--overwrite" in err[0], err
    assert (out / "systems.json").read_text() == full
  assert "--xla=true" in err[0] and "xla=false" in err[0]
  assert cli.main(argv + ["--designs", "preln,hc"]) == 0   # the same options: a rerun replaces
  assert cli.main(argv + ["--designs", "preln", "--overwrite"]) == 0
  assert {r["design"] for r in json.loads((out / "systems.json").read_text())["rows"]} == {
      "preln"}


def test_default_shapes_are_every_shape_the_sweep_trains():
  """Without --shapes the table covered only a suite's first shape set: suite_multiscale's 200M
  shapes, while its sweep (and so its report) also trains the 300M and 500M ones."""
  from depthbench_jax import sweep
  from depthbench_jax.systems import __main__ as cli
  suite = os.path.join(ROOT, "configs", "suite_multiscale.py")
  _, entries = cli.suite_configs(suite, ["preln"])
  want = list(dict.fromkeys(str(run.shape) for run in sweep.list_runs(suite)))
  assert [shape for _, shape, _ in entries] == want and len(want) == 9
  module = sweep.load_config_module(suite)
  assert want == [s for shape_set in module.SHAPE_SETS.values() for s in shape_set.shapes]


def test_cli_table_names_the_batch_and_dtype_of_its_bytes_and_peak(tmp_path):
  """--batch=2 --dtype=float32 once wrote a table that said 'batch 1' and 'bf16' over a peak
  column compiled for two fp32 sequences; the header now names the batch and dtype."""
  from depthbench_jax.systems import __main__ as cli
  out = tmp_path / "sys"
  assert cli.main(["--config", os.path.join(ROOT, "configs", "smoke.py"), "--seq_len", "64",
                   "--designs", "preln", "--shapes", "4x128", "--batch", "2",
                   "--dtype", "float32", "--out", str(out)]) == 0
  text = (out / "systems.md").read_text()
  assert "batch 1" not in text and "bf16" not in text
  assert "Prefill at T=64, batch 2, float32 (peak memory compiled by XLA:CPU);" in text
  row = json.loads((out / "systems.json").read_text())["rows"][0]
  assert (row["batch"], row["dtype"]) == (2, "float32")


@pytest.mark.parametrize("flag, value, allowed", [
    ("--mfu", "0", "a fraction in (0, 1]"), ("--mfu", "1.5", "a fraction in (0, 1]"),
    ("--peak_flops", "0", "FLOP/s per device, >= 1e+09 (an H100's bf16 dense peak is 989e12)"),
    # The peak in TFLOP/s: 6.9e15 device-hours, exit 0.
    ("--peak_flops", "989", "FLOP/s per device, >= 1e+09 (an H100's bf16 dense peak is 989e12)"),
    ("--seq_len", "0", "an integer >= 1"),
    ("--batch", "0", "an integer >= 1")])
def test_cli_bad_number_is_one_error_and_keeps_the_last_result(tmp_path, capsys, flag, value,
                                                               allowed):
  """A zero MFU or peak (once a ZeroDivisionError traceback), an MFU over 1 or an empty sequence
  or batch (once a table of nonsense written over the last one): one error line naming the flag
  and what is allowed, exit 2, the earlier files untouched."""
  from depthbench_jax.systems import __main__ as cli
  out = tmp_path / "sys"
  out.mkdir()
  (out / "systems.json").write_text("previous result")
  argv = ["--config", os.path.join(ROOT, "configs", "smoke.py"), "--designs", "preln",
          "--shapes", "4x128", "--xla", "false", "--out", str(out), flag, value]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: {flag}={float(value) if flag in ('--mfu', '--peak_flops') else value}; "
                 f"allowed: {allowed}"]
  assert [p.name for p in out.iterdir()] == ["systems.json"]
  assert (out / "systems.json").read_text() == "previous result"


def test_cli_out_that_is_a_file_is_one_error_before_any_compile(tmp_path, capsys):
  """--out=an existing systems.json (systems takes a folder) printed every row, then a
  FileExistsError traceback; a folder under a file alike."""
  from depthbench_jax.systems import __main__ as cli
  afile = tmp_path / "systems.json"
  afile.write_text("previous result")
  for out in (afile, afile / "sub"):
    argv = ["--config", os.path.join(ROOT, "configs", "smoke.py"), "--designs", "preln",
            "--shapes", "4x128", "--xla", "false", "--out", str(out)]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        f"error: --out={out}: {afile} is a file; allowed: a folder there (made if missing)"]
    assert "preln" not in captured.out
  assert afile.read_text() == "previous result"
  # An empty --out= (an unset variable): it wrote into results/<suite>/, which the report reads.
  argv = ["--config", os.path.join(ROOT, "configs", "smoke.py"), "--designs", "preln",
          "--shapes", "4x128", "--xla", "false", "--out="]
  assert cli.main(argv) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "error: --out=: empty; allowed: a folder path (made if missing)"]


def test_systems_table_budgets_every_design_like_the_trainer():
  # suite_400m budgets N = Pre-LN's at the shape (config.budget_design): MoDA's row has more
  # parameters but the tokens (and so the device-hours per FLOP) of Pre-LN's row; the trainer's
  # step count gives the same tokens.
  from depthbench_jax.systems import __main__ as cli
  from depthbench_jax.train.loop import total_steps_of
  suite = os.path.join(ROOT, "configs", "suite_400m.py")
  result = cli.build(suite, 4096, designs=["preln", "moda"], shapes=["16x1216"], with_xla=False,
                     log=lambda s: None)
  pre, moda = sorted(result["rows"], key=lambda r: r["design"] != "preln")
  assert moda["params_total"] > 1.1 * pre["params_total"]
  assert moda["train_tokens"] == pre["train_tokens"] == 20.0 * pre["params_total"]
  config = cli.suite_configs(suite, ["moda"], ["16x1216"])[1][0][2]
  steps = total_steps_of(config, moda["params_total"])
  per_step = config.data.global_batch_size * config.data.seq_len
  assert (steps - 1) * per_step < moda["train_tokens"] <= steps * per_step


def test_report_section_reads_a_runs_budget_design():
  from depthbench_jax.systems import report_section
  record = lambda budget: {"design": "moda", "n_layers": 2, "d_model": 64, "config": {
      "model": {"residual": {"name": "moda"}}, "budget_design": budget}}
  preln = report_section.run_model_config({**record(""), "design": "preln", "config": {}})
  from depthbench_jax.model.transformer import count_params
  assert report_section._budget_params(record("preln")) == count_params(preln)["total"]
  assert report_section._budget_params(record("")) is None


def test_report_section_rows_keep_a_design_variant_apart():
  """A 2-stream HC run beside the suite's: the report grouped it under its label, yet the row
  read 'hc' (two 'hc 4x128' rows) and the depth summary took it for HC's deepest shape."""
  from configs import smoke
  from depthbench_jax import sweep
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems import report_section
  def record(name, **residual):
    config = smoke.get_config(f"arch=hc,shape={name},lr=1e-3").to_dict()
    config["model"]["residual"].update(residual)
    summary = {"design": "hc", "n_layers": int(name.split("x")[0]),
               "d_model": int(name.split("x")[1]), "config": config}
    return dict(summary, design=sweep.design_label(summary))
  records = [record("4x128"), record("8x96"), record("8x96", n_streams=2)]
  scorecard.assign_families(records)
  text = report_section.systems_table(records)
  rows = [l.split(" | ")[:2] for l in text.splitlines() if l.startswith("| hc")]
  assert rows == [["| hc", "4x128"], ["| hc", "8x96"], ["| hc(n_streams=2)", "8x96"],
                  ["| hc", "4x128 -> 8x96"]], rows   # HC's depth summary: its own two shapes


def test_report_section_rows_read_each_runs_recipe_and_the_nearest_systems_json(
    tmp_path, monkeypatch):
  """Rows sorted by depth as a number, from the run's own data.seq_len, tokens_per_param and
  budget design; XLA FLOPs and peak bytes merged from the nearest 4096-token systems.json."""
  from depthbench_jax.model.transformer import count_params
  from depthbench_jax.systems import report_section, table
  model = {"vocab_size": 64, "n_heads": 4, "max_seq_len": 128,
           "residual": {"name": "moda"}}
  config = {"model": model, "data": {"seq_len": 256}, "tokens_per_param": 10.0,
            "budget_design": "preln"}
  records = []
  for L in (16, 4):   # collect_runs' order, by name: the suite's file reached through the
    workdir = tmp_path / "suite" / f"moda_{L}x64"   # 16-layer run's parent once beat the
    workdir.mkdir(parents=True)
    records.append({"design": "moda", "n_layers": L, "d_model": 64, "config": config,
                    "workdir": str(workdir)})
  xla_row = lambda f: {"design": "moda", "shape": "4x64", "xla_flops": f, "peak_bytes": 7 * f}
  (tmp_path / "suite" / "systems.json").write_text(
      json.dumps({"seq_len": 4096, "rows": [xla_row(2.0)]}))
  (tmp_path / "suite" / "moda_4x64" / "systems.json").write_text(
      json.dumps({"seq_len": 4096, "rows": [xla_row(1.0)]}))
  seen = []
  monkeypatch.setattr(table, "markdown_table", lambda rows: seen.extend(rows) or "")
  assert report_section.systems_table(records) is not None
  assert [r["shape"] for r in seen] == ["4x64", "16x64"]
  four = seen[0]
  assert (four["xla_flops"], four["peak_bytes"]) == (1.0, 7.0)   # 4-layer run's own file
  assert "xla_flops" not in seen[1] and four["train_seq_len"] == 256
  preln = report_section.run_model_config({**records[0], "design": "preln", "n_layers": 4,
                                           "config": {**config, "model": {**model, "residual": {
                                               "name": "preln"}}}})
  assert four["train_tokens"] == 10.0 * count_params(preln)["total"] < 10.0 * four["params_total"]
  # The analytic columns at the systems table's 4096 tokens, the default peak and MFU, beside
  # the XLA figures merged at 4096 (nothing read them: a row at the run's 256 tokens, or at
  # another MFU, passed).
  from depthbench_jax.systems import flops
  cfg = report_section.run_model_config(records[1])
  assert four["seq_len"] == 4096
  assert four["prefill_flops_causal"] == flops.prefill_flops(cfg, 4096)
  assert (four["peak_flops"], four["mfu"]) == (989e12, 0.4)
  assert four["device_hours"] == pytest.approx(four["train_flops"] / (989e12 * 0.4) / 3600)


def test_table_shows_a_small_model_in_significant_figures():
  """From 1 up the table keeps its fixed decimals (the committed 400M table renders the same);
  below 1 two significant figures, so the smoke suite's row is not a row of zeros."""
  from depthbench_jax.systems import table
  assert [table._num(v, k) for v, k in ((3.4921, 2), (1234.4, 0), (0.76, 2), (0.0234, 2),
                                        (4.92e-7, 0), (0.0, 2))] == [
      "3.49", "1,234", "0.76", "0.023", "4.9e-07", "0.00"]
  # MiB: a 1.5 MiB state printed as 2; whole MiB and 10 up keep no decimals.
  assert [table._mb(v * 2**20) for v in (1.5, 5, 9.5, 707.4, 0.75)] == [
      "1.5", "5", "9.5", "707", "0.75"]
  # The context curve's TFLOPs too: a smoke model's 0.024 printed 0.0 beside the table's 0.024.
  small = [{"design": "preln", "shape": s, "n_layers": L, "seq_len": 2048,
            "prefill_flops_causal": f} for s, L, f in (("4x128", 4, 2.4e10), ("8x96", 8, 3.3e10))]
  assert table.curve_markdown(small).splitlines()[2:4] == ["| 4x128 TFLOPs | 0.024 |",
                                                          "| 8x96 TFLOPs | 0.033 |"]
  row = {"design": "preln", "shape": "4x128", "aspect_ratio": 32.0, "params_total": 918784,
         "prefill_flops_causal": 1.2e8, "prefill_flops_computed": 1.3e8,
         "prefill_flops_paper": 1.0e8, "kv_cache_bytes": 131072, "residual_state_bytes": 16384,
         "param_bytes": 1837568, "train_flops_per_token": 5.7e6, "device_hours": 7.4e-5,
         "seq_len": 64, "dtype": "bfloat16", "train_seq_len": 128, "peak_flops": 989e12,
         "mfu": 0.4}
  line = table.markdown_table([row]).splitlines()[-1]
  assert line == ("| preln | 4x128 | 32.0 | 0.9M | 0.00012 | 0.00013 | - | 0.0001 | 0.12 | "
                  "0.016 | 0.0017 | - | 0.0057 | 7.4e-05 |")


def test_table_device_hours_agree_with_the_plan_to_three_figures():
  """Whole device-hours printed a 120M suite's 0.96, 1.47 and 1.99 h as 0.96, 1 and 2, against
  the sweep plan's 0.96, 1.47 and 1.99: the deepest shape's 1.55x cost read as 1.0x."""
  from depthbench_jax.systems import table
  assert [table._hours(v) for v in (0.9612, 1.4712, 1.994, 13.27, 142.6, 1234.4)] == [
      "0.96", "1.47", "1.99", "13.3", "143", "1,234"]
  row = {"design": "preln", "shape": "48x384", "aspect_ratio": 8.0, "params_total": 123.6e6,
         "prefill_flops_causal": 1.47e12, "prefill_flops_computed": 1.55e12,
         "prefill_flops_paper": 1.31e12, "kv_cache_bytes": 288 * 2**20,
         "residual_state_bytes": 3 * 2**20, "param_bytes": 247e6, "train_flops_per_token": 8.5e8,
         "device_hours": 1.4712, "seq_len": 4096, "dtype": "bfloat16", "train_seq_len": 2048,
         "peak_flops": 989e12, "mfu": 0.4}
  assert table.markdown_table([row]).splitlines()[-1].endswith("| 0.85 | 1.47 |")
  # Rows of two recipes (the smoke sweep beside a suite): the header names both training Ts
  # (it said the first row's, T=128, over the 2048 rows' GFLOPs per token).
  mixed = table.markdown_table([dict(row, shape="4x128", train_seq_len=128), row])
  assert "training at T=128/2048," in mixed.splitlines()[0]


def test_interleaved_rotates_the_order_each_round():
  from depthbench_jax.bench import interleaved
  calls = []
  lines = []
  times = interleaved({k: (lambda k=k: calls.append(k)) for k in "abc"}, rounds=4, warmup=0,
                      log=lines.append)
  assert "".join(calls) == "abc" "bac" "cab" "acb"   # from r mod 3, in steps of 1, 2, 1, 2
  assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
  assert lines[0].strip() == "timing 3 candidates x 4 rounds, after 0 warm-up calls each"
  assert [line.split(":")[0].strip() for line in lines[1:]] == [f"round {r}/4" for r in
                                                               (1, 2, 3, 4)]
  assert lines[-1].endswith("ETA 0s")
  # By default two warm-up calls each stay out of the rounds (torch's first AdamW call makes
  # its state, a jit its compile): warmup=0 as the default passed every test.
  slow_first = []
  def candidate():
    slow_first.append(time.sleep(0.05) if len(slow_first) == 0 else None)
  times = interleaved({"a": candidate}, rounds=3)
  assert len(slow_first) == 5 and max(times["a"]) < 0.05


def test_compile_rounds_alternate_which_depth_goes_first(monkeypatch):
  """16 then 70 layers in even rounds, 70 then 16 in odd ones: every shallow compile before every
  deep one read 1.408 for a ratio whose paired rounds give 0.93 (README, thirty-fifth session)."""
  from depthbench_jax import bench
  order = []
  monkeypatch.setattr(bench, "abstract_compile_seconds", lambda cfg: order.append(cfg) or 1.0)
  ct = bench.compile_times({16: 16, 70: 70}, 16, 70, 4)
  assert order == [16, 70, 70, 16, 16, 70, 70, 16] and ct == {16: [1.0] * 4, 70: [1.0] * 4}


@pytest.mark.parametrize("k, rounds", [(14, 7), (48, 15), (5, 10)])
def test_round_order_varies_who_goes_first_and_who_goes_before(k, rounds):
  """The CPU bench times 14 candidates in 7 rounds, the decode bench 48 in 15. A rotation kept
  half of the 14 behind one neighbour in every round; now every candidate follows at least two,
  each round is a permutation, and the first slot cycles through the candidates."""
  from depthbench_jax.bench import round_order
  names = [f"c{i}" for i in range(k)]
  orders = [round_order(names, r) for r in range(rounds)]
  assert all(sorted(o) == sorted(names) for o in orders)
  assert [o[0] for o in orders] == [names[r % k] for r in range(rounds)]
  before = {n: {o[o.index(n) - 1] for o in orders if o.index(n) > 0} for n in names}
  assert min(len(v) for v in before.values()) >= 2, before


def test_benches_compile_without_the_disk_cache(tmp_path):
  """With JAX_COMPILATION_CACHE_DIR set the bench's compile times were disk reads. Inside the
  context a compile neither writes nor reads the configured cache; after it, the cache is back."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.compilation_cache import compilation_cache
  from depthbench_jax.bench import compiles_without_disk_cache
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  saved = {k: getattr(jax.config, k) for k in keys}
  for k, v in zip(keys, (str(tmp_path), 0, 0)):
    jax.config.update(k, v)
  compilation_cache.reset_cache()
  try:
    lines = []
    with compiles_without_disk_cache(lines.append):
      assert jax.config.jax_compilation_cache_dir is None
      jax.jit(lambda x: x * 3.0 + 1.0).lower(jnp.ones(7)).compile()
    assert not list(tmp_path.iterdir())
    assert lines == [f"persistent compilation cache {tmp_path} not used: compile times are "
                     "measured"]
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    jax.jit(lambda x: x * 5.0 - 1.0).lower(jnp.ones(7)).compile()
    assert list(tmp_path.iterdir())
  finally:
    for k, v in saved.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()


def test_paired_ratio_band_pairs_rounds():
  """Per-round ratios, not a ratio of independent spreads: a machine that runs every candidate
  2x slower in one round leaves that round's ratio unchanged."""
  from depthbench_jax.bench import paired_ratio_band
  preln = [1.0, 2.0, 1.0, 1.0, 1.0]
  hc = [1.1, 2.2, 1.2, 1.0, 1.3]                     # ratios 1.1, 1.1, 1.2, 1.0, 1.3
  band = paired_ratio_band(hc, preln)
  np.testing.assert_allclose([band["q1"], band["median"], band["q3"]], [1.1, 1.1, 1.2])
  # Times where Pre-LN's slow round is not HC's slowest: paired, 1.1, 1.0, 1.2, 1.0, 2.1 (q1
  # 1.0); ranks matched (sorted lists zipped), 1.0, 1.1, 1.2, 2.0, 1.05 (q1 1.05).
  band = paired_ratio_band([1.1, 2.0, 1.2, 1.0, 2.1], preln)
  np.testing.assert_allclose([band["q1"], band["median"], band["q3"]], [1.0, 1.1, 1.2])
  assert paired_ratio_band([3.0], [2.0]) == {"q1": 1.5, "median": 1.5, "q3": 1.5}


def test_verdict_at_and_around_the_targets():
  """A value equal to its target passes (MFU >=, ratios <=); a band wholly below a ratio's target
  is decided (not within noise); MFU under its floor fails."""
  from depthbench_jax.bench_verdict import TARGETS, verdict

  def checks(mfu, hc, band, compile_ratio):
    train = [{"design": "preln", "shape": "8x512", "mfu": mfu, "step_over_preln": 1.0},
             {"design": "hc", "shape": "8x512", "step_over_preln": hc,
              "step_over_preln_rounds": band}]
    return {c["check"]: c for c in verdict({"train": train, "compile": {
        "deep_layers": 70, "shallow_layers": 16, "deep_over_shallow": compile_ratio}})}
  hc_target = TARGETS["hc_over_preln"]
  at = checks(TARGETS["mfu"], hc_target, {"q1": hc_target - 0.05, "median": hc_target,
                                          "q3": hc_target + 0.05},
              TARGETS["compile_deep_over_shallow"])
  assert all(c["pass"] for c in at.values()), at
  assert at["MFU Pre-LN 8x512"]["op"] == ">=" and at["HC / Pre-LN step 8x512"]["op"] == "<="
  # A CPU run without torch/transformers: the HF check was simply absent, four checks all PASS.
  result = {"train": [{"design": "preln", "shape": "8x512", "mfu": 0.5,
                       "step_over_preln": 1.0}], "hf_left_out": "transformers not installed",
            "compile": {"deep_layers": 70, "shallow_layers": 16, "deep_over_shallow": 1.0}}
  hf = {c["check"]: c for c in verdict(result)}["ours / HF LLaMA step"]
  assert not hf["pass"] and hf["failed"] == "not measured: transformers not installed"
  # The compile ratio reads its per-round band too (one compile varies by a third here).
  noisy = {"train": [{"design": "preln", "shape": "8x512", "mfu": 0.5, "step_over_preln": 1.0}],
           "compile": {"deep_layers": 70, "shallow_layers": 16, "deep_over_shallow": 1.41,
                       "deep_over_shallow_rounds": {"q1": 0.9, "median": 1.1, "q3": 1.45}}}
  compile_check = {c["check"]: c for c in verdict(noisy)}["compile 70L / 16L"]
  assert not compile_check["pass"] and compile_check["within_noise"]
  below = checks(0.3, 0.95, {"q1": 0.9, "median": 0.95, "q3": 0.98}, 1.0)
  assert below["HC / Pre-LN step 8x512"]["pass"]
  assert not below["HC / Pre-LN step 8x512"]["within_noise"]
  assert not below["MFU Pre-LN 8x512"]["pass"]


def test_design_and_shape_specs_parse_strictly():
  from depthbench_jax import bench
  value = bench.design_spec("mhc:sinkhorn_iters=10")[1]["sinkhorn_iters"]
  assert type(value) is int and value == 10
  assert type(bench.design_spec("hc:rate=0.5")[1]["rate"]) is float
  with pytest.raises(ValueError, match="key=value"):
    bench.design_spec("mhc:=5")
  with pytest.raises(ValueError, match="LxD"):
    bench.shape_spec("8x0", 8)


@pytest.mark.parametrize("rounds", ["0", "-3"])
def test_bench_refuses_rounds_below_one_before_anything_compiles(tmp_path, capsys, monkeypatch,
                                                                 rounds):
  """--rounds=0 once fell through to the preset's 7 rounds and ran the whole bench. One error
  line, exit 2, as every CLI here (argparse printed its usage block first); argparse's own
  refusals alike."""
  from depthbench_jax import bench
  monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("a bad flag reached run"))
  for argv, said in (([f"--rounds={rounds}"], f"--rounds={rounds}; allowed: an integer >= 1"),
                     (["--preset=huge"], "argument --preset: invalid choice: 'huge' (choose "
                                         "from 'cpu', 'gpu400m', 'quick')")):
    with pytest.raises(SystemExit) as exit_:
      bench.main(["--preset=quick", *argv, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {said}"]
  assert not os.listdir(tmp_path)


def test_xla_flops_are_per_sequence_at_any_batch():
  cfg = model_cfg("preln", n_layers=2)
  one = xla.prefill_analysis(cfg, 32, batch=1, dtype="float32")["xla_flops"]
  two = xla.prefill_analysis(cfg, 32, batch=2, dtype="float32")["xla_flops"]
  assert two == pytest.approx(one, rel=0.01)


def test_cost_row_kv_cache_in_the_asked_dtype():
  cfg = model_cfg("preln")
  row = costs.cost_row(cfg, seq_len=64, train_seq_len=64, tokens_per_param=20, peak_flops=1e15,
                       mfu=0.4, dtype="float32")
  # K and V x 2 layers x 64 (4 heads of 16) x 64 tokens x 4 bytes.
  assert row["kv_cache_bytes"] == costs.kv_cache_bytes(cfg, 64, dtype="float32") == 65536


def test_cost_row_numbers_by_hand():
  """Every byte count in the asked dtype, AR = d / L, Chinchilla tokens = 20 N of the budget N,
  FLOPs and device-hours of those tokens; a design's matmul params count twice per token."""
  cfg = model_cfg("preln")
  row = costs.cost_row(cfg, seq_len=16, train_seq_len=64, tokens_per_param=20, peak_flops=1e15,
                       mfu=0.5, dtype="float32", budget_params=1000)
  assert row["param_bytes"] == 4 * row["params_total"]
  assert row["residual_state_bytes"] == 16 * 64 * 4          # T d fp32 bytes (Pre-LN)
  assert row["aspect_ratio"] == 32.0                         # 64 / 2
  assert row["train_tokens"] == 20 * 1000
  # 3 x (2 N_matmul + 2 L T H hd): N_matmul = 2 x (64 x 16 x 16 attention + 3 x 64 x 192
  # SwiGLU) + 64 x 64 head = 110592; the causal attention term 2 x 2 x 64 x 64 = 16384 at T=64.
  assert row["train_flops_per_token"] == 3 * (2 * 110592 + 2 * 2 * 64 * 64) == 712704
  assert row["train_flops"] == 712704 * 20_000
  assert row["device_hours"] == pytest.approx(712704 * 20_000 / (1e15 * 0.5) / 3600)
  moda = model_cfg("moda")
  # MoDA: its FFN depth-K/V projections, L x d x 2 K hd = 2 x 64 x 128 = 16384 params at 2 FLOPs
  # each, plus its depth attention, 4 H hd per depth slot read (two over the two layers).
  assert flops.matmul_params(moda) - flops.backbone_matmul_params(moda) == 16384
  assert costs.cost_row(moda, seq_len=16, train_seq_len=64, tokens_per_param=20,
                        peak_flops=1e15, mfu=0.4)["design_flops_per_token"] == (
                            2 * 16384 + 4 * 64 * 2)


def test_context_curve_compares_depth_within_each_scale_family(tmp_path):
  """A multi-scale suite's curve: each family's deepest over its own shallowest shape. The plot
  divided every shape by the sort's first (a 300M 16x1024 before the 200M 16x800, as strings)
  and the table printed only the first family's ratio."""
  from depthbench_jax.systems import table
  curve = [{"design": "preln", "shape": s, "family": fam, "n_layers": L, "seq_len": t,
            "prefill_flops_causal": f}
           for s, fam, L, t, f in (("4x128", 0, 4, 2048, 1e12), ("16x64", 0, 16, 2048, 2e12),
                                   ("4x256", 1, 4, 2048, 4e12), ("16x128", 1, 16, 2048, 6e12),
                                   ("16x100", 2, 16, 2048, 5e12),
                                   # each over its shallowest at the same T, not at the first
                                   ("4x128", 0, 4, 4096, 3e12), ("16x64", 0, 16, 4096, 9e12))]
  lines = table.curve_markdown(curve).splitlines()
  assert [line for line in lines if " / " in line] == ["| 16x64 / 4x128 | 2.00 | 3.00 |",
                                                        "| 16x128 / 4x256 | 1.50 |"]
  assert table._shallowest(curve) == {0: {2048: 1e12, 4096: 3e12}, 1: {2048: 4e12},
                                      2: {2048: 5e12}}
  assert os.path.exists(table.plot_context_curve(curve, str(tmp_path / "c.png")))
  # What the figure draws: each shape's TFLOPs at its T, and over its own family's shallowest.
  import matplotlib.pyplot as plt
  fig = table.context_curve_figure(curve)
  left, right = fig.axes[:2]
  drawn = lambda ax: {l.get_label(): (list(l.get_xdata()), list(l.get_ydata())) for l in ax.lines}
  assert drawn(left) == {"4x128": ([2048, 4096], [1.0, 3.0]), "16x64": ([2048, 4096], [2.0, 9.0]),
                         "4x256": ([2048], [4.0]), "16x128": ([2048], [6.0]),
                         "16x100": ([2048], [5.0])}
  assert drawn(right) == {"4x128": ([2048, 4096], [1.0, 1.0]),
                          "16x64": ([2048, 4096], [2.0, 3.0]),
                          "4x256": ([2048], [1.0]), "16x128": ([2048], [1.5]),
                          "16x100": ([2048], [1.0])}
  assert left.get_title().startswith("preln: ")   # which design's count, read apart from the md
  plt.close(fig)


def test_curve_table_reads_shallow_to_deep():
  from depthbench_jax.systems import table
  curve = [{"design": "preln", "shape": s, "n_layers": L, "seq_len": t, "prefill_flops_causal": f}
           for s, L, t, f in (("4x128", 4, 2048, 1e12), ("16x64", 16, 2048, 2e12),
                              ("4x128", 4, 4096, 3e12), ("16x64", 16, 4096, 9e12))]
  assert table.curve_markdown(curve).splitlines()[-1] == "| 16x64 / 4x128 | 2.00 | 3.00 |"
  # Every column its own value (the paper's approximation 0.9x the causal count), so a column
  # read from its neighbour's key fails; a peak the compile did not give is "-".
  rows = [{"design": "preln", "shape": s, "n_layers": L, "prefill_flops_paper": 0.9 * f,
           "prefill_flops_causal": f, "kv_cache_bytes": kv, "peak_bytes": peak,
           "device_hours": h}
          for s, L, f, kv, peak, h in (("16x64", 16, 2e12, 6e6, 3e9, 4.0),
                                       ("4x128", 4, 1e12, 2e6, 2e9, 1.0))]
  assert table.depth_cost_summary(rows).splitlines()[-1] == (
      "| preln | 4x128 -> 16x64 | 0.9 -> 1.80 | 1.00 -> 2.00 (x2.00) | x3.00 | x1.50 | x4.00 |")
  rows[0]["peak_bytes"] = None
  assert table.depth_cost_summary(rows).splitlines()[-1].endswith("| x3.00 | - | x4.00 |")


def test_verdict_flags_a_target_inside_the_run_noise():
  """A ratio just over its target with the target inside the per-round IQR prints UNDECIDED
  (its value still reads FAIL in ``pass``); a band clear of the target is decided; a ratio of
  medians on the other side of the target from its own band's median is undecided too."""
  from depthbench_jax.bench_verdict import render, verdict

  def result(hc_band):
    train = [{"design": "preln", "shape": "8x512", "mfu": 0.7, "step_over_preln": 1.0,
              "step_over_preln_rounds": {"q1": 1.0, "median": 1.0, "q3": 1.0}},
             {"design": "hc", "shape": "8x512", "step_over_preln": 1.109,
              "step_over_preln_rounds": hc_band}]
    return {"train": train, "compile": {"deep_layers": 70, "shallow_layers": 16,
                                        "deep_over_shallow": 0.96}}

  noisy = {c["check"]: c for c in verdict(result({"q1": 1.06, "median": 1.13, "q3": 1.16}))}
  hc = noisy["HC / Pre-LN step 8x512"]
  assert not hc["pass"] and hc["within_noise"]
  assert "within_noise" not in noisy["MFU Pre-LN 8x512"]
  clear = {c["check"]: c for c in verdict(result({"q1": 1.105, "median": 1.11, "q3": 1.12}))}
  assert not clear["HC / Pre-LN step 8x512"]["within_noise"]
  # 1.109 over 1.10 while the whole band reads under it (results-cpu-shapes.json's HC at 8x512
  # read 1.131 over an IQR of 1.092-1.129): the run cannot decide.
  split = {c["check"]: c for c in verdict(result({"q1": 1.05, "median": 1.07, "q3": 1.09}))}
  hc = split["HC / Pre-LN step 8x512"]
  assert not hc["pass"] and hc["within_noise"] and "median 1.070" in hc["noise"]
  r = result({"q1": 1.06, "median": 1.13, "q3": 1.16})
  r.update(verdict=verdict(r), device="cpu", device_kind="cpu", cpu_count=2, jax="x",
           preset={"dtype": "float32", "batch": 8, "seq_len": 128}, matmul_peak_flops=1e11)
  for row in r["train"]:
    row.update(remat_policy="dots_saveable", step_s=1.0, tokens_per_s=1.0,
               model_flops_per_s=1.0, mfu=0.7, peak_bytes=1, peak_over_preln=1.0, compile_s=1.0)
  r["compile"].update(shallow_s=1.0, deep_s=0.96)
  table = render(r)
  assert ("| HC / Pre-LN step 8x512 | 1.109 | <= 1.1 | UNDECIDED (reads FAIL; target inside "
          "the per-round IQR 1.060-1.160) |") in table
  assert "| MFU Pre-LN 8x512 | 0.700 | >= 0.45 | PASS |" in table
  # A result saved before ``noise`` was recorded still says why.
  del r["verdict"][1]["noise"]
  assert "UNDECIDED (reads FAIL; target inside the per-round IQR 1.060-1.160)" in render(r)
  # A design asked for that did not compile or fit is a FAIL line, not a missing one.
  r["train"] = r["train"][:1]
  r["failed"] = {"hc 8x512": "out of memory"}
  r["verdict"] = verdict(r)
  assert "| HC / Pre-LN step 8x512 | - | <= 1.1 | FAIL (out of memory) |" in render(r)


@pytest.mark.parametrize("torch_peak, passed", [(0.3e9, False), (48e9, True)])
def test_verdict_refuses_an_hf_comparison_whose_torch_ran_starved(torch_peak, passed):
  """A run beside another process read torch's GEMM ceiling at 0.3 GFLOP/s (100 the run before)
  and HF's step at 628 ms: ours/HF 0.002 passed. Below a tenth of XLA's ceiling, timed in the
  same rounds, the check fails and says why; a normal ceiling (~0.45 of XLA's) passes."""
  from depthbench_jax.bench_verdict import verdict
  pre = {"design": "preln", "shape": "8x512", "mfu": 0.7, "step_over_preln": 1.0,
         "ours_over_hf": 0.002 if not passed else 0.53, "hf_matmul_peak_flops": torch_peak,
         "matmul_peak_flops": 100e9}
  result = {"train": [pre], "compile": {"deep_layers": 70, "shallow_layers": 16,
                                        "deep_over_shallow": 0.96}}
  hf = {c["check"]: c for c in verdict(result)}["ours / HF LLaMA step"]
  assert hf["pass"] == passed
  assert ("torch ran starved" in hf.get("failed", "")) == (not passed)


def test_verdict_value_that_rounds_to_its_target_prints_the_digits_that_decide():
  from depthbench_jax.bench_verdict import _verdict_value
  assert _verdict_value(1.100412, 1.1) == "1.10041"   # A FAIL that 3 decimals print as 1.100.
  assert _verdict_value(1.09962, 1.1) == "1.09962"    # A PASS likewise.
  assert _verdict_value(1.1, 1.1) == "1.100"          # Exactly at the target.
  assert _verdict_value(1.109, 1.1) == "1.109"
  assert _verdict_value(1.100001, 1.1) == "1.1000010"  # 5 decimals would still print 1.10000.
  assert _verdict_value(0.449999, 0.45) == "0.4499990"
  assert _verdict_value(1.1 + 1e-15, 1.1) == repr(1.1 + 1e-15)
  assert _verdict_value(None, 1.1) == "-"


def test_host_cpu_names_family_model_and_vector_width_beside_a_masked_name():
  from depthbench_jax.bench import describe_cpuinfo
  zen5 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
          "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512bw")
  assert describe_cpuinfo(zen5) == "AMD EPYC (family 26 model 2, AVX-512)"
  assert describe_cpuinfo(zen5.replace(" avx512f avx512bw", "")) == (
      "AMD EPYC (family 26 model 2, AVX2)")
  assert describe_cpuinfo("model name\t: Some CPU") == "Some CPU"


def test_ours_over_hf_at_equal_gemm_speed_by_hand():
  """320 GFLOP a step; XLA's ceiling 400, torch's 200 GFLOP/s; ours 1.0 s, HF 1.8 s. Scaled:
  HF's MFU 320/1.8/200 = 0.889 over ours 320/1.0/400 = 0.8 -> 1.111. Moved: ours with its
  0.8 s of ideal GEMM time at 1.6 s instead -> 1.8 s / 1.8 s = 1.0. Equal ceilings: both are
  plain ours/HF."""
  from depthbench_jax.bench import ours_over_hf_at_equal_gemm
  np.testing.assert_allclose(ours_over_hf_at_equal_gemm(1.0, 1.8, 320e9, 400e9, 200e9),
                             (10 / 9, 1.0))
  np.testing.assert_allclose(ours_over_hf_at_equal_gemm(1.0, 1.25, 320e9, 400e9, 400e9),
                             (0.8, 0.8))
  # A step faster than its "ceiling" (ours at MFU 1.6): no moved figure, the scaled one stays.
  assert ours_over_hf_at_equal_gemm(0.5, 1.8, 320e9, 400e9, 200e9) == (
      pytest.approx(5 / 9), None)


def test_hf_target_needs_the_step_and_mfu_the_target_implies():
  """ours/HF 0.9 at MFU 0.8 against a 2.0 s HF step: 0.8 needs 1.6 s, i.e. MFU 0.8 * 0.9 / 0.8
  = 0.9 of the GEMM ceiling, leaving 10% of the step for everything else."""
  from depthbench_jax.bench_verdict import hf_target_needs
  line = hf_target_needs({"hf_step_s": 2.0, "mfu": 0.8, "ours_over_hf": 0.9}, 0.8)
  assert "step of 1600.0 ms" in line and "MFU 0.900" in line and "in 10% of the step" in line
  assert "in 0% of the step" in hf_target_needs({"hf_step_s": 2.0, "mfu": 0.9,
                                                  "ours_over_hf": 1.0}, 0.8)


def test_step_target_needs_the_time_beyond_preln_the_target_allows():
  """HC at 1.13 s over a 1.0 s Pre-LN step against 1.10: 100 ms allowed, 130 taken (1.30x);
  at 50 GB/s the 100 ms move 5 GB. Full AttnRes at 1.1 s against 1.15 is within; a result
  without the design (or without a bandwidth: older JSONs) prints no line (no GB)."""
  from depthbench_jax.bench_verdict import step_target_needs, step_targets_needs
  pre, hc = {"step_s": 1.0}, {"step_s": 1.13}
  line = step_target_needs("HC", hc, pre, 1.10, 50e9)
  assert ("HC / Pre-LN <= 1.1 needs HC's time beyond Pre-LN's 1000.0 ms step in 100.0 ms "
          "(now 130.0 ms, 1.30x that); at this run's stream bandwidth that budget moves "
          "5.00 GB") == line
  rows = [{"design": "preln", "shape": "8x512", **pre},
          {"design": "attnres_full", "shape": "8x512", "step_s": 1.1},
          {"design": "hc", "shape": "16x256", "step_s": 9.0}]
  lines = step_targets_needs({"train": rows})
  assert lines == ["", "Full AttnRes / Pre-LN <= 1.15 needs Full AttnRes's time beyond Pre-LN's "
                   "1000.0 ms step in 150.0 ms (now 100.0 ms: within it)"]
  assert step_targets_needs({"train": rows[:1]}) == []


@pytest.mark.slow  # ~4 train-step compiles: 20-40 s on 2 busy cores. CI runs slow tests too.
def test_bench_quick_mode(tmp_path, capsys, monkeypatch):
  from depthbench_jax import bench
  timed = []   # each interleaved run's per-round times, as the bench got them
  real = bench.interleaved
  monkeypatch.setattr(bench, "interleaved", lambda *a, **k: (
      timed.append({n: list(t) for n, t in real(*a, **k).items()}) or dict(timed[-1])))
  depths = []   # the depths the compile ratio compiled (one depth for both passed)
  real_compile = bench.abstract_compile_seconds
  monkeypatch.setattr(bench, "abstract_compile_seconds", lambda cfg: (
      depths.append(cfg.model.n_layers) or real_compile(cfg)))
  assert bench.main(["--preset", "quick", "--out", str(tmp_path)]) == 0
  quick_preset = bench.PRESETS["quick"]
  assert sorted(set(depths)) == sorted(quick_preset.compile_layers)
  assert len(depths) == 2 * quick_preset.compile_rounds
  (path,) = list(tmp_path.glob("results-*.json"))  # The partial save is gone once it is whole.
  result = json.loads(path.read_text())
  designs = {r["design"] for r in result["train"]}
  assert {"preln", "hc"} <= designs
  pre = next(r for r in result["train"] if r["design"] == "preln")
  assert pre["step_over_preln"] == 1.0 and pre["mfu"] > 0 and pre["peak_bytes"] > 0
  assert pre["step_over_preln_rounds"] == {"q1": 1.0, "median": 1.0, "q3": 1.0}
  hc = next(r for r in result["train"] if r["design"] == "hc")
  band = hc["step_over_preln_rounds"]
  assert band["q1"] <= band["median"] <= band["q3"]
  # MFU's numerator is the train step's FLOPs (fwd + bwd, causal) of each design's own model:
  # only mfu > 0 was checked, so a forward-only count (MFU a third) passed.
  from depthbench_jax.systems.flops import train_flops_per_token
  quick = bench.PRESETS["quick"]
  for row in (pre, hc):
    cfg = model_config_from(bench.bench_config(quick, row["design"]).model)
    assert row["model_flops_per_step"] == pytest.approx(
        train_flops_per_token(cfg, quick.seq_len) * quick.batch * quick.seq_len)
    assert row["mfu"] == pytest.approx(row["model_flops_per_s"] / result["matmul_peak_flops"])
  assert result["compile"]["deep_s"] > 0 and result["matmul_peak_flops"] > 0
  assert pre["attention"] == "xla-blocked" and result["device_memory"] == {"2x32": None}
  assert "ours_over_hf" in pre and pre["hf_matmul_peak_flops"] > 0
  np.testing.assert_allclose(pre["ours_over_hf_at_equal_gemm"] * pre["mfu"], pre["hf_mfu"])
  moved = pre["ours_over_hf_gemms_moved"]  # None where a quick step beats its 128^3 "ceiling"
  assert (moved is None) == (pre["mfu"] > 1 or pre["hf_mfu"] > 1) and (moved is None or moved > 0)
  assert result["stream_bandwidth"] > 0
  assert result["machine_balance"] == result["matmul_peak_flops"] / result["stream_bandwidth"]
  # Each published ratio from the raw per-round times (only signs and self-consistency were
  # checked: an inverted HC / Pre-LN, a peak without its factor 2, ... passed).
  (times,) = timed
  med = {k: statistics.median(v) for k, v in times.items()}
  assert hc["step_over_preln"] == pytest.approx(med["hc"] / med["preln"])
  assert hc["step_s_all"] == times["hc"]
  per_round = sorted(h / p for h, p in zip(times["hc"], times["preln"]))
  assert [band["q1"], band["median"], band["q3"]] == pytest.approx(
      statistics.quantiles(per_round, n=4, method="inclusive"))
  assert result["matmul_peak_flops"] == pytest.approx(
      2 * quick.matmul_n ** 3 * quick.matmul_reps / med["matmul"])
  assert result["stream_bandwidth"] == pytest.approx(
      3 * quick.stream_mib * 2**20 * quick.stream_reps / med["stream"])
  assert pre["tokens_per_s"] == pytest.approx(quick.batch * quick.seq_len / med["preln"])
  assert hc["peak_over_preln"] == hc["peak_bytes"] / pre["peak_bytes"]
  assert pre["ours_over_hf"] == pytest.approx(med["preln"] / med["hf_llama_torch"])
  quartiles = lambda num, den: pytest.approx(statistics.quantiles(
      sorted(a / b for a, b in zip(num, den)), n=4, method="inclusive"))
  hf_band = pre["ours_over_hf_rounds"]
  assert [hf_band["q1"], hf_band["median"], hf_band["q3"]] == quartiles(
      times["preln"], times["hf_llama_torch"])
  assert pre["hf_matmul_peak_flops"] == pytest.approx(
      2 * quick.matmul_n ** 3 * quick.matmul_reps / med["matmul_torch"])
  compile_ = result["compile"]
  assert compile_["deep_over_shallow"] == pytest.approx(
      statistics.median(compile_["deep_s_all"]) / statistics.median(compile_["shallow_s_all"]))
  assert compile_["deep_over_shallow_rounds"]["median"] == pytest.approx(   # deep over shallow
      statistics.median(d / s for d, s in zip(compile_["deep_s_all"], compile_["shallow_s_all"])))
  out = capsys.readouterr().out
  # The verdict table, one line per check the result holds (its header alone said "verdict").
  assert result["verdict"] and all(f"| {v['check']} |" in out for v in result["verdict"])
  # The record names its code and host: a ratio means little without them.
  head = subprocess.run(["git", "-C", os.path.dirname(bench.__file__), "rev-parse", "HEAD"],
                        capture_output=True, text=True)
  if head.returncode == 0:
    assert result["code"]["commit"] == head.stdout.strip()
    assert result["code"]["commit"][:12] in out
  assert result["host_cpu"] and result["host_cpu"] in out
  # Its picture lands beside the JSON; --replot renders the same table from the JSON alone.
  assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  path.with_suffix(".png").unlink()
  assert bench.main(["--replot", str(path)]) == 0
  assert capsys.readouterr().out == out
  assert path.with_suffix(".png").exists()
  # With --out the picture goes there and the one beside the JSON (a committed PNG) is kept.
  before = path.with_suffix(".png").stat().st_mtime_ns
  assert bench.main(["--replot", str(path), f"--out={tmp_path / 'pictures'}"]) == 0
  assert (tmp_path / "pictures" / path.with_suffix(".png").name).exists()
  assert path.with_suffix(".png").stat().st_mtime_ns == before
  assert sorted(os.listdir(tmp_path / "pictures")) == [path.with_suffix(".png").name]
  capsys.readouterr()
  with pytest.raises(SystemExit):
    bench.main(["--replot", str(path), f"--out={path}"])
  assert "--out=" in capsys.readouterr().err
  (tmp_path / "other.json").write_text('{"loss": 3.0}')
  for bad in (tmp_path / "missing.json", tmp_path / "other.json"):
    with pytest.raises(SystemExit):
      bench.main(["--replot", str(bad)])
    assert "--replot=" in capsys.readouterr().err


@pytest.mark.parametrize("tool, runner", [("bench", "run_bench"),
                                          ("systems.decode_bench", "run")])
def test_an_out_that_is_a_file_is_refused_before_anything_compiles(tmp_path, capsys,
                                                                   monkeypatch, tool, runner):
  """--out naming a file once ended in a FileExistsError traceback (bench), or only after the
  whole run, losing what it had timed (decode_bench)."""
  import importlib
  module = importlib.import_module(f"depthbench_jax.{tool}")
  monkeypatch.setattr(module, runner, lambda *a, **k: pytest.fail("a bad flag reached the run"))
  taken = tmp_path / "results"
  taken.write_text("notes")
  with pytest.raises(SystemExit):
    module.main(["--preset=quick", "--out", str(taken)])
  assert f"--out={taken}: {taken} is a file; allowed: a folder there" in capsys.readouterr().err
  assert taken.read_text() == "notes"


def test_bench_without_torch_says_so_and_keeps_a_result_that_holds_ours_over_hf(
    tmp_path, capsys, monkeypatch):
  """Without transformers the HF check left the verdict without a word, and the replace guard
  (made for --no_hf) let the run replace a result holding ours/HF figures."""
  import importlib.util
  from depthbench_jax import bench
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "transformers" else find_spec(name, *a))
  assert bench.hf_missing() == "transformers not installed (pip install -e '.[test]')"
  helpers.stub_run(monkeypatch, bench, "run_bench")
  earlier = tmp_path / "results-cpu-quick-designs.json"
  earlier.write_text(json.dumps({"preset": {"designs": ["preln", "hc"], "shapes": [],
                                            "hf": True, "rounds": 2}}))
  with pytest.raises(SystemExit):
    bench.main(["--preset=quick", "--designs=preln,hc", "--out", str(tmp_path)])
  err = capsys.readouterr().err
  assert "HF LlamaForCausalLM left out: transformers not installed" in err
  assert f"--no_hf=true: {earlier} holds a result made with no_hf=false" in err
  seen = {}
  monkeypatch.setattr(bench, "run_bench", lambda p, **kw: seen.update(kw) or 1 / 0)
  with pytest.raises(ZeroDivisionError):   # reached the run: the reason goes to the result
    bench.main(["--preset=quick", "--designs=preln,hc", "--out", str(tmp_path / "new")])
  assert seen["hf_left_out"] == "transformers not installed (pip install -e '.[test]')"
  # Installed but broken: hf_runner returned None and the HF line silently left the verdict.
  monkeypatch.setattr(importlib.util, "find_spec", find_spec)
  import_module = importlib.import_module
  def broken(name, *a):
    if name == "transformers":
      raise RuntimeError("Failed to import transformers.models.llama\nline two")
    return import_module(name, *a)
  monkeypatch.setattr(importlib, "import_module", broken)
  assert bench.hf_missing() == ("transformers fails to import (RuntimeError: Failed to import "
                                "transformers.models.llama)")


def test_bench_on_an_accelerator_leaves_hf_out_as_no_hf(tmp_path, capsys, monkeypatch):
  """A cpu-preset run on a GPU timed no HF step yet recorded hf=true, so a later --no_hf run
  there was refused for replacing ours/HF figures the file never held."""
  from depthbench_jax import bench
  monkeypatch.setattr(bench.jax, "default_backend", lambda: "gpu")
  seen = {}
  monkeypatch.setattr(bench, "run_bench", lambda p, **kw: seen.update(p=p) or 1 / 0)
  with pytest.raises(ZeroDivisionError):
    bench.main(["--preset=quick", "--designs=preln,hc", "--out", str(tmp_path)])
  assert seen["p"].hf is False
  assert "HF LlamaForCausalLM left out: torch runs it on the CPU, ours runs on gpu" in (
      capsys.readouterr().err)


def test_bench_refuses_to_replace_a_result_of_other_designs(tmp_path, capsys, monkeypatch):
  """--designs=preln,hc then --designs=preln,mhc write one file name: the second run once
  replaced the first without a word. The same designs, or --overwrite, still replace it."""
  from depthbench_jax import bench
  helpers.stub_run(monkeypatch, bench, "run_bench")
  earlier = tmp_path / "results-cpu-quick-designs.json"
  earlier.write_text(json.dumps({"preset": {"designs": ["preln", "hc"], "shapes": [],
                                            "hf": True}}))
  with pytest.raises(SystemExit):
    bench.main(["--preset=quick", "--designs=preln,mhc", "--out", str(tmp_path)])
  err = capsys.readouterr().err
  assert (f'--designs=["preln", "mhc"]: {earlier} holds a result made with '
          f'designs=["preln", "hc"]') in err
  assert "--overwrite to replace it, or another --out" in err
  assert json.loads(earlier.read_text())["preset"]["designs"] == ["preln", "hc"]
  with pytest.raises(SystemExit):   # Without HF: the result's ours/HF figures would be lost.
    bench.main(["--preset=quick", "--designs=preln,hc", "--no_hf", "--out", str(tmp_path)])
  assert f"--no_hf=true: {earlier} holds a result made with no_hf=false" in (
      capsys.readouterr().err)   # the flag the user gave (there is no --hf)
  # Fewer rounds over a finished result: a noisier one (the committed bench has 7).
  earlier.write_text(json.dumps({"preset": {"designs": ["preln", "hc"], "shapes": [],
                                            "hf": True, "rounds": 3}}))
  with pytest.raises(SystemExit):
    bench.main(["--preset=quick", "--designs=preln,hc", "--rounds=1", "--out", str(tmp_path)])
  assert f"--rounds=1: {earlier} holds a result of 3 rounds" in capsys.readouterr().err
  for flags in (["--designs=preln,hc", "--rounds=3"], ["--designs=preln,mhc", "--overwrite"]):
    with pytest.raises(helpers.RunReached):
      bench.main(["--preset=quick", *flags, "--out", str(tmp_path)])


def test_bench_times_each_design_and_shape_once_in_one_spelling(tmp_path, monkeypatch):
  """--designs=hc,hc compiled HC twice, timed one row and recorded both, so a later --designs=hc
  was refused as other designs; '02x32' beside '2x32' was a second row of one shape."""
  from depthbench_jax import bench
  timed = []
  def run_bench(p, **_):
    timed.append(p)
    raise helpers.RunReached
  monkeypatch.setattr(bench, "run_bench", run_bench)
  with pytest.raises(helpers.RunReached):
    bench.main(["--preset=quick", "--designs=preln,hc,hc", "--shapes=2x32, 02x32,1x32",
                "--no_hf", "--out", str(tmp_path)])
  assert timed[0].designs == ("preln", "hc") and timed[0].shapes == ("2x32", "1x32")


def test_bench_refuses_to_replace_a_result_of_another_attention_kernel_or_preset(
    tmp_path, capsys, monkeypatch):
  """gpu_bench.sh's fallback (--attention_kernel=xla) once replaced the committed cuDNN result
  of the same designs and shapes, and a --preset=cpu run the gpu400m one (fp32, 8x128 over
  bf16, 8x2048): the guard compared designs, shapes and HF only."""
  from depthbench_jax import bench
  helpers.stub_run(monkeypatch, bench, "run_bench")
  earlier = tmp_path / "results-cpu-quick-designs.json"
  recorded = {"designs": ["preln", "hc"], "shapes": [], "hf": True, "attention_kernel": "fused"}
  earlier.write_text(json.dumps({"preset": recorded}))
  with pytest.raises(SystemExit):
    bench.main(["--preset=quick", "--designs=preln,hc", "--attention_kernel=xla",
                "--out", str(tmp_path)])
  assert (f'--attention_kernel="xla": {earlier} holds a result made with '
          f'attention_kernel="fused"') in capsys.readouterr().err
  earlier.write_text(json.dumps({"preset": {**recorded, "attention_kernel": "xla",
                                            "dtype": "bfloat16", "seq_len": 2048}}))
  with pytest.raises(SystemExit):
    bench.main(["--preset=quick", "--designs=preln,hc", "--out", str(tmp_path)])
  assert (f'--preset=quick\'s dtype="float32", --preset=quick\'s seq_len=16: {earlier} holds '
          f'a result made with dtype="bfloat16", seq_len=2048') in capsys.readouterr().err
  assert json.loads(earlier.read_text())["preset"]["seq_len"] == 2048
  with pytest.raises(helpers.RunReached):  # Older results record neither: read as asked.
    earlier.write_text(json.dumps({"preset": {"designs": ["preln", "hc"], "shapes": []}}))
    bench.main(["--preset=quick", "--designs=preln,hc", "--out", str(tmp_path)])


def test_bench_checks_every_design_at_a_bad_shape_when_the_preset_runs_all(tmp_path, capsys,
                                                                         monkeypatch):
  """The cpu preset's designs () mean every design, and the check looped over the () itself:
  --shapes=8x24 (head_dim 3) reached the timing and died there in a traceback."""
  from depthbench_jax import bench
  monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("a bad shape reached run"))
  with pytest.raises(SystemExit):
    bench.main(["--shapes=8x24", "--no_hf", "--out", str(tmp_path)])
  assert "--shapes entry '8x24': config.model.head_dim=3" in capsys.readouterr().err
  assert not os.listdir(tmp_path)


def test_bench_shapes_are_checked_and_named_in_the_result_file(tmp_path, capsys):
  """A bad ``--shapes`` entry is one error naming the entry before anything compiles; a run
  with its own shapes writes beside the device's default result, never over it."""
  from depthbench_jax import bench
  assert bench.shape_spec(" 32x256", 8) == (32, 256)
  for spec, message in (("32*256", "not LxD"), ("0x256", "not LxD"),
                        ("8x100", "not a multiple of the preset's n_heads 8; allowed: a "
                                  "multiple of 8")):
    with pytest.raises(ValueError, match=message):
      bench.shape_spec(spec, 8)
  with pytest.raises(SystemExit):
    bench.main(["--shapes", "8x512,8x-1", "--out", str(tmp_path)])
  assert "--shapes entry '8x-1': not LxD" in capsys.readouterr().err
  assert not list(tmp_path.iterdir())
  assert bench.result_path("b", "cpu", "cpu") == os.path.join("b", "results-cpu.json")
  assert bench.result_path("b", "nvidia-h200", "gpu400m", shapes=True) == os.path.join(
      "b", "results-nvidia-h200-shapes.json")
  assert bench.result_path("b", "cpu", "quick", "none", True, True) == os.path.join(
      "b", "results-cpu-quick-remat-none-designs-shapes.json")


def test_depth_cost_table_reads_each_design_against_the_first_shapes_preln():
  from depthbench_jax import bench_verdict
  band = lambda m: {"q1": m - 0.01, "median": m, "q3": m + 0.01}
  rows = [{"design": d, "shape": s, "step_over_first_preln": v,
           "step_over_first_preln_rounds": band(v)}
          for d, s, v in (("preln", "8x512", 1.0), ("hc", "8x512", 1.09),
                          ("preln", "32x256", 1.2), ("hc", "32x256", 1.5))]
  assert bench_verdict.depth_cost_table(rows) == [
      "", "Cost of depth: step over Pre-LN at 8x512 (timed in the same rounds; per-round IQR)",
      "", "| design | 8x512 | 32x256 |", "|---|---|---|",
      "| preln | 1.000 (0.990-1.010) | 1.200 (1.190-1.210) |",
      "| hc | 1.090 (1.080-1.100) | 1.500 (1.490-1.510) |"]
  assert bench_verdict.depth_cost_table([r for r in rows if r["shape"] == "8x512"]) == []


def test_bench_plot_draws_each_ratio_its_round_median_and_the_target_at_the_first_shape(
    tmp_path, monkeypatch):
  """Panel 1 bars the step ratio and puts the dot at the per-round median (the bar itself when no
  rounds were kept), panel 2 bars peak memory, panel 3 the step over the first shape's Pre-LN;
  a design's target is one dashed tick over its bar at the first shape only."""
  import matplotlib.figure
  from depthbench_jax import bench_plot
  saved = []
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, path, **kw: saved.append(fig))
  # Asymmetric bands: whiskers with q1 and q3 swapped read alike around a symmetric one.
  band = lambda m: {"q1": m - 0.1, "median": m, "q3": m + 0.3}
  rows = []
  for shape, step, peak, first in (("4x64", 1.3, 1.5, 1.0), ("8x32", 1.4, 1.6, 1.1)):
    rows += [{"design": "preln", "shape": shape, "step_over_preln": 1.0, "peak_over_preln": 1.0,
              "step_over_first_preln": first, "step_over_first_preln_rounds": band(first)},
             {"design": "hc", "shape": shape, "step_over_preln": step, "peak_over_preln": peak,
              "step_over_preln_rounds": band(step - 0.05),
              "step_over_first_preln": step * first,
              "step_over_first_preln_rounds": band(step * first)}]
  path = str(tmp_path / "bench.png")
  assert bench_plot.plot_bench(rows, path, {"hc": 1.2}, "t") == path
  step_ax, peak_ax, depth_ax = saved[0].axes
  heights = lambda ax: [pytest.approx(p.get_height()) for p in ax.patches]
  assert heights(step_ax) == [1.0, 1.3, 1.0, 1.4]              # shape by shape: preln, hc
  assert heights(peak_ax) == [1.0, 1.5, 1.0, 1.6]
  assert heights(depth_ax) == [1.0, 1.3, 1.1, 1.54]
  assert list(step_ax.lines[0].get_ydata()) == [1.0, pytest.approx(1.25)]  # 4x64's medians
  # The bar is the ratio of medians and the dot the per-round median (the title once called the
  # bar the median ratio).
  assert step_ax.get_title().startswith("train step / Pre-LN (bar: ratio of medians;\ndot,")
  # The whiskers span q1..q3 at each bar: 4x64's Pre-LN (no rounds: its bar) and HC.
  (whiskers,) = [c for c in step_ax.collections if c.get_label() == "_nolegend_"][:1]
  spans = [np.asarray(seg)[:, 1].tolist() for seg in whiskers.get_segments()]
  assert spans == [[1.0, 1.0], [pytest.approx(1.15), pytest.approx(1.55)]]
  ticks = [c.get_segments()[0] for c in step_ax.collections if c.get_label() != "_nolegend_"]
  assert len(ticks) == 1 and ticks[0].tolist() == [[pytest.approx(0.6), 1.2], [1.0, 1.2]]
  assert "target" in [t.get_text() for t in step_ax.get_legend().get_texts()]
  # No design with a target: no 'target' legend entry without its dashed line.
  bench_plot.plot_bench(rows, path, {"mhc": 1.2}, "t")
  legend = saved[-1].axes[0].get_legend()
  assert "target" not in [t.get_text() for t in legend.get_texts()] if legend else True


def test_bench_design_specs_carry_residual_overrides(capsys):
  """``--designs=mhc:sinkhorn_kernel=pallas`` times a design with changed residual fields;
  a malformed entry or an unknown design is one clear error naming the entry."""
  from depthbench_jax import bench
  assert bench.design_spec("mhc:sinkhorn_kernel=pallas:sinkhorn_iters=10") == (
      "mhc", {"sinkhorn_kernel": "pallas", "sinkhorn_iters": 10})
  assert bench.design_spec("hc:dynamic=false") == ("hc", {"dynamic": False})
  assert bench.design_spec("keel:alpha=0.5") == ("keel", {"alpha": 0.5})
  config = bench.bench_config(bench.PRESETS["quick"], "mhc:sinkhorn_kernel=pallas")
  assert config.model.residual["name"] == "mhc"
  assert config.model.residual["sinkhorn_kernel"] == "pallas"
  assert config.model.residual["sinkhorn_iters"] == 20                 # the default kept
  for spec, message in (("mhc:sinkhorn_kernel", "is not key=value"),
                        ("mhcc", "unknown design 'mhcc'; allowed: preln")):
    with pytest.raises(SystemExit):
      bench.main(["--preset", "quick", "--designs", spec])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("spec, message", [
    ("hc:bogus=3", "'hc:bogus=3' at 2x32: config.model.residual.bogus: not a field of design"),
    ("hc:n_streams=abc", "'hc:n_streams=abc' at 2x32: config.model.residual.n_streams='abc'")])
def test_bench_refuses_a_bad_residual_field_before_anything_compiles(tmp_path, capsys,
                                                                      monkeypatch, spec, message):
  """A typo in a design's override once ran the whole bench and listed that design as failed."""
  from depthbench_jax import bench
  monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("a bad flag reached run"))
  with pytest.raises(SystemExit):
    bench.main(["--preset=quick", f"--designs=preln,{spec}", "--out", str(tmp_path)])
  assert f"--designs entry {message}" in capsys.readouterr().err
  assert not os.listdir(tmp_path)


def test_bench_keeps_going_when_one_candidate_fails(tmp_path, monkeypatch, capsys):
  """A candidate that does not compile (an untried kernel) or fit is named as failed; the
  others are still timed and written."""
  from depthbench_jax import bench
  real = bench.compile_train_step

  def compile_or_fail(name, config):
    if name == "hc":
      raise RuntimeError("Triton lowering failed\nmore detail")
    return real(name, config)
  monkeypatch.setattr(bench, "compile_train_step", compile_or_fail)
  assert bench.main(["--preset", "quick", "--no_hf", "--rounds", "1", "--out", str(tmp_path),
                     "--designs", "preln,hc"]) == 0
  result = json.loads((tmp_path / "results-cpu-quick-designs.json").read_text())
  assert [r["design"] for r in result["train"]] == ["preln"]
  assert result["failed"] == {"hc 2x32": "RuntimeError: Triton lowering failed"}
  assert "| hc | 2x32 | failed: RuntimeError: Triton lowering failed |" in capsys.readouterr().out


def test_bench_names_the_attention_each_design_runs(monkeypatch):
  # What a GPU would pick (forced here): cuDNN for the backbone attention, padded where hd is
  # not a multiple of 8; MoDA attends with its own einsums whatever the kernel setting.
  from depthbench_jax import bench
  from depthbench_jax.model import layers
  monkeypatch.setattr(layers, "uses_cudnn_attention", lambda dtype, head_dim: True)
  fused = lambda design, d: dataclasses.replace(model_cfg(design, n_layers=2, d_model=d),
                                                attention_kernel="fused")
  assert bench.attention_impl(fused("preln", 76 * 4)) == "cudnn (hd 76 padded to 80)"
  assert bench.attention_impl(fused("hc", 64 * 4)) == "cudnn"
  assert bench.attention_impl(fused("moda", 64 * 4)) == "xla-blocked"
  assert bench.attention_impl(model_cfg("preln", n_layers=2)) == "xla-blocked"   # kernel 'xla'


def test_cudnn_check_fails_where_cudnn_cannot_run_and_passes_the_padded_path(capsys):
  from depthbench_jax.systems import cudnn_check
  small = ["--head_dims=12", "--batch=1", "--seq_len=64", "--heads=2", "--rounds=1"]
  assert cudnn_check.main(small) == 1          # No cuDNN on the CPU: the bench falls back.
  assert "error" in json.loads(capsys.readouterr().out)
  assert cudnn_check.main(small + ["--implementation=xla"]) == 0
  row = json.loads(capsys.readouterr().out)
  assert row["ok"] and max(row["max_rel_error"].values()) < 0.05 and row["cudnn_ms"] > 0


def test_cudnn_check_measures_a_wrong_kernel_against_the_blocked_reference(monkeypatch, capsys):
  """A kernel 10% off reads max_rel_error 0.1 in the output and every gradient, and the ratio is
  cuDNN's time over the blocked one's; such an error fails the default --tol (0.05, exit 1)
  and passes --tol=0.2."""
  from depthbench_jax.model.layers import causal_attention
  from depthbench_jax.systems import cudnn_check
  monkeypatch.setattr(cudnn_check, "padded_dot_product_attention",
                      lambda q, k, v, impl: causal_attention(q, k, v) * 1.1)
  row = cudnn_check.compare(8, batch=1, seq_len=16, heads=2, rounds=1)
  assert set(row["max_rel_error"]) == {"out", "dq", "dk", "dv"}
  for err in row["max_rel_error"].values():
    assert err == pytest.approx(0.1, abs=0.02)
  assert row["cudnn_over_blocked"] == pytest.approx(row["cudnn_ms"] / row["blocked_ms"])
  monkeypatch.setattr(cudnn_check, "compare", lambda *a: {"max_rel_error": {"out": 0.1}})
  assert cudnn_check.main(["--head_dims=8,12"]) == 1
  assert [json.loads(l)["ok"] for l in capsys.readouterr().out.splitlines()] == [False, False]
  assert cudnn_check.main(["--head_dims=8", "--tol=0.2"]) == 0


@pytest.mark.slow  # ~8 small compiles: ~30 s on 2 cores.
def test_bench_leaves_hf_out_off_the_cpu(monkeypatch):
  """HF runs on torch's CPU: on an accelerator ``--preset=cpu`` timed our step on the device
  against it and printed a meaningless ours/HF verdict. Off the CPU it is left out: ``main``
  drops it, saying so (``test_bench_on_an_accelerator_leaves_hf_out_as_no_hf``), and
  ``run_bench`` itself never times it there."""
  from depthbench_jax import bench
  monkeypatch.setattr(bench.jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(bench, "hf_runner", lambda *a: pytest.fail("HF timed off the CPU"))
  p = dataclasses.replace(bench.PRESETS["quick"], hf=True, designs=("preln",), rounds=1)
  result = bench.run_bench(p, log=lambda s: None)
  assert "hf_step_s" not in result["train"][0]


def test_bench_accelerator_preset_runs_in_miniature():
  """The gpu400m preset (bf16, attention_kernel='fused', two shapes, no HF) with only its
  sizes shrunk: the one device run a session may get must not be the first time this path
  runs. Off-GPU 'fused' runs the blocked attention; the train section is saved before the
  compile section starts."""
  from depthbench_jax import bench, bench_verdict
  p = dataclasses.replace(bench.PRESETS["gpu400m"], d_model=64, n_layers=2, n_heads=4,
                          vocab_size=128, seq_len=32, batch=2, shapes=("2x64", "4x48"),
                          rounds=2, matmul_n=128, matmul_reps=2, stream_mib=1, stream_reps=2,
                          compile_layers=(1, 2), compile_rounds=1)
  partial = []
  result = bench.run_bench(p, log=lambda s: None,
                           save_partial=lambda r: partial.append(sorted(r)))
  assert "train" in partial[0] and "compile" not in partial[0]
  assert {r["attention"] for r in result["train"]} == {"xla-blocked"}
  assert {(r["design"], r["shape"]) for r in result["train"]} == {
      (d, s) for d in ("preln", "hc") for s in ("2x64", "4x48")}
  for r in result["train"]:
    assert r["step_s"] > 0 and r["peak_bytes"] > 0 and np.isfinite(r["step_over_preln"])
  assert {c["check"] for c in result["verdict"]} >= {"MFU Pre-LN 2x64", "HC / Pre-LN step 2x64"}
  assert "hf_step_s" not in result["train"][0]
  # The cost of depth: every step over Pre-LN at the first shape, whose steps were timed again
  # in the second shape's rounds (its own there, not the first block's).
  first = result["first_preln_s_all"]
  assert len(first["4x48"]) == p.rounds and first["4x48"] != first["2x64"]
  for r in result["train"]:
    np.testing.assert_allclose(r["step_over_first_preln"],
                               np.median(r["step_s_all"]) / np.median(first[r["shape"]]))
  pre_first = next(r for r in result["train"] if r["design"] == "preln" and r["shape"] == "2x64")
  assert pre_first["step_over_first_preln_rounds"]["median"] == 1.0
  table = bench_verdict.render(result)
  assert "Cost of depth: step over Pre-LN at 2x64" in table and "| hc | " in table
  # Each shape's MFU is over the ceiling timed in its own rounds, and the header says so when
  # those differ (it once printed only the largest over the rows' MFUs).
  for r in result["train"]:
    assert r["mfu"] == pytest.approx(r["model_flops_per_s"] / r["matmul_peak_flops"])
  peaks = {r["shape"]: r["matmul_peak_flops"] for r in result["train"]}
  assert max(peaks.values()) == result["matmul_peak_flops"]
  assert (f"matmul peak (per shape) 2x64 {peaks['2x64'] / 1e9:.1f}, 4x48 "
          f"{peaks['4x48'] / 1e9:.1f} GFLOP/s") in table


def test_profile_step_names_model_parts():
  from depthbench_jax.systems import profile_step
  op = ("jit(train_step)/transpose(jvp(Transformer))/while/body/closed_call/checkpoint/layers/"
        "residual.sublayer/mlp/gate_proj/dot_general")
  assert profile_step.model_part(op, 2) == "bwd residual.sublayer/mlp"
  # jax 0.11 (the H200 profiles) names a call frame eval_jaxpr: a frame, not a model part.
  assert profile_step.model_part(op.replace("closed_call", "eval_jaxpr"), 2) == (
      "bwd residual.sublayer/mlp")
  assert profile_step.model_part("jit(train_step)/jvp(Transformer)/lm_head/dot_general",
                                 3) == "fwd lm_head/dot_general"


_HLO = """\
%fused_reduce.7 (p: f32[4]) -> f32[] {
  %p = f32[4]{0} parameter(0)
  %mul.1 = f32[4]{0} multiply(%p, %p), metadata={op_name="jit(f)/transpose(g)/mul"}
  ROOT %reduce.2 = f32[] reduce(%mul.1, %c), dimensions={0}
}

%fused_slice (stack: bf16[16,8,32], i: s32[]) -> f32[8,32] {
  %stack = bf16[16,8,32]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %ds = bf16[1,8,32]{2,1,0} dynamic-slice(%stack, %i, %z, %z), dynamic_slice_sizes={1,8,32}
  ROOT %cv = f32[8,32]{1,0} convert(%ds)
}

%fused_update (buf: f32[16,8,32], u: f32[1,8,32], i: s32[]) -> f32[16,8,32] {
  %buf = f32[16,8,32]{2,1,0} parameter(0)
  %u = f32[1,8,32]{2,1,0} parameter(1)
  %i.1 = s32[] parameter(2)
  %neg = f32[1,8,32]{2,1,0} negate(%u)
  ROOT %dus = f32[16,8,32]{2,1,0} dynamic-update-slice(%buf, %neg, %i.1, %z, %z)
}

ENTRY %main (x: f32[4], s: bf16[16,8,32], i: s32[], b: f32[16,8,32], u: f32[1,8,32]) -> f32[] {
  %x = f32[4]{0} parameter(0)
  %s = bf16[16,8,32]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %b = f32[16,8,32]{2,1,0} parameter(3)
  %u.2 = f32[1,8,32]{2,1,0} parameter(4)
  %dot.1 = f32[4,4]{1,0} dot(%x, %x), metadata={op_name="jit(f)/jvp(g)/mlp/dot"}
  %loop_slice_fusion = f32[8,32]{1,0} fusion(%s, %i), kind=kLoop, calls=%fused_slice
  %loop_dynamic_update_slice_fusion = f32[16,8,32]{2,1,0} fusion(%b, /*index=1*/%u.2, %i), kind=kLoop, calls=%fused_update
  %fusion.7 = (bf16[4,8]{1,0}, f32[]) fusion(%x), kind=kLoop, calls=%fused_reduce.7
  ROOT %input_reduce_fusion.7 = f32[] fusion(%x), kind=kInput, calls=%fused_reduce.7
}
"""


def test_hlo_text_names_shapes_and_bytes_of_ops():
  from depthbench_jax.systems import hlo_text, profile_step
  names = hlo_text.op_names(_HLO)
  assert names["dot.1"] == "jit(f)/jvp(g)/mlp/dot"
  # A fusion without metadata is named by the last named op of its fused computation.
  assert names["input_reduce_fusion.7"] == "jit(f)/transpose(g)/mul"
  assert profile_step.model_part(names["input_reduce_fusion.7"], 2) == "bwd mul"
  shapes = hlo_text.op_shapes(_HLO)
  assert shapes["dot.1"] == "f32[4,4]" and shapes["fusion.7"] == "(bf16[4,8]{1,0}, f32[])"
  assert hlo_text.type_bytes("(bf16[4,8]{1,0}, f32[])") == 4 * 8 * 2 + 4
  moved = hlo_text.op_bytes(_HLO)
  assert moved["dot.1"] == 4 * 4 * 4 + 4 * 4               # result + x (read once)
  # The layer's slice of the stack, not the stack: 8*32 bf16 in, 8*32 f32 out, the index.
  assert moved["loop_slice_fusion"] == 8 * 32 * 2 + 8 * 32 * 4 + 4
  # In place: the update written, the update read; the 16-slot buffer not copied.
  assert moved["loop_dynamic_update_slice_fusion"] == 8 * 32 * 4 * 2 + 4


_HLO_MORE = """\
%fused_two (stack: f32[4,8], i: s32[]) -> f32[8] {
  %stack = f32[4,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %ds = f32[1,8]{1,0} dynamic-slice(%stack, %i, %z), dynamic_slice_sizes={1,8}
  %neg = f32[4,8]{1,0} negate(%stack), metadata={op_name="jit(f)/first/neg"}
  ROOT %add = f32[8]{0} add(%ds, %neg), metadata={op_name="jit(f)/second/add"}
}

ENTRY %main (s: f32[4,8], i: s32[], h: f16[2,3], u: f32[1,8]) -> f16[2,3] {
  %s = f32[4,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %h = f16[2,3]{1,0} parameter(2)
  %u = f32[1,8]{1,0} parameter(3)
  %two_fusion = f32[8]{0} fusion(%s, %i), kind=kLoop, calls=%fused_two
  %dus = f32[4,8]{1,0} dynamic-update-slice(%s, %u, %i, %i)
  ROOT %cv = f32[2,3]{1,0} convert(%h)
}
"""


def test_hlo_text_whole_operands_unfused_updates_and_the_root_most_name():
  """A stacked operand that the fusion also reads whole counts whole; an unfused
  dynamic-update-slice writes (and reads) only its update; a fusion without metadata takes the
  op_name of the *last* named op of its computation; every dtype has its own width."""
  from depthbench_jax.systems import hlo_text
  assert hlo_text.op_names(_HLO_MORE)["two_fusion"] == "jit(f)/second/add"
  moved = hlo_text.op_bytes(_HLO_MORE)
  assert moved["two_fusion"] == 8 * 4 + 4 * 8 * 4 + 4        # result, the whole stack, i
  assert moved["dus"] == 8 * 4 + 8 * 4 + 4                   # update written and read, i once
  assert moved["cv"] == 2 * 3 * 4 + 2 * 3 * 2                # f32 out, f16 in
  assert hlo_text.type_bytes("(pred[8], s8[2], u16[3], f16[2], f64[1], s64[], u64[2])") == (
      8 + 2 + 6 + 4 + 8 + 8 + 16)


def test_profile_step_part_difference_orders_by_added_time():
  from depthbench_jax.systems import profile_step
  fwd = "jit(step)/jvp(T)/layers/"
  ops = {"a": (0.010, fwd + "residual.maps/dot"), "b": (0.004, fwd + "mlp/dot"),
         "c": (0.0015, fwd + "residual.skip/add")}
  base = {"x": (0.003, fwd + "mlp/dot"), "y": (0.002, fwd + "residual.read/mul")}
  rows = profile_step.part_difference(ops, base, 1)
  assert [(p, round(a * 1e3, 3), round(b * 1e3, 3)) for p, a, b in rows] == [
      ("fwd residual.maps", 10.0, 0.0), ("fwd residual.skip", 1.5, 0.0),
      ("fwd mlp", 4.0, 3.0), ("fwd residual.read", 0.0, 2.0)]


def test_profile_step_unmapped_ops_top_level_bandwidth_and_gpu_kernel_names():
  """An unmapped kernel keeps its label; an op of no module is '(top level)'; bandwidth is
  bytes per call x calls over the time (0 for an op of no time); a GPU event is named by its
  ``hlo_op`` stat, else by itself."""
  from depthbench_jax.systems import profile_step
  assert profile_step.model_part(profile_step.UNMAPPED, 2) == profile_step.UNMAPPED
  assert profile_step.model_part("jit(train_step)/jvp(Transformer)/while/body", 2) == (
      "fwd (top level)")
  result = {"ops": {"f": (0.002, "x"), "idle": (0.0, "x")}, "bytes": {"f": 1e6, "idle": 1e6},
            "calls": {"f": 4, "idle": 1}}
  assert profile_step.bandwidth(result, "f") == pytest.approx(2.0)   # 4 x 1 MB in 2 ms
  assert profile_step.bandwidth(result, "idle") == 0.0

  class Event:
    name, stats = "sm90_xmma_gemm_bf16", [("correlation_id", 7), ("hlo_op", "dot.3")]

  event_name = profile_step._event_name  # pylint: disable=protected-access
  assert event_name(Event) == "dot.3"
  Event.stats = [("correlation_id", 7)]
  assert event_name(Event) == "sm90_xmma_gemm_bf16"


def test_profile_step_refuses_a_bad_design_field_before_profiling(monkeypatch, capsys):
  """A typo in --baseline's override once profiled --design first, then died in a traceback."""
  from depthbench_jax.systems import profile_step
  monkeypatch.setattr(profile_step, "profile", lambda *a, **k: pytest.fail("profiled"))
  with pytest.raises(SystemExit):
    profile_step.main(["--design=hc", "--preset=quick", "--baseline=preln:n_streams=2"])
  assert ("--baseline entry 'preln:n_streams=2' at 2x32: config.model.residual.n_streams: not "
          "a field of design 'preln'") in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps=0", "--steps=-1", "--top=-1", "--top=0",
                                  "--depth=-2"])
def test_profile_step_refuses_counts_below_one_before_profiling(monkeypatch, capsys, flag):
  """--steps=0 once compiled and ran the step, then died dividing the trace by 0 steps;
  --top=-1 listed every part but the last, --depth=-2 cut the parts' names, both after the
  profile and without a word."""
  from depthbench_jax.systems import profile_step
  monkeypatch.setattr(profile_step, "profile", lambda *a, **k: pytest.fail("profiled"))
  with pytest.raises(SystemExit):
    profile_step.main(["--design=hc", "--preset=quick", flag])
  assert f"{flag}; allowed: an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("hlo_out, said", [("{tmp}", "a folder"),
                                             ("{tmp}/none/step.hlo", "no folder {tmp}/none")])
def test_profile_step_refuses_an_hlo_out_it_cannot_write_before_profiling(
    monkeypatch, capsys, tmp_path, hlo_out, said):
  """Written after the compile and the profiled steps: a FileNotFoundError / IsADirectoryError
  traceback at the end of the work."""
  from depthbench_jax.systems import profile_step
  monkeypatch.setattr(profile_step, "profile", lambda *a, **k: pytest.fail("profiled"))
  hlo_out, said = hlo_out.format(tmp=tmp_path), said.format(tmp=tmp_path)
  with pytest.raises(SystemExit):
    profile_step.main(["--preset=quick", f"--hlo_out={hlo_out}"])
  assert (f"error: --hlo_out={hlo_out}: {said}; allowed: a file path in an existing folder"
          in capsys.readouterr().err)


@pytest.mark.parametrize("flag, allowed", [
    ("--head_dims=76,x", "positive integers, comma-separated"),
    ("--head_dims=76,56,", "positive integers, comma-separated"),
    ("--rounds=0", "an integer >= 1")])
def test_cudnn_check_refuses_a_bad_flag_as_a_usage_error_not_a_failed_check(
    monkeypatch, capsys, flag, allowed):
  """gpu_bench.sh reads any failure as 'cuDNN cannot run here': a typo was a traceback, and
  --rounds=0 an 'error' row and exit 1, a failed check."""
  from depthbench_jax.systems import cudnn_check
  monkeypatch.setattr(cudnn_check, "compare", lambda *a, **k: pytest.fail("compared"))
  with pytest.raises(SystemExit) as exit_:
    cudnn_check.main([flag])
  assert exit_.value.code == 2
  assert f"error: {flag}; allowed: {allowed}" in capsys.readouterr().err


def test_the_timed_step_donates_its_state_and_waits_for_its_result(monkeypatch):
  """The bench's step is training's (the state donated: without it the peak counted the
  optimiser state twice) and each timed call waits for the step's loss (without it a round
  timed the dispatch alone under async dispatch); neither was checked."""
  from depthbench_jax import bench
  c = bench.compile_train_step("preln", bench.bench_config(bench.PRESETS["quick"], "preln"))
  assert c.step.memory_analysis().alias_size_in_bytes > 0
  waited = []
  real_wait = bench.jax.block_until_ready
  monkeypatch.setattr(bench.jax, "block_until_ready", lambda x: waited.append(x) or real_wait(x))
  old = c.state
  bench.step_runner(c)()
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old.params))
  assert len(waited) == 1 and waited[0].shape == () and waited[0] is not None


def test_the_hf_baseline_runs_a_whole_train_step():
  """hf_runner's step was timed but never checked to train: without loss.backward() (AdamW and
  the clip skip a gradient-less parameter) it passed, a faster HF step lowering ours/HF."""
  torch = helpers.required("torch")
  helpers.required("transformers")
  from depthbench_jax import bench
  from depthbench_jax.model.config import model_config_from
  config = bench.bench_config(bench.PRESETS["quick"], "preln")
  run = bench.hf_runner(model_config_from(config.model), config)
  assert torch.get_num_threads() == len(os.sched_getaffinity(0))
  (model,) = [c.cell_contents for c in run.__closure__
              if isinstance(c.cell_contents, torch.nn.Module)]   # the step's own model
  before = [p.detach().clone() for p in model.parameters()]
  run()
  assert all(p.grad is not None for p in model.parameters())
  moved = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())]
  assert all(moved), sum(moved)


def test_hf_baseline_is_our_shape_and_builds_no_kv_cache_in_training():
  # The ours/HF comparison: same parameter count, and HF's training forward carries no KV cache
  # (LlamaConfig's default use_cache=True copied K and V in every layer, favouring us).
  torch = helpers.required("torch")
  helpers.required("transformers")
  from depthbench_jax.bench import hf_llama
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.model.transformer import count_params
  from tests.helpers import tiny_config
  cfg = model_config_from(tiny_config().model)
  model = hf_llama(cfg).train()
  assert sum(p.numel() for p in model.parameters()) == count_params(cfg)["total"]
  out = model(input_ids=torch.zeros((1, 8), dtype=torch.long))
  assert getattr(out, "past_key_values", None) is None


def test_report_section_says_why_a_systems_json_of_another_prefill_length_is_not_merged(tmp_path):
  """systems --seq_len=256 beside the runs once left the XLA and peak columns '-' with no word
  why; the section now names the file's length and the command that fills the columns."""
  import shutil
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems import report_section
  runs = tmp_path / "results_small"
  shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "results_small"), runs)
  row = {"design": "preln", "shape": "16x1216", "xla_flops": 1.0e15, "peak_bytes": 2 ** 33}
  (runs / "systems.json").write_text(json.dumps({"seq_len": 256, "rows": [row]}))
  section = report_section.systems_table(scorecard.collect_runs(str(runs)))
  preln_row = next(l for l in section.splitlines() if l.startswith("| preln | 16x1216 |"))
  assert "| 1000 |" not in preln_row and preln_row.count("| - |") == 2  # XLA, peak: not merged.
  assert f"{runs / 'systems.json'} is at prefill T=256, not this table's T=4096" in section
  assert "--seq_len=4096" in section


@pytest.mark.parametrize("setting, named", [({"batch": 8}, "batch 8"),
                                            ({"dtype": "float32"}, "float32")])
def test_report_section_does_not_merge_a_systems_json_of_another_batch_or_dtype(tmp_path, setting,
                                                                                named):
  """systems --batch=8 (or --dtype=float32) beside the runs once put that compile's peak memory
  into the report's table, which says batch 1, bfloat16; the file is now named, not merged."""
  import shutil
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems import report_section
  runs = tmp_path / "results_small"
  shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "results_small"), runs)
  row = {"design": "preln", "shape": "16x1216", "xla_flops": 1.0e15, "peak_bytes": 2 ** 33,
         "batch": 1, "dtype": "bfloat16", **setting}
  (runs / "systems.json").write_text(json.dumps({"seq_len": 4096, "rows": [row]}))
  section = report_section.systems_table(scorecard.collect_runs(str(runs)))
  preln_row = next(l for l in section.splitlines() if l.startswith("| preln | 16x1216 |"))
  assert "| 8.00 |" not in preln_row and preln_row.count("| - |") == 2  # XLA, peak: not merged.
  assert f"{runs / 'systems.json'} is at prefill {named}, not this table's" in section


def test_report_section_does_not_merge_another_models_row_of_the_same_design_and_shape(tmp_path):
  """A run with its own option (HC with n_streams=2, an n_kv_heads) matched the suite's
  systems.json row by (design, shape) alone and showed that model's XLA FLOPs, peak memory and
  measured device-hours beside its own parameter count; a row of another count is named."""
  import shutil
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems import report_section
  runs = tmp_path / "results_small"
  shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "results_small"), runs)
  row = {"design": "preln", "shape": "16x1216", "xla_flops": 1.0e15, "peak_bytes": 2 ** 33,
         "batch": 1, "dtype": "bfloat16"}
  timed = {"design": "preln", "shape": "16x1216", "n_layers": 16, "device": "fakedev",
           "source": "b.json", "commit": "abc", "batch": 8, "seq_len": 2048, "dtype": "bfloat16",
           "step_s": 0.1, "tokens_per_s": 1e5, "step_over_preln": 1.0,
           "step_over_preln_iqr": [1.0, 1.0], "mfu_at_peak": 0.2,
           "device_hours_measured": 25.0, "device_hours_analytic": 13.0, "mfu_assumed": 0.4}
  for params, merged in ((None, True), (123, False)):
    extra = {} if params is None else {"params_total": params}
    (runs / "systems.json").write_text(json.dumps({"seq_len": 4096, "rows": [{**row, **extra}],
                                                   "measured": [timed]}))
    section = report_section.systems_table(scorecard.collect_runs(str(runs)))
    preln_row = next(l for l in section.splitlines() if l.startswith("| preln | 16x1216 |"))
    assert (preln_row.count("| - |") == 0) == merged, preln_row
    assert ("| preln | 16x1216 | fakedev |" in section) == merged
    assert ("Not merged: preln 16x1216 of systems.json holds 123 parameters" in section) == (
        not merged)


def test_report_section_budgets_a_fixed_steps_suite_by_its_steps():
  """The smoke sweep fixes 120 steps; the section costed its runs at 20 tokens per parameter
  (450x the dry run's device-hours) under 'Chinchilla tokens'."""
  from depthbench_jax.systems import report_section
  model = {"vocab_size": 64, "n_heads": 4, "max_seq_len": 128, "residual": {"name": "preln"}}
  config = {"model": model, "steps": 40, "data": {"global_batch_size": 8, "seq_len": 128}}
  record = {"design": "preln", "n_layers": 4, "d_model": 64, "config": config, "workdir": ""}
  section = report_section.systems_table([record])
  assert "training at T=128, the suite's steps x batch x T tokens," in section
  cfg = model_cfg("preln", n_layers=4, d_model=64, seq=128)
  fixed = costs.cost_row(cfg, seq_len=4096, train_seq_len=128, tokens_per_param=20.0,
                         peak_flops=1e15, mfu=0.4, train_tokens=40 * 8 * 128)
  budget = costs.cost_row(cfg, seq_len=4096, train_seq_len=128, tokens_per_param=20.0,
                          peak_flops=1e15, mfu=0.4)
  assert fixed["train_tokens"] == 40 * 8 * 128 and fixed["train_tokens_from"] == "steps"
  assert fixed["device_hours"] == pytest.approx(
      budget["device_hours"] * 40 * 8 * 128 / budget["train_tokens"])


def test_depth_cost_summary_reads_shallow_to_deep_within_each_scale_family():
  """A multi-scale sweep (configs/suite_multiscale.py: 16/32/48 layers at 200M, 300M, 500M) once
  got one summary line per design from the 200M 16-layer shape to the 500M 48-layer one, its
  'cost of depth' mostly the cost of 2.4x the parameters; each scale family now gets its own."""
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems import report_section
  model = {"vocab_size": 64, "n_heads": 4, "max_seq_len": 128, "residual": {"name": "preln"}}
  records = [{"design": "preln", "n_layers": L, "d_model": d, "config": {"model": model},
              "workdir": ""} for L, d in ((4, 64), (8, 48), (4, 256), (8, 192))]
  scorecard.assign_families(records)   # as the report does before its sections
  section = report_section.systems_table(records)
  assert "| preln | 4x64 -> 8x48 |" in section and "| preln | 4x256 -> 8x192 |" in section
  assert "4x64 -> 8x192" not in section


def test_context_curve_kv_bytes_in_the_asked_dtype(tmp_path):
  """--dtype=float32 once wrote the rows' KV cache in fp32 and the curve's beside them in bf16."""
  from depthbench_jax.systems import __main__ as cli
  result = cli.build(os.path.join(ROOT, "configs", "smoke.py"), 64, designs=["preln"],
                     shapes=["4x128"], with_xla=False, dtype="float32", log=lambda s: None)
  cfg = cli.suite_configs(os.path.join(ROOT, "configs", "smoke.py"), ["preln"], ["4x128"])[1][0][2]
  for point in result["curve"]:
    assert point["kv_cache_bytes"] == costs.kv_cache_bytes(
        model_config_from(cfg.model), point["seq_len"], dtype="float32")
  # The counts the curve plots, by hand (nothing read them: a curve at one T, or bidirectional,
  # passed): N_matmul = 4 (128 x 32 x 16 + 3 x 128 x 384) + 128 x 257 = 884,864, and a causal
  # prefill is T (2 N_matmul + 2 L T d): the T^2 L d term.
  flops = {p["seq_len"]: p["prefill_flops_causal"] for p in result["curve"]}
  assert flops[2048] == 2048 * (2 * 884_864 + 2 * 4 * 2048 * 128) == 7_919_370_240
  assert flops[131072] == 131072 * (2 * 884_864 + 2 * 4 * 131072 * 128) == 17_824_147_832_832


def _unserialisable():
  """A result json cannot write (a cycle), whatever ``default=``: the write fails midway, as a
  kill or a full disk would."""
  result = {"rows": []}
  result["self"] = result
  return result


@pytest.mark.parametrize("tool", ["bench", "decode_bench"])
def test_a_failed_result_write_keeps_the_last_result(tmp_path, monkeypatch, tool):
  """The bench's and decode bench's result files are written whole or not at all: a write that
  failed midway (json.dump streaming into the opened file) left the finished result truncated."""
  from depthbench_jax import bench
  from depthbench_jax.systems import decode_bench
  if tool == "bench":
    module, name, entry = bench, "results-cpu-quick-designs.json", "run_bench"
    earlier = {"preset": {"designs": ["preln"], "shapes": []}}
    argv = ["--preset=quick", "--designs=preln", "--out", str(tmp_path)]
  else:
    module, name, entry = (decode_bench, "results-cpu-quick-designs-shapes-decode-contexts.json",
                           "run")
    preset = json.loads(json.dumps(dataclasses.asdict(bench.PRESETS["quick"])))  # tuples: lists
    earlier = {"batch": 1, "preset": preset, "rows": [
        {"design": "preln", "shape": "2x32", "context": 8, "loop": "unrolled"}]}
    argv = ["--preset=quick", "--designs=preln", "--shapes=2x32", "--contexts=8",
            "--out", str(tmp_path)]
  monkeypatch.setattr(module, entry, lambda *a, **k: _unserialisable())
  (tmp_path / name).write_text(json.dumps(earlier))
  with pytest.raises(ValueError, match="[Cc]ircular"):
    module.main(argv)
  assert json.loads((tmp_path / name).read_text()) == earlier
  assert sorted(p.name for p in tmp_path.iterdir()) == [name]   # no temp file left beside it


def test_a_failed_systems_write_keeps_the_last_table(tmp_path, monkeypatch):
  """systems.json and systems.md are written whole or not at all, the JSON first."""
  from depthbench_jax.systems import __main__ as cli
  out = tmp_path / "sys"
  argv = ["--config", os.path.join(ROOT, "configs", "smoke.py"), "--seq_len", "64",
          "--designs", "preln", "--shapes", "4x128", "--xla", "false", "--out", str(out)]
  assert cli.main(argv) == 0
  before = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix != ".png"}
  real_build = cli.build
  def build_then_cycle(*args, **kwargs):
    result = real_build(*args, **kwargs)
    result["rows"][0]["self"] = result
    return result
  monkeypatch.setattr(cli, "build", build_then_cycle)
  with pytest.raises(ValueError, match="[Cc]ircular"):
    cli.main(argv)
  assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix != ".png"} == before


def test_report_section_names_a_run_whose_design_is_not_registered():
  """A run of a design this checkout does not register (an eleventh design's runs, read on a
  branch without it) is named under the table with the reason, not dropped without a word."""
  from depthbench_jax.residual import registry
  from depthbench_jax.systems import report_section
  record = lambda design: {"design": design, "n_layers": 2, "d_model": 64, "config": {
      "model": {"vocab_size": 64, "n_heads": 4, "residual": {"name": design}}}}
  section = report_section.systems_table([record("preln"), record("rezero_gone")])
  assert "| preln | 2x64 |" in section and "| rezero_gone |" not in section
  assert ("Left out, their config does not validate in this checkout: rezero_gone 2x64 "
          f"(config.model.residual.name='rezero_gone'; allowed: {', '.join(registry.names())})."
          ) in section
  alone = report_section.systems_table([record("rezero_gone")])
  assert alone.startswith("Left out, their config does not validate in this checkout: "
                          "rezero_gone 2x64")


def test_bench_plot_title_names_an_accelerator_by_its_device_not_its_host(monkeypatch, tmp_path):
  """An H200 run's picture read "nvidia-h200 (Intel(R) Xeon(R) Processor)", the host's CPU."""
  from depthbench_jax import bench, bench_plot
  titles = []
  monkeypatch.setattr(bench_plot, "plot_bench", lambda rows, path, targets, title:
                      titles.append(title) or path)
  result = {"device": "nvidia-h200", "device_kind": "NVIDIA H200", "backend": "gpu",
            "host_cpu": "Intel(R) Xeon(R) Processor", "train": [], "targets": {},
            "preset": {"dtype": "bfloat16", "batch": 8, "seq_len": 2048, "rounds": 10},
            "code": {"commit": "a" * 40, "dirty": False}}
  bench.write_plot(result, str(tmp_path / "r.json"))
  bench.write_plot(dict(result, backend="cpu", device="cpu"), str(tmp_path / "c.json"))
  assert titles[0].startswith("nvidia-h200 (NVIDIA H200), bfloat16")
  assert titles[1].startswith("cpu (Intel(R) Xeon(R) Processor), bfloat16")


def test_cli_a_shape_the_model_refuses_is_named_as_the_shape(tmp_path, capsys):
  """--shapes=3x100 (d=100 over the smoke suite's 4 heads) said only "config.model.head_dim=25",
  a field the user never set."""
  from depthbench_jax.systems import __main__ as cli
  assert cli.main(["--config", os.path.join(ROOT, "configs", "smoke.py"), "--shapes", "3x100",
                   "--xla", "false", "--out", str(tmp_path / "sys")]) == 2
  assert capsys.readouterr().err.startswith("error: --shapes: 3x100 gives config.model.head_dim=25")
  assert not (tmp_path / "sys").exists()
  # A shape that does not parse said "shape='4x'; allowed: ..." without the flag.
  assert cli.main(["--config", os.path.join(ROOT, "configs", "smoke.py"), "--shapes", "4x",
                   "--xla", "false", "--out", str(tmp_path / "sys")]) == 2
  assert capsys.readouterr().err.startswith("error: --shapes: shape='4x'; allowed: 'LxD'")
  # A config with no shapes of its own: --shapes cannot help it, so the error does not offer it.
  assert cli.main(["--config", os.path.join(ROOT, "configs", "base.py"), "--xla", "false",
                   "--out", str(tmp_path / "sys")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "has neither a sweep nor SHAPE_SETS; allowed: a suite file" in err[0]
  assert "--shapes" not in err[0]
  # With --shapes too (its get_config refusing the shape argument was blamed on --shapes).
  assert cli.main(["--config", os.path.join(ROOT, "configs", "base.py"), "--shapes=4x128",
                   "--xla", "false", "--out", str(tmp_path / "sys")]) == 2
  assert capsys.readouterr().err.strip().splitlines() == err
  assert cli.comma_list("4x128, 4x128,8x96,") == ["4x128", "8x96"]   # two identical rows once


def test_shapes_of_two_scales_are_two_families_by_the_suites_shape_sets(tmp_path):
  """16x800 (205M, the 200M set) and 48x640 (302M, the 300M set), one width per depth: guessed
  from sizes they were one family, and the depth summary read x1.82 'at iso-parameters'. The
  suite's SHAPE_SETS decide; a shape typed outside them falls back to the size rule."""
  from depthbench_jax import sweep
  from depthbench_jax.systems import __main__ as systems_main
  multiscale = sweep.load_config_module(os.path.join(ROOT, "configs", "suite_multiscale.py"))
  assert systems_main.shape_set_families(multiscale, ["16x800", "48x640", "48x512"]) == {
      "16x800": 0, "48x640": 1, "48x512": 0}
  assert systems_main.shape_set_families(multiscale, ["16x800", "16x801"]) is None
  result = systems_main.build(os.path.join(ROOT, "configs", "suite_multiscale.py"), 256,
                              designs=["preln"], shapes=["16x800", "48x640"], with_xla=False,
                              log=lambda *_: None)
  assert {r["shape"]: r["family"] for r in result["rows"]} == {"16x800": 0, "48x640": 1}
