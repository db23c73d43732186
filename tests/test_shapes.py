"""The iso-parameter solver and the suites' shape tables (counts from the model's eval_shape)."""

import glob
import os

import pytest

from depthbench_jax import shapes, sweep
from depthbench_jax.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every committed suite file, so a new one is held to its targets without editing this list.
SUITES = ("smoke",) + tuple(sorted(os.path.basename(p)[:-3] for p in glob.glob(
    os.path.join(REPO, "configs", "suite_*.py"))))


def suite(name):
  return sweep.load_config_module(os.path.join(REPO, "configs", f"{name}.py"))


def listed_counts(module):
  """(key, shape_set, shape, counts) for every listed shape, Pre-LN backbone."""
  for key, shape_set in module.SHAPE_SETS.items():
    model = module.solver_model(key)
    for shape in shape_set.parsed():
      counts = shapes.param_counts(shapes.shaped_model(model, shape, module.ffn_rule(key)))
      yield key, shape_set, shape, counts


def test_parse_shape():
  assert shapes.parse_shape("16x1216") == shapes.Shape(16, 1216)
  assert shapes.Shape(70, 640).aspect_ratio == pytest.approx(9.142857)
  for bad in ("16", "16x", "x1216", "0x64", "16x12x3", "ax64"):
    with pytest.raises(ConfigError, match="allowed"):
      shapes.parse_shape(bad)


@pytest.mark.parametrize("name", SUITES)
def test_suite_shapes_within_tolerance(name):
  module = suite(name)
  for key, shape_set, shape, counts in listed_counts(module):
    error = counts[shape_set.count] / shape_set.target - 1
    assert abs(error) <= shape_set.tolerance, (name, key, shape.name, counts, error)
    assert shape.d_model % (2 * module.solver_model(key).n_heads) == 0, shape.name


def test_paper_endpoints_400m():
  """16x1216 (AR 76.0) and 70x640 (AR 9.1) are the suite's ends, 407M and 411M with GPT-2
  untied."""
  module = suite("suite_400m")
  listed = module.SHAPE_SETS["400m"].parsed()
  assert len(listed) == 7
  assert (listed[0].name, listed[-1].name) == ("16x1216", "70x640")
  assert round(listed[0].aspect_ratio, 1) == 76.0 and round(listed[-1].aspect_ratio, 1) == 9.1
  assert "24x1024" in module.SHAPE_SETS["400m"].shapes  # AR 42.7, the Pre-LN optimum edge.
  assert "32x896" in module.SHAPE_SETS["400m"].shapes
  model, target = module.solver_model(), module.SHAPE_SETS["400m"].target
  for shape in (listed[0], listed[-1]):
    counts = shapes.param_counts(shapes.shaped_model(model, shape, module.ffn_rule()))
    assert 400e6 < counts["total"] < 415e6, (shape.name, counts)
  for L, d in ((16, 1216), (70, 640)):
    solution = shapes.iso_param_width(target, L, model, ffn=module.ffn_rule())
    assert solution.shape == shapes.Shape(L, d)
    assert abs(solution.rel_error) < 0.02


def test_qwen3_layout_1p6b():
  module = suite("suite_1p6b")
  listed = module.SHAPE_SETS["1p6b"].parsed()
  assert len(listed) == 3 and listed[0] == shapes.Shape(28, 2048)
  c = module.get_config("arch=preln,shape=28x2048")
  from depthbench_jax.model.config import model_config_from
  cfg = model_config_from(c.model)
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim) == (16, 8, 128, 6144)
  assert cfg.qk_norm and c.lr == 5e-4
  # Qwen3-1.7B's config.json: rope_theta 1e6, rms_norm_eps 1e-6.
  assert (cfg.rope_theta, cfg.norm_eps) == (1e6, 1e-6)
  counts = shapes.param_counts(c.model)
  assert counts["non_embedding"] == pytest.approx(1409.4e6, rel=1e-3)  # Qwen3-1.7B backbone.
  assert {r["lr"] for r in module.sweep()} == {5e-4}
  # FFN 3d rounded up to a multiple of 128, as the docstring says (3d is 5184 and 4416 there).
  assert [model_config_from(module.get_config(f"arch=preln,shape={s}").model).ffn_dim
          for s in ("40x1728", "56x1472")] == [5248, 4480]
  # With Qwen3's own tied 151,936-row table this is Qwen3-1.7B to the parameter: 1,720,574,976
  # is transformers' Qwen3ForCausalLM count at that config (28 x (12.58M attn + 37.75M MLP +
  # 4,352 norm) + 2,048 final norm + 151,936 x 2,048), the "1.7B" of its name.
  c.model.vocab_size, c.model.tie_embeddings = 151936, True
  assert shapes.param_counts(c.model) == {"total": 1720574976, "embedding": 311164928,
                                          "non_embedding": 1409410048}


