"""Outputs of the diagnostics: diagnostics.json + PNGs, the training hook, the report section."""

import json
import os
import shutil

import numpy as np
import pytest

from depthbench_jax import diagnose
from depthbench_jax.diagnostics import periodic, report_section
from depthbench_jax.report import scorecard
from depthbench_jax.model.config import model_config_from
from tests.diagnostics.common import init_params
from tests.helpers import tiny_config


class FakeWriter:
  def __init__(self):
    self.scalars, self.images = {}, {}

  def write_scalars(self, step, scalars):
    self.scalars[step] = dict(scalars)

  def write_images(self, step, images):
    self.images[step] = dict(images)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  config = tiny_config(**{"model.n_layers": 4})
  config.diagnostics.every = 5
  cfg = model_config_from(config.model)
  params = init_params(cfg)
  # Same model, options and batch shape as test_diagnostics_probes: the compiles are shared.
  batch = {"tokens": np.random.RandomState(0).randint(0, 257, (8, 9)).astype(np.int32)}
  return config, cfg, params, batch


def test_diagnose_writes_json_and_pngs_and_the_report_reads_them(run, tmp_path):
  config, _, params, batch = run
  result = diagnose.diagnose(str(tmp_path), config, params, batch, step=7)
  with open(tmp_path / "diagnostics.json") as f:
    loaded = json.load(f)
  assert loaded["step"] == 7 and loaded["batch"] == [2, 9] and loaded["design"] == "preln"
  for name in ("angular", "causal", "permutation", "share_curves", "angular_consecutive"):
    path = tmp_path / loaded["plots"][name]
    assert path.exists() and path.read_bytes()[:4] == b"\x89PNG", name
  assert result["timing"]["total_s"] > 0

  summary = {"name": "tiny", "design": "preln", "config": {"model": {"n_layers": 4}}}
  other = dict(loaded, n_layers=8, design="hc", mixing={"erank_late": 2.61})
  table = report_section.diagnostics_table([(dict(summary, design="hc"), other), (summary, loaded)])
  lines = table.strip().splitlines()
  assert lines[0].startswith("| design | L | d | lr | causal C>0.45 | permutation P>0.15")
  assert lines[2].startswith("| hc | 8 | - | - |") and "| 2.61 |" in lines[2]
  assert lines[3].startswith("| preln | 4 |")
  assert lines[-1].startswith("loss: the held-out loss of the rows the probes read")
  share = loaded["causal"]["share"]
  assert f"{100 * share:.1f}%" in lines[3]
  paths = report_section.heatmap_paths([(summary, loaded)])
  assert [c for c, _ in paths] == ["preln L=4: causal", "preln L=4: permutation",
                                   "preln L=4: angular"]
  assert all(os.path.exists(p) for _, p in paths)
  md = report_section.section([(summary, loaded)], relative_to=str(tmp_path))
  assert "![preln L=4: causal](plots/diag_causal.png)" in md
  assert "| preln | " in report_section.share_pivot([(summary, loaded)])

  # The scorecard's hook: records are summaries plus workdir; diagnostics.json is read from it.
  from depthbench_jax import diagnostics
  record = dict(summary, workdir=str(tmp_path), n_layers=4, d_model=32, lr=3e-3, status="ok",
                final_val_loss=3.0)
  md = diagnostics.diagnostics_table([record, dict(record, workdir=str(tmp_path / "none"))])
  assert "| preln | 4 | 32 | 0.003 |" in md and md.count("| preln | 4 |") == 1
  assert f"]({tmp_path}/plots/diag_causal.png)" in md
  assert diagnostics.diagnostics_table([dict(record, workdir=str(tmp_path / "none"))]) is None

  # A run at another LR that diverged, diagnosed at NaN loss with a causal share of 99%: the table
  # lists it, the pivot and the heatmaps read only the best-LR run. The pivot's cell is the
  # best run's share, and the heatmaps come from the folder the run is in now.
  moved = tmp_path / "moved"
  shutil.copytree(tmp_path / "plots", moved / "plots")
  json.dump(dict(loaded, workdir="/gone", loss=float("nan"),
                 causal=dict(loaded["causal"], share=0.99)), open(moved / "diagnostics.json", "w"))
  bad = dict(record, workdir=str(moved), lr=1e-2, status="diverged", final_val_loss=None)
  md = diagnostics.diagnostics_table([record, bad])
  assert md.count("| preln | 4 | 32 |") == 2 and "99.0%" in md.split("Causal share by depth")[0]
  assert "| preln | 4 | 32 | 0.01 (diverged) |" in md and md.count("(diverged)") == 1
  pivot = md.split("Causal share by depth")[1].split("Permutation share")[0]
  assert f"{100 * share:.1f}%" in pivot and "99.0%" not in pivot
  assert str(moved) not in md
  # The best LR (1e-3, loss 2.0) was not diagnosed, another LR was: the pivot reads no figure
  # of the other LR (given only the runs with the file, the hook once took that one as best).
  undiagnosed = dict(record, workdir=str(tmp_path / "none"), lr=1e-3, final_val_loss=2.0)
  md = dict(scorecard.hook_sections([undiagnosed, record]))["Diagnostics"]
  assert "| preln | 4 | 32 | 0.003 |" in md   # every diagnosed run is listed
  pivot = md.split("Causal share by depth")[1].split("Permutation share")[0]
  assert "| preln |" not in pivot
  shutil.copy(tmp_path / "diagnostics.json", tmp_path / "saved.json")
  json.dump(dict(loaded, workdir="/gone"), open(tmp_path / "diagnostics.json", "w"))
  assert f"]({tmp_path}/plots/diag_causal.png)" in diagnostics.diagnostics_table([record])
  shutil.move(tmp_path / "saved.json", tmp_path / "diagnostics.json")


