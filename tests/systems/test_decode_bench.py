"""The decode bench: what it times is a real greedy decode step, the bytes it reads are counted
by hand, its ratios pair rounds against the right Pre-LN, and bad flags fail before any compile.
(No thresholds: the bench only measures.)"""

from __future__ import annotations

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from depthbench_jax import bench
from depthbench_jax.model import decode
from depthbench_jax.model.transformer import init_params
from depthbench_jax.systems import decode_bench
from depthbench_jax.systems.decode_bench import Case
from tests import helpers

QUICK = bench.PRESETS["quick"]   # d 32, 2 heads, vocab 64, float32


@pytest.mark.parametrize("design", ["hc", "moda"])
def test_the_timed_step_is_greedy_decoding_at_the_context_and_repeats_itself(design,
                                                                              monkeypatch):
  """Each ``token()`` call decodes the position after the prompt's greedy token, from the same
  cache: the ids equal ``greedy_generate``'s second token, call after call; ``prefill()`` gives
  its first. (MoDA: its own cached attention over sequence and depth keys.) The weights are
  the init's x 30: sharp enough that decoding at the wrong position changes the ids."""
  from depthbench_jax.model import transformer
  sharp = lambda cfg, key: jax.tree.map(lambda a: 30.0 * a, init_params(cfg, key))
  monkeypatch.setattr(transformer, "init_params", sharp)
  batch, context = 2, 12
  case = Case(design, "2x32", context, "unrolled")  # Scanned decoding: test_decode.py.
  prepared = decode_bench.prepare(QUICK, case, batch)
  cfg = decode_bench.decode_config(QUICK, case)
  params = nn.unbox(sharp(cfg, jax.random.PRNGKey(0)))
  prompt = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (batch, context), 0,
                                         cfg.vocab_size))
  generated = decode.greedy_generate(cfg, params, prompt.tolist(), 2, pad_to=4)
  first, second = [g[0] for g in generated], [g[1] for g in generated]
  assert list(prepared.prefill()) == first
  for _ in range(3):
    assert list(prepared.token()) == second


def test_bytes_per_step_counts_every_weight_once_the_table_rows_and_the_cache():
  batch, context = 3, 20
  cfg = decode_bench.decode_config(QUICK, Case("preln", "2x32", context, "scan"))
  params = nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))
  d, v, L, f = 32, 64, 2, cfg.ffn_dim
  layer = 4 * d * d + 3 * d * f + 2 * d          # q, k, v, o; gate, up, down; two norm gains
  weights = L * layer + d + d * v + batch * d     # + final norm, LM head, looked-up rows
  kv = 2 * L * d * (context + 1) * batch
  assert decode_bench.bytes_per_step(cfg, params, context, batch) == 4 * (weights + kv)
  tied = dataclasses.replace(cfg, tie_embeddings=True)   # no LM head; the table read whole
  tied_params = nn.unbox(init_params(tied, jax.random.PRNGKey(0)))
  assert decode_bench.bytes_per_step(tied, tied_params, context, batch) == 4 * (
      L * layer + d + v * d + kv)


def _case(design, shape, context=8, loop="scan"):
  return Case(design, shape, context, loop)


def test_each_case_is_read_against_preln_at_the_first_shape_with_its_context_and_loop():
  cases = [_case(d, s, c, loop) for c in (8, 16) for loop in ("scan", "unrolled")
           for s in ("2x32", "4x16") for d in ("hc", "preln")]
  anchor_of = decode_bench.anchors(cases)
  for c in cases:
    assert anchor_of[c] == _case("preln", "2x32", c.context, c.loop)
  without_preln = [_case("hc", "2x32"), _case("mhc", "2x32"), _case("hc", "4x16")]
  assert set(decode_bench.anchors(without_preln).values()) == {_case("hc", "2x32")}


def test_without_preln_at_the_first_shape_the_first_case_is_the_anchor():
  """A Pre-LN at another shape is no anchor: ratios are to the first shape's first design."""
  cases = [_case("hc", "2x32"), _case("preln", "4x16"), _case("hc", "4x16")]
  assert set(decode_bench.anchors(cases).values()) == {_case("hc", "2x32")}