def test_isobackbone_fixes_backbone_not_total():
  module = suite("suite_300m_isobackbone")
  rows = list(listed_counts(module))
  totals = [counts["total"] for *_, counts in rows]
  assert rows[0][2] == shapes.Shape(16, 1216)
  assert totals[-1] < 0.85 * totals[0]  # Deep-narrow is smaller in total.


def test_solver_smoke_picks_nearest_grid_point():
  module = suite("smoke")
  model = module.solver_model()
  shape_set = module.SHAPE_SETS["smoke"]
  for solution, listed in zip(shapes.solve_shape_set(shape_set, model, module.ffn_rule()),
                              shape_set.parsed()):
    assert solution.shape == listed
    g = 2 * model.n_heads
    for d in (solution.shape.d_model - g, solution.shape.d_model + g):
      other = shapes.param_counts(shapes.shaped_model(model, shapes.Shape(listed.n_layers, d),
                                                      module.ffn_rule()))["total"]
      assert abs(other / shape_set.target - 1) >= abs(solution.rel_error)


def test_solver_backbone_count_and_design_option():
  model = suite("smoke").solver_model()
  # By hand at 4 layers: total 492,576 at d=96 (-10.4% of 5.5e5), 573,352 non-embedding at
  # d=104 (+4.2%; 443,232 at 96). At 5e5 both picked 4x96, so a solver that searched the total
  # whatever `count` said passed.
  total = shapes.iso_param_width(5.5e5, 4, model)
  backbone = shapes.iso_param_width(5.5e5, 4, model, count="non_embedding")
  assert (total.shape.d_model, backbone.shape.d_model) == (96, 104)
  assert backbone.counts["non_embedding"] == backbone.achieved == 573_352
  hc = shapes.iso_param_width(5e5, 4, model, design="mhc")
  assert hc.counts["total"] > shapes.param_counts(        # mHC's phi and gates counted
      shapes.shaped_model(model, hc.shape, design="preln"))["total"]
  assert total.rel_error == pytest.approx(total.achieved / 5.5e5 - 1)   # signed
  with pytest.raises(ConfigError, match="allowed"):
    shapes.iso_param_width(5e5, 4, model, count="embedding")
  with pytest.raises(ConfigError, match="multiple of n_heads"):
    shapes.iso_param_width(5e5, 4, model, granularity=6)
  # A suite's target typed as a string (a TypeError traceback once), or none at all, or one
  # no width reaches (9e15 printed 4x13693056, exit 0: the walk's own check came too late).
  for bad in ("918912", True, float("inf"), float("nan")):
    with pytest.raises(ConfigError, match=r"target=.*allowed: a positive parameter count"):
      shapes.iso_param_width(bad, 4, model)
  with pytest.raises(ConfigError, match=r"target=9e\+15 needs d > 1048576"):
    shapes.iso_param_width(9e15, 4, model)


@pytest.mark.slow
@pytest.mark.parametrize("name", SUITES)
def test_suite_shapes_are_the_solver_picks(name):
  """Every listed shape is exactly what iso_param_width picks at its depth (no hand table)."""
  module = suite(name)
  for key, shape_set in module.SHAPE_SETS.items():
    solved = shapes.solve_shape_set(shape_set, module.solver_model(key), module.ffn_rule(key))
    assert [s.shape.name for s in solved] == list(shape_set.shapes), (name, key)