def test_hook_writes_scalars_and_uint8_images(run):
  config, cfg, params, batch = run
  hook = periodic.DiagnosticsHook(config, cfg, batch)
  assert hook.tokens.shape == (2, 9)
  writer = FakeWriter()
  result = hook(5, params, writer)
  assert result["step"] == 5
  scalars = writer.scalars[5]
  assert scalars == periodic.scalars_of(result)
  for key in ("diagnostics/causal_share", "diagnostics/permutation_share",
              "diagnostics/angular_late_consecutive", "diagnostics/loss"):
    assert np.isfinite(scalars[key]), key
  images = writer.images[5]
  assert set(images) == {"diagnostics/angular", "diagnostics/causal", "diagnostics/permutation",
                         "diagnostics/share_curves"}
  for image in images.values():
    assert image.dtype == np.uint8 and image.ndim == 4 and image.shape[0] == 1
    assert image.shape[-1] == 3 and image.std() > 0


def test_scalars_of_names_each_value_and_skips_what_is_missing():
  result = {"loss": 2.5, "angular": {"late_consecutive_mean": 0.1},
            "causal": {"share": 0.6, "late_mean": 0.2},
            "permutation": {"share": 0.4, "late_mean": 0.3},
            "mixing": {"erank_late": 3.0, "amax_forward": 0.7},
            "dead_prefix": {"dead_prefix": 2}}
  assert periodic.scalars_of(result) == {
      "diagnostics/loss": 2.5, "diagnostics/angular_late_consecutive": 0.1,
      "diagnostics/causal_share": 0.6, "diagnostics/causal_late_mean": 0.2,
      "diagnostics/permutation_share": 0.4, "diagnostics/permutation_late_mean": 0.3,
      "diagnostics/erank_late": 3.0, "diagnostics/amax_forward": 0.7,
      "diagnostics/dead_prefix": 2.0}
  # No loss (diagnose on params alone), no optional probes: only the angular scalar.
  assert periodic.scalars_of({"loss": None, "angular": {"late_consecutive_mean": 0.1}}) == {
      "diagnostics/angular_late_consecutive": 0.1}


def test_overrides_parse_json_values():
  assert diagnose._parse_overrides(["permutation_chunk=4", "causal_reduction=max",
                                    "thresholds=[0.3,0.1]"]) == {
      "permutation_chunk": 4, "causal_reduction": "max", "thresholds": [0.3, 0.1]}