def test_decode_config_is_the_cases_shape_loop_and_context():
  """Scanned or unrolled layers by the case's loop, positions for the context and one token."""
  for loop, scanned in (("scan", True), ("unrolled", False)):
    cfg = decode_bench.decode_config(QUICK, Case("hc", "4x32", 12, loop))
    assert (cfg.n_layers, cfg.d_model, cfg.design) == (4, 32, "hc")
    assert cfg.scan_layers is scanned and cfg.max_seq_len == 13


def test_an_entry_given_twice_is_one_case():
  # A shape in another spelling too ('02x32': a second case of one shape, recorded apart once).
  cases = decode_bench.parse_cases(QUICK, "preln,preln", "2x32,2x32,02x32", "16,16", "unrolled")
  assert [c.name for c in cases] == ["preln@2x32@ctx16@unrolled"]


def test_cases_are_context_major_then_loop_shape_design():
  names = [c.name for c in decode_bench.parse_cases(QUICK, "preln,hc", "2x32,4x16", "8,16",
                                                    "scan,unrolled")]
  assert len(names) == 16 and names[:5] == [
      "preln@2x32@ctx8@scan", "hc@2x32@ctx8@scan", "preln@4x16@ctx8@scan", "hc@4x16@ctx8@scan",
      "preln@2x32@ctx8@unrolled"]
  assert names[8] == "preln@2x32@ctx16@scan"


def test_the_map_check_keeps_one_and_a_half_cases_free_until_the_last_compile():
  """Before each further compile, held + 1.5 x the largest case must fit under the limit; after
  the last case nothing is left to compile, so nothing stops."""
  check = decode_bench._check_maps  # pylint: disable=protected-access
  check(2, 3, 1_999, 3_500, 1_000)            # 1,999 + 1,500 fits
  with pytest.raises(decode_bench.TooManyMaps, match="after compiling 2 of 3 cases"):
    check(2, 3, 2_001, 3_500, 1_000)
  check(3, 3, 3_400, 3_500, 1_000)            # all compiled


def test_rows_are_ratios_of_medians_with_round_paired_bands():
  a, b = _case("preln", "2x32"), _case("preln", "4x16")
  prepared = [decode_bench.Prepared(case=c, cfg=decode_bench.decode_config(QUICK, c),
                                    token=None, prefill=None, compile_s=1.0, params=10,
                                    bytes_per_step=n)
              for c, n in ((a, 1000), (b, 500))]
  times = {f"{a.name}/token": [1.0, 2.0, 3.0], f"{a.name}/prefill": [4.0, 2.0, 4.0],
           f"{b.name}/token": [3.0, 2.0, 9.0], f"{b.name}/prefill": [2.0, 2.0, 4.0]}
  first, deep = decode_bench.rows_from_times(prepared, times, batch=2)
  assert first["token_over_anchor"] == 1.0 and first["anchor"] == a.name
  assert deep["token_ms"] == 3000.0 and deep["tokens_per_s"] == pytest.approx(2 / 3)
  assert deep["token_over_anchor"] == pytest.approx(3.0 / 2.0)
  # Per-round ratios 3, 1, 3: quartiles (inclusive) 2, 3, 3.
  assert deep["token_over_anchor_rounds"] == pytest.approx({"q1": 2.0, "median": 3.0, "q3": 3.0})
  assert deep["prefill_over_anchor"] == 0.5
  # Prefill's own per-round ratios 0.5, 1, 1 (the token band, or one upside down, differs).
  assert deep["prefill_over_anchor_rounds"] == pytest.approx(
      {"q1": 0.75, "median": 1.0, "q3": 1.0})
  assert deep["read_gb_per_s"] == pytest.approx(500 / 3.0 / 1e9)
  assert deep["prefill_tokens_per_s"] == pytest.approx(2 * 8 / 2.0)
  assert deep["anchor_bytes_ratio"] == 0.5 and (deep["n_layers"], deep["d_model"]) == (4, 16)
  # The header names the anchor: the first design where Pre-LN is not among them.
  result = {"preset": {"dtype": "float32", "vocab_size": 64}, "device": "cpu", "host_cpu": "x",
            "cpu_count": 2, "jax": "0", "batch": 2, "rounds": 3, "rows": [first, deep]}
  assert "| x first Pre-LN (IQR) |" in decode_bench.render(result)
  hc = [dict(r, design="hc") for r in (first, deep)]
  assert "| x first hc (IQR) |" in decode_bench.render(dict(result, rows=hc))