@pytest.mark.parametrize("name", [s for s in SUITES if s != "smoke"])
def test_paper_suites_keep_the_recipe_precision(name):
  # The recipe's bf16 compute and fused attention must survive the suite's solver model (the
  # model config was once replaced after the recipe, silently training in fp32 with the T x T
  # XLA attention); the solver's backbone fields must survive the recipe.
  c = suite(name).get_config("arch=hc")
  assert (c.model.dtype, c.model.param_dtype, c.model.attention_kernel) == (
      "bfloat16", "float32", "fused")
  assert c.model.n_heads == 16 and c.model.vocab_size == 50257 and c.model.residual.name == "hc"
  assert c.model.max_seq_len >= c.data.seq_len == 2048
  # The paper's ~1M tokens per step (512 x 2048): no other test reads the batch but back from
  # the config, so half of it (twice the steps) passed everything.
  assert c.data.global_batch_size * c.data.seq_len == 2**20


@pytest.mark.parametrize("name", [s for s in SUITES if s != "smoke"])
def test_paper_suites_train_every_design_on_the_same_tokens_at_a_shape(name):
  # One Chinchilla budget per shape, N = Pre-LN's: MoDA's depth K/V projections (+12% params at
  # 16x1216) and mHC's phi must not buy them more tokens than the designs they are compared to.
  from depthbench_jax.train.loop import total_steps_of
  module = suite(name)
  shape = module.DEFAULTS["shape"]
  configs = {d: module.get_config(f"arch={d},shape={shape}") for d in ("preln", "moda", "mhc")}
  own = {d: shapes.param_counts(c.model)["total"] for d, c in configs.items()}
  assert own["moda"] > 1.05 * own["preln"]
  steps = {d: total_steps_of(c, own[d]) for d, c in configs.items()}
  assert steps["moda"] == steps["mhc"] == steps["preln"]
  assert shapes.budget_params(configs["moda"]) == own["preln"]
  configs["moda"].budget_design = ""     # the design's own parameters: MoDA trains longer
  assert shapes.budget_params(configs["moda"]) == own["moda"]
  assert total_steps_of(configs["moda"], own["moda"]) > steps["preln"]


def test_ffn_ratio_rule_rounds_up_to_the_multiple():
  """ffn = m * ceil(r d / m): Qwen3's 3 d at d = 2048 is 6144; 3 x 1072 / 64 = 50.25 -> 51 x 64."""
  import ml_collections
  model = ml_collections.ConfigDict({"ffn_dim": None, "ffn_multiple_of": 0})
  for d, want in ((2048, 6144), (1072, 3264)):
    shapes.FFNRule(ratio=3, multiple_of=64).apply(model, d)
    assert (model.ffn_dim, model.ffn_multiple_of) == (want, 64)
  shapes.FFNRule().apply(model, 1072)
  assert model.ffn_dim is None   # the model's own 8/3 rule