def test_overrides_refuse_a_key_the_diagnostics_do_not_read():
  """A misspelt --set key (once silently ignored: the run used the default) or an item without
  '=' is one error naming the allowed keys."""
  from depthbench_jax.errors import ConfigError
  for item in ("permutaton_chunk=4", "causal_reduction"):
    with pytest.raises(ConfigError, match=f"--set={item}: .*allowed keys: batch_size, "
                                          "causal_chunk, .*permutation_chunk"):
      diagnose._parse_overrides([item])


def test_pivot_and_heatmaps_pick_the_lowest_loss_run_of_a_cell():
  """Two runs at one (design, depth), e.g. two LRs: the pivot shows, and the heatmaps come from,
  the one whose diagnostics loss is lower, in either order."""
  worse = ({"name": "a", "status": "ok", "d_model": 64},
           {"design": "preln", "n_layers": 8, "loss": 3.0, "causal": {"share": 0.10}})
  better = ({"name": "b", "status": "ok", "d_model": 64},
            {"design": "preln", "n_layers": 8, "loss": 2.5, "causal": {"share": 0.60}})
  for runs in ([worse, better], [better, worse]):
    pivot = report_section.share_pivot(runs)
    assert "| preln | 60.0% |" in pivot and "10.0%" not in pivot
    assert report_section.deepest_per_design(runs) == [better]


def test_every_column_of_the_table_and_both_pivots_read_their_own_measure():
  """A run whose six measures all differ: the checks above stop at the causal cell, where a
  permutation column showing the causal share, angular and erank swapped, or the permutation
  pivot built from the causal share all passed."""
  run = ({"name": "a", "status": "ok", "d_model": 64, "lr": 1e-3},
         {"design": "hc", "n_layers": 8, "loss": 2.9, "causal": {"share": 0.1},
          "permutation": {"share": 0.2}, "angular": {"late_consecutive_mean": 0.3},
          "mixing": {"erank_late": 2.5}, "dead_prefix": {"dead_prefix": 3}})
  table = report_section.diagnostics_table([run])
  assert "| hc | 8 | 64 | 0.001 | 10.0% | 20.0% | 0.300 | 2.50 | 3 | 2.900 |" in table
  section = report_section.section([run], heading=False)
  causal, permutation = section.split("Causal share by depth:")[1].split(
      "Permutation share by depth:")
  assert "| hc | 10.0% |" in causal and "| hc | 20.0% |" in permutation


def test_tables_name_mixed_thresholds_and_an_earlier_step():
  """A run scored at threshold 0.20 was printed under the header "causal C>0.45" (the default,
  taken when runs disagreed), and one diagnosed at step 500 of 7770 read as final."""
  early = ({"name": "a", "status": "ok", "d_model": 64, "lr": 1e-3, "steps": 7770},
           {"design": "preln", "n_layers": 8, "loss": 3.0, "step": 500,
            "causal": {"share": 0.9, "threshold": 0.2}})
  final = ({"name": "b", "status": "ok", "d_model": 64, "lr": 1e-3, "steps": 7770},
           {"design": "hc", "n_layers": 8, "loss": 2.9, "step": 7770,
            "causal": {"share": 0.1, "threshold": 0.45}})
  table = report_section.diagnostics_table([early, final])
  assert "| causal share (>threshold) |" in table and "C>0.45" not in table
  assert "| preln | 8 | 64 | 0.001 (step 500 of 7770) | 90.0% (>0.2) |" in table
  assert "| hc | 8 | 64 | 0.001 | 10.0% (>0.45) |" in table
  assert "| preln | 90.0% (>0.2) (step 500 of 7770) |" in report_section.share_pivot(
      [early, final])
  assert "| causal C>0.45 |" in report_section.diagnostics_table([final])