@pytest.mark.parametrize("flag,value,message", [
    ("--designs", "pre_ln", "unknown design 'pre_ln'"),
    ("--designs", "preln,hc:n_stream=2", "'hc:n_stream=2' at 8x512: config.model.residual."
     "n_stream: not a field of design 'hc'"),
    ("--shapes", "2x32,3x17", "'3x17': d_model 17 is not a multiple"),
    # Quick's 2 heads over d=30: an odd head_dim, which no design takes (it named --designs).
    ("--shapes", "2x30", "error: --shapes entry '2x30': config.model.head_dim=15"),
    ("--contexts", "16,0", "--contexts entry '0': allowed: positive integers"),
    ("--loops", "scan,unroll", "--loops entry 'unroll': allowed: scan, unrolled"),
    ("--contexts", ",", "--contexts: empty"),
    ("--batch", "0", "--batch 0 / --rounds 15: allowed: positive integers"),
])
def test_bad_flags_fail_before_anything_compiles(tmp_path, capsys, monkeypatch, flag, value,
                                                 message):
  monkeypatch.setattr(decode_bench, "run", lambda *a, **k: pytest.fail("a bad flag reached run"))
  with pytest.raises(SystemExit):
    decode_bench.main(["--preset=quick", flag, value, "--out", str(tmp_path)])
  assert message in capsys.readouterr().err
  assert not list(tmp_path.iterdir())


def test_a_result_of_other_cases_is_not_replaced_without_overwrite(tmp_path, capsys,
                                                                    monkeypatch):
  """--designs=preln,hc then --designs=preln,mhc write one file name: the second run once
  replaced the first without a word. The same cases, or --overwrite, still replace it."""
  helpers.stub_run(monkeypatch, decode_bench, "run")
  earlier = tmp_path / "results-cpu-quick-designs-shapes-decode-contexts.json"
  quick = {k: getattr(bench.PRESETS["quick"], k) for k in decode_bench.DECODE_PRESET_FIELDS}
  earlier.write_text(json.dumps({"batch": 1, "preset": quick, "rows": [
      {"design": d, "shape": "2x32", "context": 8, "loop": "unrolled"} for d in ("preln", "hc")]}))
  flags = ["--preset=quick", "--shapes=2x32", "--contexts=8", "--out", str(tmp_path)]
  with pytest.raises(SystemExit):
    decode_bench.main([*flags, "--designs=preln,mhc"])
  err = capsys.readouterr().err
  assert "--designs/--shapes/--contexts/--loops=" in err and f"{earlier} holds a result" in err
  assert "--overwrite" in err
  assert len(json.loads(earlier.read_text())["rows"]) == 2
  earlier.write_text(json.dumps(dict(json.loads(earlier.read_text()), rounds=3)))
  with pytest.raises(SystemExit):   # fewer rounds: a noisier result over the finished one
    decode_bench.main([*flags, "--designs=hc,preln", "--rounds=1"])
  assert f"--rounds=1: {earlier} holds a result of 3 rounds" in capsys.readouterr().err
  for more in (["--designs=hc,preln", "--rounds=3"], ["--designs=preln,mhc", "--overwrite"]):
    with pytest.raises(helpers.RunReached):
      decode_bench.main([*flags, *more])
  # A result of another preset's model under the same file name (cpu and gpu400m share the
  # device's): a --preset=cpu rerun replaced a bf16 gpu400m result without a word.
  earlier.write_text(json.dumps(dict(json.loads(earlier.read_text()),
                                     preset=dict(quick, dtype="bfloat16"))))
  with pytest.raises(SystemExit):
    decode_bench.main([*flags, "--designs=hc,preln", "--rounds=3"])
  assert f"--preset=quick's={json.dumps(quick)}: {earlier} holds a result made with preset=" in (
      capsys.readouterr().err)
  # A result of older code records the whole train-bench preset: its decode fields decide.
  earlier.write_text(json.dumps(dict(json.loads(earlier.read_text()),
                                     preset=dataclasses.asdict(bench.PRESETS["quick"]))))
  with pytest.raises(helpers.RunReached):
    decode_bench.main([*flags, "--designs=hc,preln", "--rounds=3"])