def test_solver_breaks_an_exact_tie_towards_the_narrower_width(monkeypatch):
  """Counts 100 at k = 1 and 300 at k = 2 are both 50% off a target of 200: the docstring's
  rule picks the narrower width."""
  model = suite("smoke").solver_model()
  g = shapes.default_granularity(model)
  monkeypatch.setattr(shapes, "param_counts", lambda m: {
      "total": 100 * (2 * (m.d_model // g) - 1), "non_embedding": 0, "embedding": 0})
  assert shapes.iso_param_width(200, 4, model).shape == shapes.Shape(4, g)


def test_cli_with_a_mistyped_config_is_one_error_line(capsys):
  """``python -m depthbench_jax.shapes configs/nope.py``: exit 2 and one ``error:`` line (once
  a ConfigError traceback)."""
  assert shapes.main(["configs/nope.py"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: config file 'configs/nope.py' does not exist; allowed: a configs/*.py "
                 "file"]
  # --config=FILE, as the sweep, systems and train_memory take it: it read as a file name.
  assert shapes.main(["--config=configs/nope.py"]) == 2
  assert capsys.readouterr().err.strip().splitlines() == err
  # No suite, or two: one error line too (the usage alone once, with no error: line).
  for argv in ([], ["configs/smoke.py", "configs/suite_400m.py"]):
    assert shapes.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {len(argv)} arguments"), err
    assert "allowed: one suite file" in err[0]


def test_cli_on_a_config_without_shape_sets_is_one_error_line(capsys):
  """``python -m depthbench_jax.shapes configs/base.py`` (a config, not a suite with shape
  sets): exit 2 and one line naming what the file lacks (once an AttributeError traceback)."""
  assert shapes.main(["configs/base.py"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
  assert "configs/base.py has no SHAPE_SETS" in err[0], err
  assert "allowed: a suite config" in err[0], err


def test_shape_table_prints_a_smoke_model_s_counts_without_rounding_them_to_zero():
  # At one decimal of a million the smoke suite's table read embedding 0.0M at 8x96 (49,344
  # parameters) and 0.9M for both totals beside their +1.83% difference.
  table = shapes.suite_tables(suite("smoke"))
  row = next(line for line in table.splitlines() if line.startswith("| 8x96 "))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[3:6] == ["935.7K", "886.4K", "49.34K"], cells
  assert cells[6] == "918.9K (total)" and cells[7] == "+1.83%", cells


@pytest.mark.parametrize("listed", [("16x576", "16x608", "32x448"), ("16x576", "32x448", "16x576")])
def test_a_shape_set_listing_a_depth_twice_is_one_error_line(tmp_path, capsys, listed):
  """Two widths at one depth in one shape set: the report showed one of them as 'val loss at 16
  layers' and the shapes table flagged both rows '(suite lists 16x608)'; an exact duplicate
  printed its row twice. Now the suite is refused, naming the depth and both shapes."""
  text = open(os.path.join(REPO, "configs", "suite_multiscale.py")).read()
  mine = tmp_path / "my_suite.py"
  mine.write_text(text.replace('("16x800", "32x608", "48x512")', repr(listed)))
  assert shapes.main([str(mine)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  a, b = sorted(s for s in listed if s.startswith("16x"))
  assert err == [f"error: ShapeSet shapes={listed}: 16 layers listed twice ({a}, {b}); allowed: "
                 f"one width per depth (the iso-parameter one: python -m depthbench_jax.shapes "
                 f"SUITE)"]
  assert sweep.main([str(mine), "--dry_run"]) == 2
  assert "16 layers listed twice" in capsys.readouterr().err


@pytest.mark.parametrize("written, named", [
    ('count="non-embedding"', "ShapeSet count='non-embedding'; allowed: total, non_embedding"),
    ("target=0", "ShapeSet target=0; allowed: a finite number > 0"),
    ('target="408e6"', "ShapeSet target='408e6'; allowed: a finite number > 0"),
    # 2 meaning 2% allowed 200%: the off-target warning never fired.
    ("tolerance=2", "ShapeSet tolerance=2; allowed: a fraction in (0, 1), e.g. 0.02 for 2%"),
])
def test_a_shape_sets_own_bad_field_is_one_error_line(tmp_path, capsys, written, named):
  """A typo in a suite copy's ShapeSet count or target was a KeyError / ZeroDivisionError /
  TypeError traceback in the sweep (exit 1, so run_sweep.sh went on to rewrite report.md)."""
  text = open(os.path.join(REPO, "configs", "suite_400m.py")).read()
  mine = tmp_path / "my_suite.py"
  field = written.split("=")[0]
  where = {"count": 'count="total"', "target": "target=408e6",
           "tolerance": 'count="total"'}[field]
  mine.write_text(text.replace(where, written if field != "tolerance" else
                               f'count="total", {written}', 1))
  assert mine.read_text() != text
  assert sweep.main([str(mine), "--dry_run"]) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1].endswith(named)
  assert shapes.main([str(mine)]) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1].endswith(named)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_cli_help_prints_the_usage(capsys, flag):
  """``python -m depthbench_jax.shapes --help`` said ``error: config file '--help' does not
  exist``; it prints the usage and what the tool does, exit 0."""
  assert shapes.main([flag]) == 0
  out = capsys.readouterr()
  assert out.out.startswith("usage: python -m depthbench_jax.shapes [--config=]configs/SUITE.py")
  assert "iso_param_width" in out.out and not out.err


def test_isobackbone_docstring_states_the_embedding_share_and_tokens_it_moves():
  """The spec calls this control one that "holds embedding share constant"; with a fixed vocab
  and a fixed backbone the share 2Vd / total moves with d alone. The suite's docstring must say
  so with the shares and token budgets the model's own counts give (it once said nothing), and
  its 16x1216 runs must be the main suite's own (reusable, not trained twice)."""
  from depthbench_jax.train.loop import total_steps_of
  module = suite("suite_300m_isobackbone")
  rows = list(listed_counts(module))
  shares = [c["embedding"] / c["total"] for *_, c in rows]
  assert all(a > b for a, b in zip(shares, shares[1:])), shares   # not constant: falls with d
  doc = " ".join(module.__doc__.split())
  assert "holds embedding share constant" in doc
  first, last = rows[0][2].name, rows[-1][2].name
  assert f"from {shares[0]:.1%} at {first} to {shares[-1]:.1%} at {last}" in doc, shares
  main = suite("suite_400m")
  main_shares = [shapes.param_counts(shapes.shaped_model(main.solver_model(), shape,
                                                         main.ffn_rule()))
                 for shape in main.SHAPE_SETS["400m"].parsed()[::6]]
  main_shares = [c["embedding"] / c["total"] for c in main_shares]
  assert f"(the main suite: {main_shares[0]:.1%} to {main_shares[-1]:.1%})" in doc
  tokens = []
  for shape in (first, last):
    c = module.get_config(f"arch=preln,shape={shape}")
    steps = total_steps_of(c, shapes.param_counts(c.model)["total"])
    tokens.append(steps * c.data.global_batch_size * c.data.seq_len / 1e9)
  assert f"{tokens[0]:.2f}B at {first} down to {tokens[1]:.2f}B at {last}" in doc, tokens
  arg = f"arch=hc,shape={first},lr=1e-3"
  assert module.get_config(arg).to_dict() == main.get_config(arg).to_dict()


def test_isobackbone_depths_are_the_main_suite_s_but_40_for_42_and_the_docstring_says_why():
  """A depth-matched comparison with the main suite needs the same depths; the one that differs
  (42 -> 40) must be the one with no width within tolerance, as the docstring says."""
  iso, main = suite("suite_300m_isobackbone"), suite("suite_400m")
  depths = lambda m: {s.n_layers for ss in m.SHAPE_SETS.values() for s in ss.parsed()}
  assert depths(iso) ^ depths(main) == {40, 42}
  shape_set, doc = iso.SHAPE_SETS["300m_isobackbone"], " ".join(iso.__doc__.split())
  errors = []
  for d in (736, 768):   # The two grid widths around 282M at 42 layers.
    counts = shapes.param_counts(shapes.shaped_model(iso.solver_model(), shapes.Shape(42, d),
                                                     iso.ffn_rule()))
    errors.append(counts[shape_set.count] / shape_set.target - 1)
  assert min(abs(e) for e in errors) > shape_set.tolerance, errors
  assert f"(736: {100 * errors[0]:+.2f}%, 768: {100 * errors[1]:+.2f}%)" in doc, errors


def test_multiscale_docstring_says_the_main_suite_has_no_48_layer_point():
  """The multi-scale check leans on the main suite for 400M; at 48 layers it has no shape, and
  the nearest width is outside its tolerance, which the docstring must state with the number."""
  multi, main = suite("suite_multiscale"), suite("suite_400m")
  main_depths = {s.n_layers for s in main.SHAPE_SETS["400m"].parsed()}
  multi_depths = {s.n_layers for ss in multi.SHAPE_SETS.values() for s in ss.parsed()}
  assert multi_depths - main_depths == {48}
  main_set = main.SHAPE_SETS["400m"]
  nearest = shapes.iso_param_width(main_set.target, 48, main.solver_model(), ffn=main.ffn_rule())
  assert abs(nearest.rel_error) > main_set.tolerance, nearest.rel_error
  doc = " ".join(multi.__doc__.split())
  assert (f"no 48-layer shape ({nearest.shape.name}, the nearest, is "
          f"{100 * nearest.rel_error:+.2f}% off") in doc, nearest


def test_400m_docstrings_state_what_each_design_adds_to_the_pre_ln_shape():
  """Shapes are solved on Pre-LN; the solver's doc called every design's extra parameters "a
  fraction of a percent at 400M", but MoDA adds 2 d^2 per layer (+11.6% at 16x1216) and mHC's
  phi takes 70x640 past the 2% tolerance. The suite's docstring must give the endpoints' numbers
  as the model's own counts give them."""
  from depthbench_jax.residual import registry
  module = suite("suite_400m")
  shape_set = module.SHAPE_SETS["400m"]
  ends = (shape_set.shapes[0], shape_set.shapes[-1])
  total = lambda design, shape: shapes.param_counts(
      module.get_config(f"arch={design},shape={shape}").model)["total"]
  excess = {d: [total(d, s) / total("preln", s) - 1 for s in ends] for d in registry.names()}
  doc, solver_doc = (" ".join(m.__doc__.split()) for m in (module, shapes))
  small = [d for d in excess if d not in ("mhc", "moda")]
  assert max(abs(e) for d in small for e in excess[d]) < 0.002, excess
  assert "under 0.2%" in doc and "under 0.2%" in solver_doc
  mhc, moda = excess["mhc"], excess["moda"]
  assert f"mHC's phi {mhc[0]:+.2%} ({ends[0]}) to {mhc[1]:+.2%} ({ends[1]})" in doc, mhc
  off_target = total("mhc", ends[1]) / shape_set.target - 1
  assert off_target > shape_set.tolerance
  assert f"which is {off_target:+.2%} off the 408M target there" in doc, off_target
  assert f"(2 d^2 per layer) {moda[0]:+.2%} to {moda[1]:+.2%}" in doc, moda
  assert f"{mhc[0]:.1%} to {mhc[1]:.1%} for mHC" in solver_doc
  assert f"{moda[0]:.1%} to {moda[1]:.1%} for MoDA" in solver_doc


@pytest.mark.parametrize("name,key", [("suite_1p6b", "1p6b"), ("smoke", "smoke")])
def test_a_suite_copy_that_renames_its_shape_set_sweeps_it(tmp_path, name, key):
  """README: a new suite is a copy of a suite file. Renaming the copy's SHAPE_SETS key (a 3B
  suite's "1p6b" -> "3b") made its sweep() a KeyError traceback: it read SHAPE_SETS["1p6b"]."""
  text = open(os.path.join(REPO, "configs", f"{name}.py")).read()
  mine = tmp_path / "suite_copy.py"
  mine.write_text(text.replace(f'"{key}": ShapeSet(', '"renamed": ShapeSet('))
  module = sweep.load_config_module(str(mine))
  assert list(module.SHAPE_SETS) == ["renamed"]
  runs = sweep.list_runs(str(mine))
  listed = module.SHAPE_SETS["renamed"].shapes
  assert sorted({r.shape.name for r in runs}) == sorted(listed)
  from depthbench_jax.residual import registry
  assert {r.design for r in runs} == set(registry.names())
  assert len(runs) == len(listed) * len(registry.names())


@pytest.mark.parametrize("name", ["suite_400m", "suite_300m_isobackbone", "suite_multiscale",
                                  "suite_1p6b"])
def test_every_paper_suite_trains_the_recipe_readme_states(name):
  """README: seq 2048, 512 x 2048 tokens per step, 20 tokens per Pre-LN parameter, AdamW
  (0.9, 0.95, wd 0.1, clip 1.0), warmup (2% of steps) + cosine to 0.1 x LR, bf16 compute with
  fp32 params. No test pinned these: an edit to paper_config passed the suite."""
  c = suite(name).get_config("arch=preln")
  assert (c.data.seq_len, c.data.global_batch_size, c.tokens_per_param, c.budget_design) == (
      2048, 512, 20.0, "preln")
  assert (c.b1, c.b2, c.weight_decay, c.grad_clip) == (0.9, 0.95, 0.1, 1.0)
  assert (c.warmup_steps, c.min_lr_ratio, c.steps) == (0.02, 0.1, -1)
  assert (c.model.dtype, c.model.param_dtype, c.data.tokenizer) == ("bfloat16", "float32",
                                                                    "gpt2")


def test_an_empty_fineweb_edu_path_reads_as_unset(monkeypatch):
  """README's prepare command reads ``${FINEWEB_EDU_PATH:-data/fineweb-edu}``; the suites read an
  empty variable as the path '' and every run failed on 'config.data.path is empty'."""
  monkeypatch.setenv("FINEWEB_EDU_PATH", "")
  assert suite("suite_400m").get_config("arch=preln").data.path == "data/fineweb-edu"
  monkeypatch.setenv("FINEWEB_EDU_PATH", "/shared/fineweb")
  assert suite("suite_400m").get_config("arch=preln").data.path == "/shared/fineweb"