def test_tables_name_a_causal_share_taken_as_the_max_over_tokens():
  """A run re-diagnosed with ``--set=causal_reduction=max`` (a max over tokens, never below the
  mean) sat unmarked in the "causal C>0.45" column and pivot beside mean-reduced runs."""
  maxed = ({"name": "a", "status": "ok", "d_model": 64, "lr": 1e-3},
           {"design": "preln", "n_layers": 8, "loss": 3.0,
            "causal": {"share": 0.9, "threshold": 0.45, "reduction": "max"}})
  mean = ({"name": "b", "status": "ok", "d_model": 64, "lr": 1e-3},
          {"design": "hc", "n_layers": 8, "loss": 2.9,
           "causal": {"share": 0.1, "threshold": 0.45, "reduction": "mean"}})
  table = report_section.diagnostics_table([maxed, mean])
  assert "| preln | 8 | 64 | 0.001 | 90.0% (max over tokens) |" in table
  assert "| hc | 8 | 64 | 0.001 | 10.0% |" in table
  assert "| preln | 90.0% (max over tokens) |" in report_section.share_pivot([maxed, mean])


def test_paper_comparison_sets_depthbench_diagnostics_beside_ours():
  """The summary's L = 32 shares, effective-rank ranges and dead prefix, beside the best-LR
  runs' own, each named by its shape; a share scored at another threshold or as a max over
  tokens is not compared, nor is a run of another scale or recipe (a multi-scale 204M or 490M
  32-layer run, a long-context copy of the suite: all were once set beside the 400M figures)."""
  def run(design, depth, width=896, total=400e6, seq_len=2048, **diag):
    summary = {"name": f"{design}{depth}x{width}", "status": "ok", "d_model": width,
               "params_total": total, "config": {"data": {"seq_len": seq_len}}}
    return summary, {"design": design, "n_layers": depth, "loss": 3.0, **diag}
  runs = [run("preln", 32, causal={"share": 0.02, "threshold": 0.45},
              permutation={"share": 0.1, "threshold": 0.15}),
          run("hc", 32, causal={"share": 0.5, "threshold": 0.2}, mixing={"erank_late": 2.6}),
          run("attnres_full", 32, causal={"share": 0.3, "threshold": 0.45, "reduction": "max"}),
          run("mhc", 16, mixing={"erank_late": 1.9}), run("mhc", 32, mixing={"erank_late": 1.5}),
          run("attnres_block", 32, dead_prefix={"dead_prefix": 7}),
          run("preln", 16, causal={"share": 0.5, "threshold": 0.45})]
  other = [run("preln", 32, 608, 204e6, causal={"share": 0.6, "threshold": 0.45}),
           run("preln", 32, 992, 490e6, causal={"share": 0.6, "threshold": 0.45}),
           run("preln", 32, seq_len=8192, causal={"share": 0.6, "threshold": 0.45}),
           run("mhc", 32, 608, 204e6, mixing={"erank_late": 3.9}),
           ({"name": "no-count", "status": "ok"},
            {"design": "preln", "n_layers": 32, "loss": 3.0,
             "causal": {"share": 0.6, "threshold": 0.45}})]
  table = report_section.paper_comparison(runs + other)
  # A diagnostics.json without causal.skip (older code) scored the layer as absent: marked.
  assert "| preln | causal share > 0.45, L=32 | ~1% | 2.0% (layer absent) (32x896) |" in table
  from depthbench_jax.diagnostics import metrics
  runs[0][1]["causal"]["skip"] = metrics.CAUSAL_SKIPS["zero_update"]
  table = report_section.paper_comparison(runs + other)
  assert "| preln | causal share > 0.45, L=32 | ~1% | 2.0% (32x896) |" in table
  assert "| preln | permutation share > 0.15, L=32 | ~8% | 10.0% (32x896) |" in table
  assert "60.0%" not in table                          # other scales, recipes, no count
  assert "| hc | causal" not in table                  # scored at 0.2
  assert "| attnres_full | causal" not in table        # the max over tokens
  erank = "| effective rank of the residual products |"
  assert f"| hc {erank} 2.53 to 2.81 | 2.60 (1 run) |" in table
  assert f"| mhc {erank} 1.44 to 1.65 | 1.50 to 1.90 (2 runs) |" in table
  assert "| attnres_block | dead prefix, L=32 | 8 layers | 7 layers (32x896) |" in table
  assert report_section.paper_comparison([run("preln", 16)]) is None
  assert report_section.paper_comparison(other) is None
  assert "Against the paper" in report_section.section(runs, heading=False)
  # The section's note names the thresholds the table's shares were scored at.
  paper_only = report_section.section([runs[0], runs[-1]], heading=False)
  assert "thresholds as in DepthBench (C > 0.45, P > 0.15);" in paper_only
  assert ("thresholds as the table names them (DepthBench's: C > 0.45, P > 0.15);"
          in report_section.section(runs[:2], heading=False))   # hc scored at C > 0.2
  # The iso-backbone suite's 32x864 (374M) beside its 16x1216 (407M): each in the paper's
  # range, yet not one iso-parameter sweep (-8%), which the scorecard's comparison refuses.
  iso_backbone = [run("preln", 16, 1216, 407.4e6, causal={"share": 0.02, "threshold": 0.45}),
                  run("preln", 32, 864, 373.6e6, causal={"share": 0.02, "threshold": 0.45})]
  assert report_section.paper_comparison(iso_backbone) is None
  iso_backbone[1][0]["params_total"] = 395e6   # within 5%: compared
  assert "(32x864) |" in report_section.paper_comparison(iso_backbone)
  # Only the 32-layer run diagnosed: the family's undiagnosed 16x1216 (the report's records,
  # as the scorecard judges them) still says it is no iso-parameter sweep.
  iso_backbone[1][0].update(params_total=373.6e6, family=0)
  records = [{"family": 0, "n_layers": 16, "params_total": 407.4e6},
             {"family": 0, "n_layers": 32, "params_total": 373.6e6}]
  assert "(32x864) |" in report_section.paper_comparison(iso_backbone[1:])
  assert report_section.paper_comparison(iso_backbone[1:], records) is None
  records[1]["params_total"] = 395e6
  assert "(32x864) |" in report_section.paper_comparison(iso_backbone[1:], records)