def test_a_design_without_a_cached_decode_step_is_refused(tmp_path, capsys, monkeypatch):
  from depthbench_jax.residual import moda
  monkeypatch.setattr(moda.MoDA, "attend_handles_kv_cache", False)
  with pytest.raises(SystemExit):
    decode_bench.main(["--preset=quick", "--designs", "preln,moda", "--out", str(tmp_path)])
  assert "'moda': moda decodes by full recompute" in capsys.readouterr().err
  assert not list(tmp_path.iterdir())


def test_run_times_each_cases_step_and_prefill_under_their_own_names(monkeypatch):
  """The quick run checks only the row keys and the time counts: a token step timed under the
  prefill's name (and the reverse) passed."""
  case = _case("preln", "2x32")
  monkeypatch.setattr(decode_bench, "prepare", lambda p, c, batch: decode_bench.Prepared(
      case=c, cfg=decode_bench.decode_config(QUICK, c), token=lambda: "token",
      prefill=lambda: "prefill", compile_s=1.0, params=10, bytes_per_step=100))
  ran = {}

  def interleaved(candidates, rounds, **kwargs):
    ran.update({name: run() for name, run in candidates.items()})
    return {name: [0.001 if run() == "token" else 0.005] * rounds
            for name, run in candidates.items()}
  monkeypatch.setattr(bench, "interleaved", interleaved)
  result = decode_bench.run(QUICK, [case], batch=1, rounds=2, log=lambda line: None)
  assert ran == {f"{case.name}/token": "token", f"{case.name}/prefill": "prefill"}
  (row,) = result["rows"]
  assert (row["token_ms"], row["prefill_ms"]) == pytest.approx((1.0, 5.0))


def test_quick_run_writes_the_result_its_picture_and_a_table(tmp_path, capsys):
  assert decode_bench.main(["--preset=quick", "--designs=preln", "--shapes=2x32,4x16",
                            "--contexts=8", "--rounds=2",
                            "--out", str(tmp_path)]) == 0
  # Named by what the run changed, beside (never over) the default run's results-cpu-decode.json.
  path = str(tmp_path / "results-cpu-quick-designs-shapes-decode-contexts.json")
  assert sorted(os.listdir(tmp_path)) == [os.path.basename(path),
                                          os.path.basename(path)[:-4] + "png"]
  with open(path) as f:
    result = json.load(f)
  assert [(r["design"], r["shape"], r["loop"]) for r in result["rows"]] == [
      ("preln", "2x32", "unrolled"), ("preln", "4x16", "unrolled")]
  assert all(len(t) == 2 for t in result["times_s"].values()) and len(result["times_s"]) == 4
  # The preset fields decode reads, not the train bench's batch 2 and 2 rounds beside its own.
  assert sorted(result["preset"]) == sorted(decode_bench.DECODE_PRESET_FIELDS)
  assert (result["batch"], result["rounds"]) == (1, 2)
  assert os.path.exists(os.path.splitext(path)[0] + ".png")
  out = capsys.readouterr().out
  assert "| preln | 4x16 | 8 | unrolled |" in out
  assert decode_bench.main(["--replot", path]) == 0
  assert "| preln | 2x32 | 8 | unrolled |" in capsys.readouterr().out
  assert decode_bench.main(["--replot", path, f"--out={tmp_path / 'pictures'}"]) == 0
  assert os.listdir(tmp_path / "pictures") == [os.path.basename(path)[:-4] + "png"]
  train_result = tmp_path / "results-cpu.json"   # the train bench's, not this command's
  train_result.write_text(json.dumps({"train": [], "preset": {}, "verdict": []}))
  with pytest.raises(SystemExit):
    decode_bench.main(["--replot", str(train_result)])
  assert "not a result of that command" in capsys.readouterr().err