def test_the_reports_hook_judges_iso_parameters_over_the_familys_undiagnosed_runs_too(tmp_path):
  """The iso-backbone suite with only its 32x864 diagnosed: the report's hook hands the family's
  16x1216 (407M, no diagnostics.json) to the paper comparison, which sets nothing beside the
  paper, as the scorecard's own comparison says 'Not compared' (it once judged only the
  diagnosed runs, of one depth, and compared)."""
  from depthbench_jax import diagnostics
  def record(depth, width, total):
    workdir = tmp_path / f"preln_{depth}x{width}"
    workdir.mkdir()
    return {"name": workdir.name, "workdir": str(workdir), "design": "preln", "status": "ok",
            "n_layers": depth, "d_model": width, "lr": 1e-3, "final_val_loss": 3.0,
            "params_total": total, "family": 0, "config": {"data": {"seq_len": 2048}}}
  shallow, deep = record(16, 1216, 407.4e6), record(32, 864, 373.6e6)
  json.dump({"design": "preln", "n_layers": 32, "loss": 3.0,
             "causal": {"share": 0.02, "threshold": 0.45, "skip": "zero_update"}},
            open(os.path.join(deep["workdir"], "diagnostics.json"), "w"))
  assert "Against the paper" not in diagnostics.diagnostics_table([shallow, deep])
  shallow["params_total"] = 390e6   # within 5% of 373.6M: one iso-parameter sweep, compared
  assert "(32x864) |" in diagnostics.diagnostics_table([shallow, deep])


def _canned_result():
  """The smallest diagnostics result the plots read (2 layers, no probes but angular)."""
  return {"design": "preln", "n_layers": 2, "late_start": 1, "timing": {},
          "angular": {"matrix": [[None, 0.5], [None, None]], "consecutive": [0.5]},
          "dead_prefix": {"per_sublayer": [0.4, 0.3, 0.2, 0.1]}}