def test_a_run_about_to_exhaust_memory_maps_stops_before_timing(tmp_path, capsys, monkeypatch):
  """Each compile takes 1,000 maps of a 3,500 limit: after the second of three cases 2,100 +
  1.5 x 1,000 > 3,500, so the run stops there (rc 2) with the counts and the way out, instead
  of XLA:CPU aborting the process in LLVM; nothing is timed or written."""
  from depthbench_jax import hostmem
  readings = iter([100, 1_100, 1_100, 2_100, 2_100, 3_100])   # before and after each compile
  monkeypatch.setattr(hostmem, "memory_maps", lambda: (next(readings), 3_500))
  assert decode_bench.main(["--preset=quick", "--designs=preln", "--shapes=2x32,3x32,4x32",
                            "--contexts=8", "--out", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert "after compiling 2 of 3 cases this process holds 2,100 memory maps" in err
  assert "vm.max_map_count = 3,500" in err and "--designs, --shapes" in err
  assert "compiled preln@4x32" not in err and "round 1/" not in err
  assert not list(tmp_path.iterdir())


def test_a_case_out_of_device_memory_is_one_error_line(tmp_path, capsys, monkeypatch):
  """--contexts=100000: 'Out of memory allocating 160092800144 bytes' was a traceback."""
  import jax
  def out_of_memory(*args, **kwargs):
    raise jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory allocating 160092800144 bytes.")
  monkeypatch.setattr(decode_bench, "run", out_of_memory)
  assert decode_bench.main(["--preset=quick", "--designs=preln", "--shapes=2x32",
                            "--contexts=100000", "--out", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: --contexts/--batch/--shapes: a case does not fit this "
                            "device (RESOURCE_EXHAUSTED: Out of memory allocating"), err
  assert not list(tmp_path.iterdir())


def test_memory_maps_reads_this_process_and_the_kernel_limit():
  from depthbench_jax import hostmem
  maps = hostmem.memory_maps()
  if maps is None:
    pytest.skip("no /proc/self/maps")
  held, limit = maps
  assert 0 < held < limit


def test_the_plot_draws_eleven_designs_in_eleven_colours(tmp_path, monkeypatch):
  """The ten-colour cycle gave an eleventh design the first one's colour (and its marker and
  line style): two lines alike in the legend."""
  import matplotlib.colors
  import matplotlib.figure
  rows = [{"design": f"design{i:02d}", "context": 8, "loop": "unrolled", "n_layers": L,
           "shape": f"{L}x32", "token_ms": 1.0, "read_gb_per_s": 1.0, "prefill_ms": 1.0}
          for i in range(11) for L in (2, 4)]
  result = {"rows": rows, "device": "cpu", "host_cpu": "x", "preset": {"dtype": "float32"},
            "batch": 1}
  saved = []
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                      lambda fig, path, **kw: saved.append(fig.axes[0]))
  decode_bench.plot(result, str(tmp_path / "decode.png"))
  lines = saved[0].lines
  assert len(lines) == 11
  assert len({matplotlib.colors.to_hex(l.get_color()) for l in lines}) == 11


def test_the_plot_draws_each_measure_against_depth_in_its_own_panel(tmp_path, monkeypatch):
  """Panels: decode ms, GB/s, prefill ms, each against n_layers in order, scan dashed, shapes as
  the ticks. The test above checks only colours, with every value 1.0 and rows in order."""
  import matplotlib.figure
  rows = [{"design": "preln", "context": 8, "loop": loop, "n_layers": L, "shape": f"{L}x32",
           "token_ms": L + (0.5 if loop == "scan" else 0), "read_gb_per_s": 10.0 * L,
           "prefill_ms": 100.0 * L} for loop in ("unrolled", "scan") for L in (8, 2, 4)]
  result = {"rows": rows, "device": "cpu", "host_cpu": "x", "preset": {"dtype": "float32"},
            "batch": 1}
  saved = []
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                      lambda fig, path, **kw: saved.append(fig))
  decode_bench.plot(result, str(tmp_path / "decode.png"))
  token, read, prefill = saved[0].axes[:3]
  drawn = lambda ax: {l.get_label(): (list(l.get_xdata()), list(l.get_ydata()))
                      for l in ax.lines}
  assert drawn(token) == {"preln unrolled": ([2, 4, 8], [2, 4, 8]),
                         "preln scan": ([2, 4, 8], [2.5, 4.5, 8.5])}
  assert drawn(read)["preln unrolled"] == ([2, 4, 8], [20.0, 40.0, 80.0])
  assert drawn(prefill)["preln unrolled"] == ([2, 4, 8], [200.0, 400.0, 800.0])
  assert [l.get_linestyle() for l in token.lines] == ["-", "--"]
  assert [t.get_text() for t in token.get_xticklabels()] == ["2x32", "4x32", "8x32"]