def test_diagnose_reads_overrides_over_the_config_and_writes_relative_plot_paths(
    tmp_path, monkeypatch):
  """Overrides win over config.diagnostics and reach the probes; a run whose config.json
  predates config.diagnostics reads base.py's first 2 held-out rows; diagnostics.json names its
  PNGs relative to the run."""
  from depthbench_jax.diagnostics import probes
  seen = {}

  class FakeProbes:
    def __init__(self, cfg, options):
      seen["options"] = options

    def run(self, params, tokens):
      seen["rows"] = tokens.shape[0]
      return _canned_result()

  monkeypatch.setattr(probes, "Probes", FakeProbes)
  config = tiny_config()
  batch = {"tokens": np.zeros((8, 9), np.int32)}
  diagnose.diagnose(str(tmp_path), config, None, batch,
                    overrides={"batch_size": 3, "permutation_chunk": 5})
  assert seen["rows"] == 3 and seen["options"].permutation_chunk == 5
  with open(tmp_path / "diagnostics.json") as f:
    assert json.load(f)["plots"]["angular"] == os.path.join("plots", "diag_angular.png")
  assert (tmp_path / "plots" / "diag_angular.png").exists()
  from depthbench_jax.train import checkpoint
  older = {k: v for k, v in config.to_dict().items() if k != "diagnostics"}
  (tmp_path / "config.json").write_text(json.dumps(older))
  diagnose.diagnose(str(tmp_path), checkpoint.load_run_config(str(tmp_path)), None, batch)
  assert seen["rows"] == 2


def test_plots_put_sublayers_at_half_layers_and_images_keep_only_the_asked_figures():
  """The depth-weight curve's x is sublayer / 2 (two sublayers per layer); ``images`` returns
  only the named figures, as uint8 [1, H, W, 3]."""
  from depthbench_jax.diagnostics import plots
  import matplotlib.pyplot as plt
  figs = plots.figures(_canned_result())
  assert set(figs) == {"angular", "angular_consecutive", "dead_prefix"}
  line = figs["dead_prefix"].axes[0].lines[0]
  assert list(line.get_xdata()) == [0.0, 0.5, 1.0, 1.5]
  assert list(line.get_ydata()) == [0.4, 0.3, 0.2, 0.1]
  # The late boundary (late_start 1) falls between layer 0's MLP (0.5) and layer 1 (1.0); at
  # late_start - 0.5 it ran through the MLP point.
  assert figs["dead_prefix"].axes[0].lines[-1].get_xdata()[0] == 0.75
  for fig in figs.values():
    plt.close(fig)
  # Layer axes tick whole layers (at L=4 they read -0.5, 0.0, 0.5 ... and 0.25, 0.5 ...);
  # the sublayer curve keeps its half layers.
  nan = None
  four = dict(_canned_result(), n_layers=4,
              angular={"matrix": [[nan, .5, .6, .7], [nan, nan, .4, .5], [nan, nan, nan, .3],
                                  [nan, nan, nan, nan]], "consecutive": [.5, .4, .3]},
              dead_prefix={"per_sublayer": [.4, .3, .2, .1, .1, .1, .1, .1]})
  figs = plots.figures(four)
  ticks = lambda axis: [t for t in axis.get_ticklocs() if axis.get_view_interval().min() <= t
                        <= axis.get_view_interval().max()]
  heat, cons = figs["angular"].axes[0], figs["angular_consecutive"].axes[0]
  for axis in (heat.xaxis, heat.yaxis, cons.xaxis):
    assert ticks(axis) and all(float(t).is_integer() for t in ticks(axis)), ticks(axis)
  assert 0.5 in ticks(figs["dead_prefix"].axes[0].xaxis)
  for fig in figs.values():
    plt.close(fig)
  images = plots.images(_canned_result())
  assert set(images) == {"angular"}
  assert images["angular"].dtype == np.uint8 and images["angular"].shape[0] == 1
  assert images["angular"].shape[-1] == 3


def test_heatmaps_show_scores_above_one_and_mark_pairs_that_blew_up():
  """The causal scale stopped at 1 (1.46 drew as 1.0); a non-finite late pair, which the shares
  count above every threshold, drew blank like the undefined cells; the share curves named
  neither their score (one curve: no legend) nor which threshold line was whose."""
  from depthbench_jax.diagnostics import plots
  import matplotlib.pyplot as plt
  nan = None
  result = dict(_canned_result(), n_layers=3, late_start=0,
                causal={"matrix": [[nan, 1.46, 0.2], [nan, nan, nan], [nan, nan, nan]],
                        "reduction": "max", "threshold": 0.45,
                        "curve": {"thresholds": [0.0, 1.0], "share": [1.0, 0.5]}},
                permutation={"matrix": [[nan, 0.1, 0.3], [nan, nan, 0.2], [nan, nan, nan]],
                             "threshold": 0.15,
                             "curve": {"thresholds": [0.0, 1.0], "share": [1.0, 0.0]}})
  figs = plots.figures(result)
  ax = figs["causal"].axes[0]
  assert ax.images[0].get_clim()[1] >= 1.46
  crosses = ax.collections[0].get_offsets()   # x = measured layer t, y = skipped layer s
  assert [tuple(c) for c in crosses] == [(2.0, 1.0)]   # C[1,2] blew up; C[1,0] is undefined
  assert not figs["permutation"].axes[0].collections     # nothing blew up there
  # Pairs the probes did not swap (permutation_pairs='late': only late ones) are not crosses.
  late_only = dict(result, late_start=1, permutation=dict(
      result["permutation"], pairs="late",
      matrix=[[nan, nan, nan], [nan, nan, 0.2], [nan, nan, nan]]))
  assert not plots.figures(late_only)["permutation"].axes[0].collections
  curves = figs["share_curves"].axes[0]
  assert [t.get_text() for t in curves.get_legend().get_texts()] == [
      "causal (threshold 0.45)", "permutation (threshold 0.15)"]
  colours = [line.get_color() for line in curves.lines]
  assert colours[2] == colours[0] and colours[3] == colours[1]   # each threshold in its colour
  # What each draws: the matrix as given (row = skipped s, column = measured t; a transpose
  # kept the crosses and the colour scale), each share over its thresholds.
  np.testing.assert_array_equal(ax.images[0].get_array().filled(np.nan),
                                np.array(result["causal"]["matrix"], float))
  assert ([(list(l.get_xdata()), list(l.get_ydata())) for l in curves.lines[:2]]
          == [([0.0, 1.0], [1.0, 0.5]), ([0.0, 1.0], [1.0, 0.0])])
  for fig in figs.values():
    plt.close(fig)


def test_layer_curves_draw_each_layers_value_at_its_layer():
  """The consecutive angular distance d(l, l+1) at x = l, and the mixing erank of layers
  s..L-1 at x = s (no test drew the erank curve: no result held ``mixing``)."""
  from depthbench_jax.diagnostics import plots
  import matplotlib.pyplot as plt
  result = dict(_canned_result(), design="hc", n_layers=4, late_start=1,
                angular={"matrix": [[None] * 4] * 4, "consecutive": [0.5, 0.4, 0.1]},
                mixing={"erank_by_start": [3.5, 2.5, 1.5, 1.0]})
  figs = plots.figures(result)
  cons, erank = figs["angular_consecutive"].axes[0], figs["erank"].axes[0]
  assert (list(cons.lines[0].get_xdata()), list(cons.lines[0].get_ydata())) == (
      [0, 1, 2], [0.5, 0.4, 0.1])
  assert (list(erank.lines[0].get_xdata()), list(erank.lines[0].get_ydata())) == (
      [0, 1, 2, 3], [3.5, 2.5, 1.5, 1.0])
  for fig in figs.values():
    plt.close(fig)


def test_hook_of_a_multi_process_run_reads_the_global_batchs_first_rows(monkeypatch):
  """Each of P processes holds every P-th row of a validation batch; the training hook must
  still diagnose the first rows of the whole batch, the ones ``diagnose`` reads, or its
  numbers would change with the process count (and differ from diagnose's at a checkpoint)."""
  import jax
  from depthbench_jax.data import pipeline
  from depthbench_jax.train import loop
  config = tiny_config(**{"model.n_layers": 4})
  config.diagnostics.every = 5
  process_0_share = pipeline.make_val_batches(config, process_index=0, process_count=2)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  hook = loop._diagnostics_hook(config, model_config_from(config.model), process_0_share)
  whole = pipeline.make_val_batches(config, process_index=0, process_count=1)[0]["tokens"]
  np.testing.assert_array_equal(hook.tokens, whole[:2])


def test_report_links_the_heatmaps_relative_to_its_folder(run, tmp_path):
  """report.md linked the runs' diagnostics heatmaps by absolute path (its own plots relatively):
  a results folder copied off the pod, or moved, showed them as broken images."""
  import re
  from depthbench_jax.report import scorecard
  config, _, params, batch = run
  results = tmp_path / "results"
  workdir = results / "preln_4x32_lr3e-3"
  workdir.mkdir(parents=True)
  diagnose.diagnose(str(workdir), config, params, batch, step=7)
  (workdir / "summary.json").write_text(json.dumps(
      {"name": workdir.name, "design": "preln", "n_layers": 4, "d_model": 32, "lr": 3e-3,
       "status": "ok", "final_val_loss": 3.0, "final_train_loss": 3.1, "params_total": 1000,
       "steps": 7}))
  scorecard.write_report(str(results), plots=False)
  copied = tmp_path / "laptop" / "results"
  shutil.move(results, copied)
  links = re.findall(r"!\[[^]]*\]\(([^)]*diag_[^)]*)\)", (copied / "report.md").read_text())
  assert links and all(os.path.exists(copied / link) for link in links), links


def test_the_report_says_how_the_causal_scores_skipped_a_layer():
  """The default skip is the spec's; runs diagnosed with 'absent' (or by older code, which
  recorded that or nothing) beside them are named as another measure, not pooled silently."""
  from depthbench_jax.diagnostics import metrics
  spec = ({}, {"causal": {"skip": metrics.CAUSAL_SKIPS["zero_update"]}})
  old = ({}, {"causal": {}})
  assert report_section.skips_used([spec, spec]) == (
      "by setting its sublayer outputs to zero (the spec)")
  assert report_section.skips_used([old]) == "as absent (Csordas et al.)"
  assert report_section.skips_used([spec, old, ({}, {})]) == (
      "in two ways, not comparable: by setting its sublayer outputs to zero (the spec) in 1 "
      "runs; as absent (Csordas et al.) in 1 runs (marked 'layer absent')")
  # Each cell of the other measure is marked, and so is the paper comparison's number.
  old = ({}, {"causal": {"share": 0.25, "threshold": 0.45}})
  spec = ({}, {"causal": {"share": 0.25, "threshold": 0.45,
                          "skip": metrics.CAUSAL_SKIPS["zero_update"]}})
  assert report_section._share_cell(old[1], "causal", False, True) == "25.0% (layer absent)"
  assert report_section._share_cell(spec[1], "causal", False, True) == "25.0%"
  assert report_section._share_cell(old[1], "causal", False) == "25.0%"   # all one way
  table = report_section.diagnostics_table([({"name": "a"}, {"design": "hc", "n_layers": 8,
                                                             **old[1]}),
                                            ({"name": "b"}, {"design": "hc", "n_layers": 16,
                                                             **spec[1]})])
  assert "| 25.0% (layer absent) |" in table and table.count("layer absent") == 1
  # A run diagnosed without the causal probe (run_causal=false) has no score to mark.
  assert report_section._share_cell({}, "causal", False, True) == "-"


def test_the_printed_line_names_every_measure_the_result_holds():
  """With both probes off diagnose printed 'diagnostics at step 40 -> ...: ' and nothing else
  while the JSON held a dead prefix; the rank of HC/mHC's late map was never printed."""
  result = {"angular": {"late_consecutive_mean": 0.1234},
            "dead_prefix": {"dead_prefix": 2, "threshold": 0.09}}
  assert diagnose.headline(result) == ("late angular distance 0.123, dead prefix 2 layers "
                                       "(own-block weight below 0.09)")
  result = {"angular": {"late_consecutive_mean": None},
            "causal": {"share": 0.25, "threshold": 0.45},
            "permutation": {"share": None, "threshold": 0.15},
            "mixing": {"erank_late": 3.456}}
  assert diagnose.headline(result) == (
      "late angular distance n/a, causal share 25.0% (late pairs above 0.45), permutation share "
      "n/a (no late pairs) (late pairs above 0.15), late residual map erank 3.46")
