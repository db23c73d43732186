"""The scorecard renders from a small results fixture (three designs, three shapes, two LRs)."""

import csv
import os
import shutil
import sys
import types

import pytest

from depthbench_jax import report, sweep
from depthbench_jax.report import __main__ as report_main
from depthbench_jax.report import scorecard

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                       "results_small")


def test_collect_runs_reads_every_summary():
  records = report.collect_runs(FIXTURE)
  assert len(records) == 15  # preln_32x896_lr4e-3 has checkpoints but no summary: not a run.
  old = next(r for r in records if r["name"] == "attnres_block_16x1216_lr1e-3")
  assert (old["n_layers"], old["d_model"], old["lr"]) == (16, 1216, 1e-3)  # from its config


def test_trend_rule():
  ref = (16, 32)
  assert report.depth_trend({16: 2.759, 24: 2.763, 32: 2.782}, ref) == "worse when deeper"
  assert report.depth_trend({16: 2.729, 24: 2.712, 32: 2.699}, ref) == "better when deeper"
  assert report.depth_trend({16: 2.741, 20: 2.715, 32: 2.730}, ref) == "peak in the middle (L=20)"
  assert report.depth_trend({16: 2.700, 32: 2.702}, ref) == "flat"
  assert report.depth_trend({16: 2.700, 32: 2.698}, ref) == "flat"   # within the tolerance
  # A middle depth that beats only the shallow end is no peak: the deep end is the trend.
  assert report.depth_trend({16: 2.700, 24: 2.698, 32: 2.750}, ref) == "worse when deeper"
  assert report.depth_trend({16: 2.7}, ref) == "n/a"
  # The caption's "an in-between depth beats both": a deeper shape beyond the pair, better
  # still, made 24 no peak and the pair read 'flat'.
  assert (report.depth_trend({16: 2.760, 24: 2.735, 32: 2.758, 70: 2.730}, ref)
          == "peak in the middle (L=24)")


def test_report_renders(tmp_path):
  out = tmp_path / "out"
  assert report_main.main([FIXTURE, "--out", str(out)]) == 0
  text = (out / "report.md").read_text()
  # Two LRs per shape: every best LR is at an edge, at both reference depths and best shape.
  assert ("| preln | 2.759 † | 2.782 † | worse when deeper | 16x1216 (76.0) | 2.759 | 2e-3 † |"
          in text)
  assert ("| hc | 2.729 † | 2.699 † | better when deeper | 32x896 (28.0) | 2.699 | 1e-3 † |"
          in text)
  assert "peak in the middle (L=24) | 24x1024 (42.7) | 2.715 | 1e-3 ‡ |" in text  # one LR tried
  assert "‡ the only LR tried at that shape" in text
  assert "## Against the paper (400M)" in text
  # The sections the packages hook in (report.scorecard.HOOKS), as they render on real runs.
  assert "## Systems" in text and "failed:" not in text
  # The best-LR runs all trained 8.15B tokens; the diverged HC runs' 1.26B are no budget.
  assert "trained different token counts" not in text
  assert "diverged @1200" in text and "hc_32x896_lr2e-3 | diverged | 1200" in text
  for design in ("preln", "hc", "attnres_block", "all"):
    png = out / "plots" / f"loss_vs_aspect_{design}.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert f"plots/loss_vs_aspect_{design}.png" in text
  assert "its height means nothing" in text.split("## Loss vs aspect ratio")[1].split("![")[0]
  with open(out / "runs.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 15
  best = {r["name"] for r in rows if r["best_lr"] == "True"}
  assert "hc_32x896_lr1e-3" in best and "hc_32x896_lr2e-3" not in best
  assert len(best) == 9  # one per (design, shape)


def test_readme_names_every_runs_csv_column():
  """README's "Where results land" named runs.csv but none of its columns (best_lr, family: what
  are they?)."""
  import re
  with open(os.path.join(os.path.dirname(FIXTURE), "..", "..", "README.md")) as f:
    text = f.read()
  where = re.search(r"### Where results land(.*?)\n## ", text, re.S).group(1)
  assert [k for k in scorecard.CSV_FIELDS if f"`{k}`" not in where] == [], where
  # And the marks report.md puts on a best-LR loss, which it explains only in footnotes.
  assert [m for m in ("`†`", "`‡`", "`§`", "`no summary yet`", "`not run`")
          if m not in where] == [], where


def test_report_into_results_dir_and_rerun(tmp_path):
  results = tmp_path / "results"
  shutil.copytree(FIXTURE, results)
  paths = scorecard.write_report(str(results), plots=False)
  assert paths and os.path.exists(results / "report.md")
  # Re-running over a dir that now holds report.md / runs.csv reads the same runs.
  assert len(report.collect_runs(str(results))) == 15
  (tmp_path / "empty").mkdir()
  assert report_main.main([str(tmp_path / "empty")]) == 1


def test_a_results_dir_that_does_not_exist_is_one_error_line(tmp_path, capsys):
  # A typo in the path said "no run under ...; nothing to report" (exit 1), as if the sweep had
  # not started: now one error line naming the path, exit 2, and nothing written.
  with pytest.raises(SystemExit) as exit_info:
    report_main.main([str(tmp_path / "reslts"), "--no_plots"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and "reslts" in err[0], err
  assert "allowed:" in err[0]
  assert not os.path.exists(tmp_path / "reslts")


def test_an_out_that_is_a_file_is_one_error_line(tmp_path, capsys):
  # --out=report.md (a file, as if --out named the report) was a FileExistsError traceback.
  results = tmp_path / "results"
  shutil.copytree(FIXTURE, results)
  (tmp_path / "report.md").write_text("mine\n")
  with pytest.raises(SystemExit) as exit_info:
    report_main.main([str(results), "--no_plots", f"--out={tmp_path / 'report.md'}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --out=") and "allowed:" in err[0], err
  assert (tmp_path / "report.md").read_text() == "mine\n"
  # A file where the plots go (a sweep's report after every run trained): a FileExistsError
  # traceback and no report.md; one line now, and nothing written.
  (results / "plots").write_text("x")
  with pytest.raises(SystemExit) as exit_info:
    report_main.main([str(results)])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      f"error: results_dir {results}: {results / 'plots'} is a file; allowed: a folder there "
      f"(made if missing)"]
  assert not (results / "report.md").exists()


def test_report_interrupted_while_rendering_keeps_the_previous_report(tmp_path, monkeypatch):
  # Ctrl-C during the report (here in the slow systems section) must leave the last report
  # whole, not an empty report.md.
  results = tmp_path / "results"
  shutil.copytree(FIXTURE, results)
  scorecard.write_report(str(results), plots=False)
  before = (results / "report.md").read_text()

  def interrupted(records, relative_to=None):
    raise KeyboardInterrupt
  monkeypatch.setattr(scorecard, "hook_sections", interrupted)
  with pytest.raises(KeyboardInterrupt):
    scorecard.write_report(str(results), plots=False)
  assert (results / "report.md").read_text() == before
  assert not [f for f in os.listdir(results) if ".tmp" in f]
  # runs.csv alike: a write stopped in its middle (here at the second row) left a torn one.
  csv_before = (results / "runs.csv").read_text()
  monkeypatch.undo()
  calls = []

  def stopped_at_the_second_row(self, row):
    calls.append(row)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return real_writerow(self, row)
  import csv
  real_writerow = csv.DictWriter.writerow
  monkeypatch.setattr(csv.DictWriter, "writerow", stopped_at_the_second_row)
  with pytest.raises(KeyboardInterrupt):
    scorecard.write_report(str(results), plots=False)
  assert (results / "runs.csv").read_text() == csv_before
  assert not [f for f in os.listdir(results) if ".tmp" in f]


def test_report_lists_runs_without_a_summary(tmp_path):
  # A sweep in progress: one run still training (metrics, a checkpoint at 10, no summary) is
  # listed with where it stands; the fixture's empty-checkpoints folder is not a run.
  results = tmp_path / "results"
  shutil.copytree(FIXTURE, results)
  live = results / "hc_24x1024_lr4e-3"
  (live / "checkpoints" / "9").mkdir(parents=True)    # 9 < 10, though "9" > "10"
  (live / "checkpoints" / "10").mkdir(parents=True)
  (live / "metrics.jsonl").write_text('{"step": 10, "train/loss": 4.5}\n'
                                      '{"step": 12, "train/loss": 4.25}\n')
  scorecard.write_report(str(results), plots=False)
  text = (results / "report.md").read_text()
  assert "## Runs without a summary" in text
  assert "| hc_24x1024_lr4e-3 | 12 | 4.250 | 10 |" in text
  assert "preln_32x896_lr4e-3 |" not in text.split("## Runs without a summary")[1]


def test_a_sweep_with_no_finished_run_yet_reports_where_its_runs_stand(tmp_path, capsys):
  # Mid-sweep, before any summary: the report was "nothing to report" (exit 1), though the
  # runs' progress was there to show; now report.md is the runs-without-a-summary table.
  live = tmp_path / "results" / "hc_8x96_lr3e-3"
  (live / "checkpoints" / "20").mkdir(parents=True)
  (live / "metrics.jsonl").write_text('{"step": 25, "train/loss": 3.5}\n')
  assert report_main.main([str(tmp_path / "results"), "--no_plots"]) == 0
  text = (tmp_path / "results" / "report.md").read_text()
  assert "no run has finished yet" in text
  assert "| hc_8x96_lr3e-3 | 25 | 3.500 | 20 |" in text
  assert capsys.readouterr().out.split() == [str(tmp_path / "results" / "report.md")]


@pytest.mark.parametrize("content", [b'{"name": "hc_24x1024_lr1e-3", "status": "o', b"[]",
                                     b"\xff\xfe", b"{}", b'{"status": "ok", "design": "hc"}'],
                         ids=["cut-short", "not-an-object", "not-utf8", "empty", "no-shape"])
def test_a_torn_summary_lists_its_run_as_unfinished(tmp_path, content):
  # A summary.json left empty or cut short (a full disk, a copy cut short), or holding no JSON
  # object or one no trainer wrote ({}: it was dropped from the report without a word), is no
  # result, and the run must not vanish from the report nor stop it (a list or
  # foreign bytes raised AttributeError / UnicodeDecodeError there, as the sweep reads it): it
  # is listed with the runs without a summary, which a sweep re-launches.
  results = tmp_path / "results"
  shutil.copytree(FIXTURE, results)
  torn = results / "hc_24x1024_lr1e-3"
  (torn / "summary.json").write_bytes(content)
  (torn / "metrics.jsonl").write_text('{"step": 1200, "train/loss": 2.75}\n')
  (torn / "checkpoints" / "1200").mkdir(parents=True)
  scorecard.write_report(str(results), plots=False)
  text = (results / "report.md").read_text()
  assert "| hc_24x1024_lr1e-3 (summary.json unreadable) | 1200 | 2.750 | 1200 |" in text


def test_multiscale_families():
  records = [
      {"name": f"hc_{L}x{d}", "design": "hc", "n_layers": L, "d_model": d, "lr": 1e-3,
       "aspect_ratio": d / L, "status": "ok", "final_val_loss": loss, "params_total": p,
       "workdir": "/nonexistent"}
      for L, d, loss, p in ((16, 800, 3.0, 205e6), (32, 608, 2.9, 205e6),
                            (16, 1344, 2.7, 482e6), (32, 992, 2.8, 482e6))]
  text = scorecard.build_report(records)
  assert "Scale family 0" in text and "Scale family 1" in text
  rows = scorecard.scorecard_rows(records)
  assert [r["trend"] for r in rows] == ["better when deeper", "worse when deeper"]


def test_multiscale_families_survive_a_missing_shape():
  # The 200M suite's 32-layer run has not finished: every other shape keeps its scale family
  # (families were width ranks within a depth, which shifted 300M's 16x1024 into 200M's table).
  run = lambda L, d, p, loss: {
      "name": f"preln_{L}x{d}", "design": "preln", "n_layers": L, "d_model": d, "lr": 1e-3,
      "aspect_ratio": d / L, "status": "ok", "final_val_loss": loss, "params_total": p,
      "workdir": f"/nonexistent/{L}x{d}"}
  records = [run(16, 800, 204e6, 3.0), run(16, 1024, 304e6, 2.9), run(16, 1344, 490e6, 2.8),
             run(32, 768, 306e6, 2.85), run(32, 992, 488e6, 2.75)]
  scorecard.assign_families(records)
  assert [r["family"] for r in records] == [0, 1, 2, 1, 2]
  text = scorecard.build_report(records)
  assert "val loss at 16 layers | a second depth (none run yet)" in text
  assert "## Against the paper (400M)" not in text


def test_family_sizes_read_the_smallest_count_and_single_width_depths_do_not_merge_scales():
  run = lambda design, L, d, p: {"name": f"{design}_{L}x{d}", "design": design, "n_layers": L,
                                 "d_model": d, "params_total": p}
  # MoDA's extra depth-K/V parameters must not move 16x800 out of the 200M family.
  records = [run("preln", 16, 800, 200e6), run("moda", 16, 800, 250e6),
             run("preln", 16, 1024, 300e6), run("preln", 32, 608, 205e6)]
  scorecard.assign_families(records)
  assert [r["family"] for r in records] == [0, 0, 1, 0]
  # One depth at two widths, another at one: still two scales.
  records = [run("preln", 16, 800, 205e6), run("preln", 16, 1344, 482e6),
             run("preln", 32, 608, 205e6)]
  scorecard.assign_families(records)
  assert [r["family"] for r in records] == [0, 1, 0]


def test_a_family_holds_one_shape_per_depth():
  """The 400M suite and the multi-scale suite reported together: 482-485M is under 1.2x the
  400M family's first shape (402M), so the 500M shapes joined it and 32x992 replaced 32x896 in
  the 32-layer column (exact counts of the suites' shapes)."""
  run = lambda L, d, p: {"name": f"preln_{L}x{d}", "design": "preln", "n_layers": L,
                         "d_model": d, "params_total": p}
  four = [run(16, 1216, 407.41e6), run(20, 1120, 415.1e6), run(24, 1024, 406.5e6),
          run(32, 896, 402.07e6), run(42, 800, 407.3e6), run(56, 704, 408.9e6),
          run(70, 640, 411.4e6)]
  five = [run(16, 1344, 481.95e6), run(32, 992, 481.72e6), run(48, 832, 485.0e6)]
  scorecard.assign_families(four + five)
  assert [r["family"] for r in four] == [0] * 7 and [r["family"] for r in five] == [1] * 3


def test_suites_of_other_recipes_reported_together_are_other_families(tmp_path):
  """The smoke sweep (bytes, seq 128, 120 steps) and the 400M suite under one results folder,
  one width per depth: one family, whose best Pre-LN shape was the smoke run's 4x128 (a loss
  per byte beside losses per GPT-2 token). Their recipes now tell them apart."""
  smoke = {"data": {"tokenizer": "byte", "seq_len": 128}, "steps": 120, "lr": 3e-3,
           "model": {"n_layers": 4, "d_model": 128}}
  paper = {"data": {"tokenizer": "gpt2", "seq_len": 2048}, "steps": -1, "lr": 1e-3,
           "model": {"n_layers": 16, "d_model": 1216}}
  _finished(tmp_path / "smoke", "preln", 4, 128, 3e-3, 2.62, config=smoke)
  _finished(tmp_path / "smoke", "preln", 8, 96, 3e-3, 2.65, config=smoke)
  (tmp_path / "suite_400m").mkdir()
  _finished(tmp_path / "suite_400m", "preln", 16, 1216, 1e-3, 2.759, config=paper)
  _finished(tmp_path / "suite_400m", "preln", 32, 896, 1e-3, 2.782, config=paper)
  records = scorecard.collect_runs(str(tmp_path))
  scorecard.assign_families(records)
  family = {(r["n_layers"], r["d_model"]): r["family"] for r in records}
  assert family[(4, 128)] == family[(8, 96)] != family[(16, 1216)] == family[(32, 896)]
  # A run without a config first in line (an old summary) once started a cluster whose empty
  # config differed from no recipe, and took both suites in.
  old = {"name": "aaa", "design": "preln", "n_layers": 4, "d_model": 128}
  assert [len(c) for c in scorecard.recipe_clusters([old] + records)] == [3, 2]
  text = scorecard.build_report(records)
  assert ("| preln | 2.759 ‡ | 2.782 ‡ | worse when deeper | 16x1216 (76.0) | 2.759 | 1e-3 ‡ |"
          in text)
  assert "§" not in text   # no LR of one suite counts as missing from the other's grid


def test_a_copy_of_another_recipe_at_a_shape_is_set_aside_and_named(tmp_path):
  """README's one-run example (``configs/smoke.py:arch=hc,shape=8x96 --config.steps=200`` into
  results/try) beside the smoke sweep's run of the same name (120 steps): the 200-step run won
  HC's best LR and beat Pre-LN's 120-step loss, marked only '(2 runs)'. The recipe with more
  runs is reported; the copy is set aside, named by its folder with the field it differs in.
  LR, seed and data path are a run's own: no recipe."""
  short = {"steps": 120, "warmup_steps": 12, "model": {"n_layers": 8, "d_model": 96}}
  (tmp_path / "smoke").mkdir()
  (tmp_path / "try").mkdir()
  _finished(tmp_path / "smoke", "hc", 8, 96, 3e-3, 2.70, config=short)
  _finished(tmp_path / "try", "hc", 8, 96, 3e-3, 2.55, config={**short, "steps": 200})
  _finished(tmp_path / "smoke", "preln", 8, 96, 3e-3, 2.72,
            config={**short, "lr": 3e-3, "seed": 1, "data": {"path": "/elsewhere"}})
  _finished(tmp_path / "smoke", "preln", 8, 96, 1e-3, 2.74, config={**short, "lr": 1e-3})
  kept, aside = scorecard.set_aside_other_recipes(scorecard.collect_runs(str(tmp_path)))
  assert len(kept) == 3 and [(r["workdir"], d) for r, d in aside] == [
      (str(tmp_path / "try" / "hc_8x96_lr0.003"), {"steps": (200, 120)})]
  scorecard.write_report(str(tmp_path), plots=False)
  text = (tmp_path / "report.md").read_text()
  assert _scorecard_row(text, "hc").startswith("| hc | 2.700 ‡ |")
  assert "(2 runs)" not in text
  assert ("## Set aside: 1 run of another recipe" in text
          and "- `try/hc_8x96_lr0.003`: steps=200 (reported: 120)" in text)
  with open(tmp_path / "runs.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 4 and [r["best_lr"] for r in rows if "try" in r["workdir"]] == ["False"]
  assert [r["set_aside"] for r in rows if "try" in r["workdir"]] == ["True"]
  assert sum(r["best_lr"] == "True" for r in rows) == 2 and sum(r["set_aside"] == "True"
                                                                 for r in rows) == 1


def test_runs_that_skipped_non_finite_steps_are_named(tmp_path):
  """A diverged run resumed under skip_nonfinite_steps finished 'ok' a skipped batch apart from
  its clean copy, and report.md said '0 diverged' with no word of it (runs.csv had no column)."""
  _finished(tmp_path, "preln", 4, 128, 3e-3, 3.006, skipped_steps=1)
  _finished(tmp_path, "preln", 8, 96, 3e-3, 2.987, skipped_steps=0)
  scorecard.write_report(str(tmp_path), plots=False)
  text = (tmp_path / "report.md").read_text()
  assert "0 diverged; 1 skipped non-finite steps (preln_4x128_lr0.003 (1)); " in text
  with open(tmp_path / "runs.csv") as f:
    assert sorted(r["skipped_steps"] for r in csv.DictReader(f)) == ["0", "1"]


def test_the_suites_planned_recipe_is_the_one_reported(tmp_path):
  """A suite edited after some runs finished (here: steps 120 -> 60, new folders): more runs of
  the old recipe are on disk, but with ``--config`` the one the suite plans now is reported."""
  old = {"steps": 120}
  for lr in (1e-3, 3e-3, 1e-2):
    _finished(tmp_path, "preln", 8, 96, lr, 2.70 + lr, config=old)
  new = _finished(tmp_path, "preln", 8, 96, 2e-3, 2.80, config={"steps": 60}, name="x")
  kept, aside = scorecard.set_aside_other_recipes(scorecard.collect_runs(str(tmp_path)),
                                                  plan=[{"workdir": str(new), "state": "ok"}])
  assert [r["workdir"] for r in kept] == [str(new)] and len(aside) == 3
  kept, aside = scorecard.set_aside_other_recipes(scorecard.collect_runs(str(tmp_path)))
  assert len(kept) == 3 and [r["workdir"] for r, _ in aside] == [str(new)]


def test_lr_untuned_counts_learning_rates_not_runs():
  run = lambda loss, folder: {"name": "base", "design": "preln", "n_layers": 4, "d_model": 64,
                              "lr": 1e-3, "aspect_ratio": 16.0, "status": "ok",
                              "final_val_loss": loss, "workdir": folder}
  (group,) = scorecard.select_best_lr([run(2.8, "/r/a"), run(2.9, "/r/b")]).values()
  assert group["lr_untuned"] and not group["lr_at_edge"]


def test_loss_curves_plot_each_shapes_best_lr_run():
  from depthbench_jax.report import plots
  run = lambda lr, loss: {"name": f"preln_8x64_lr{lr}", "design": "preln", "n_layers": 8,
                          "d_model": 64, "lr": lr, "aspect_ratio": 8.0, "status": "ok",
                          "final_val_loss": loss, "family": 0, "workdir": f"/r/{lr}"}
  records = [run(1e-3, 3.0), run(2e-3, 2.8)]
  curves = plots._best_curves(records, scorecard.select_best_lr(records), "preln")
  assert curves == {0: [(8.0, 2.8, 8)]}


def test_lr_table_shows_the_best_of_two_runs_at_one_lr_and_csv_marks_by_run(tmp_path):
  run = lambda loss, status, folder: {
      "name": "base", "design": "preln", "n_layers": 4, "d_model": 64, "lr": 1e-3,
      "aspect_ratio": 16.0, "status": status, "final_val_loss": loss, "workdir": folder}
  stale, good = run(None, "running", "/r/a_old"), run(2.78, "ok", "/r/b_new")
  other = dict(run(2.90, "ok", "/r/c"), lr=2e-3)
  records = [stale, good, other]
  groups = scorecard.select_best_lr(records)
  table = scorecard.lr_table(records, groups)
  assert "| **2.780** † (2 runs) | 2.900 |" in table
  scorecard.assign_families(records)
  scorecard.write_csv(records, str(tmp_path / "runs.csv"), groups)
  with open(tmp_path / "runs.csv") as f:
    marks = [(r["workdir"], r["best_lr"]) for r in csv.DictReader(f)]
  assert marks == [("/r/a_old", "False"), ("/r/b_new", "True"), ("/r/c", "False")]


def test_hook_sections(tmp_path, monkeypatch):
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  (run_dir / "diagnostics.json").write_text("{}")
  fake = types.ModuleType("depthbench_jax.evals")
  fake.evals_table = lambda runs, relative_to: "EVALS TABLE"
  monkeypatch.setitem(sys.modules, "depthbench_jax.evals", fake)
  diag = types.ModuleType("depthbench_jax.diagnostics")
  diag.diagnostics_table = lambda runs, relative_to: f"DIAG of {len(runs)} in {relative_to}"
  monkeypatch.setitem(sys.modules, "depthbench_jax.diagnostics", diag)
  records = [{"name": "a", "workdir": str(run_dir)}, {"name": "b", "workdir": str(tmp_path)}]
  sections = dict(scorecard.hook_sections(records, relative_to="/results"))
  assert sections["Diagnostics"] == "DIAG of 2 in /results"   # every record: it picks best LRs
  assert "Evals" not in sections  # No run has evals.json.
  broken = types.ModuleType("depthbench_jax.systems")
  broken.systems_table = lambda runs, relative_to: 1 / 0
  monkeypatch.setitem(sys.modules, "depthbench_jax.systems", broken)
  assert "failed: ZeroDivisionError" in dict(scorecard.hook_sections(records))["Systems"]


def test_loss_vs_aspect_draws_the_best_lr_curve_other_lrs_and_diverged_runs(tmp_path, monkeypatch):
  """Per design: the line is each shape's best-LR loss (shallow-wide to deep-narrow), the grey
  dots the other usable LRs, the crosses the diverged runs at their aspect ratio; the 'all' figure
  has one line per design."""
  import matplotlib.figure
  from depthbench_jax.report import plots
  records = scorecard.collect_runs(FIXTURE)
  scorecard.assign_families(records)
  saved = {}
  monkeypatch.setattr(
      matplotlib.figure.Figure, "savefig",
      lambda fig, path, **kw: saved.__setitem__(os.path.basename(path), fig.axes[0]))
  plots.loss_vs_aspect(records, scorecard.select_best_lr(records), str(tmp_path))
  ar = [76.0, pytest.approx(1024 / 24), 28.0]
  line = lambda ax: (list(ax.lines[0].get_xdata()), list(ax.lines[0].get_ydata()))
  dots = lambda ax: {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
  assert line(saved["loss_vs_aspect_preln.png"]) == (ar, [2.759, 2.763, 2.782])  # 2e-3 at 16L
  hc = saved["loss_vs_aspect_hc.png"]
  assert line(hc) == (ar, [2.729, 2.712, 2.699])
  assert dots(hc) == {"other LRs": [[pytest.approx(1024 / 24), 2.72]],
                      "diverged or no finite val loss (below the line)": [[76.0, 0.02],
                                                                          [28.0, 0.02]]}
  # Each cross names its LR and sits in a band of its own, below every loss and every tick: a
  # cross alone, at the lowest height of the plot, read as the best val loss of its shape.
  low = min(y for line in hc.lines[:1] for y in line.get_ydata())
  assert all(t >= hc.get_ylim()[0] + 0.1 * (hc.get_ylim()[1] - hc.get_ylim()[0])
             for t in hc.get_yticks()) and low > hc.get_ylim()[0]
  lrs = {r["aspect_ratio"]: r["lr"] for r in records
         if r["design"] == "hc" and r.get("status") == "diverged"}
  assert sorted(t.get_text() for t in hc.texts if t.get_text().startswith("lr ")) == sorted(
      f"lr {sweep.format_lr(lr)}" for lr in lrs.values())
  every = saved["loss_vs_aspect_all.png"]
  assert [l.get_label() for l in every.lines] == ["attnres_block", "hc", "preln"]
  # Its x is the aspect ratio too (not n_layers), and every axis runs shallow-wide on the left
  # to deep-narrow on the right on a log scale, as the captions say.
  assert [list(l.get_xdata()) for l in every.lines] == [ar] * 3
  assert all(ax.xaxis_inverted() and ax.get_xscale() == "log" for ax in saved.values())
  # A run finished (status ok) with a NaN val loss is a cross too; it was drawn nowhere.
  next(r for r in records if (r["design"], r["n_layers"], r["final_val_loss"]) == (
      "hc", 24, 2.72))["final_val_loss"] = float("nan")
  plots.loss_vs_aspect(records, scorecard.select_best_lr(records), str(tmp_path))
  hc = saved["loss_vs_aspect_hc.png"]
  assert "other LRs" not in dots(hc) and dots(hc)[
      "diverged or no finite val loss (below the line)"] == [
          [76.0, 0.02], [pytest.approx(1024 / 24), 0.02], [28.0, 0.02]]
  # The loss axis names its unit (it said "final val loss"; the evals section says nats/token).
  assert {ax.get_ylabel() for ax in saved.values()} == {"final val loss (nats/token)"}
  # Two lost runs at one shape: their LR labels one above the other (printed on top of each
  # other once, the caption's 'labelled with its LR' unreadable).
  twin = dict(next(r for r in records if r["design"] == "hc" and r["n_layers"] == 16
                   and r.get("status") == "diverged"), lr=9e-3, name="hc_16x1216_lr9e-3")
  plots.loss_vs_aspect(records + [twin], scorecard.select_best_lr(records + [twin]),
                       str(tmp_path))
  at_16 = [t.xyann for t in saved["loss_vs_aspect_hc.png"].texts
           if t.xy[0] == 76.0 and t.get_text().startswith("lr ")]
  assert len(at_16) == 2 and len(set(at_16)) == 2, at_16


def test_a_design_keeps_its_colour_whichever_designs_a_figure_holds():
  """Colours by the registry's order: by order of appearance, HC was C3 in the report's plot
  (sorted by run name) and C1 in the decode bench's; one design's results moved the others."""
  from depthbench_jax.report import plots
  assert (plots.design_colors(["hc", "preln"])["hc"] == plots.design_colors(["preln", "hc"])["hc"]
          == plots.design_colors(["attnres_block", "hc"])["hc"])
  assert len(set(plots.design_colors(["preln", "hc", "mhc"]).values())) == 3
  # A variant in the results (eleven labels) moved every design to tab20: HC from C5 to a
  # light green, keel to sandwich's colour.
  import matplotlib.colors
  hex_ = lambda c: matplotlib.colors.to_hex(c)
  alone = plots.design_colors(["hc", "keel", "sandwich"])
  with_variant = plots.design_colors(["hc", "keel", "sandwich", "hc(n_streams=2)"])
  assert all(hex_(alone[d]) == hex_(with_variant[d]) for d in alone)
  from depthbench_jax.residual import registry
  every = plots.design_colors(list(registry.names()) + ["hc(n_streams=2)", "mhc(n_streams=2)"])
  assert len({hex_(c) for c in every.values()}) == len(every)


def test_loss_vs_aspect_all_draws_no_two_lines_alike_with_eleven_designs(tmp_path, monkeypatch):
  """An eleventh design took the ten-colour cycle's first colour again, and a second scale
  family of one design another design's: two lines drawn alike in one legend."""
  import matplotlib.colors
  import matplotlib.figure
  from depthbench_jax.report import plots
  designs = [f"design{i:02d}" for i in range(11)]
  records = [{"name": f"{d}_{L}x{w}_lr1e-3", "design": d, "n_layers": L, "d_model": w,
              "lr": 1e-3, "aspect_ratio": w / L, "status": "ok", "final_val_loss": 2.8 - i / 100,
              "family": family, "workdir": f"/r/{d}_{L}x{w}"}
             for i, d in enumerate(designs)
             for L, w, family in ((4, 128, 0), (8, 96, 0)) + (((8, 192, 1),) if i == 1 else ())]
  saved = {}
  monkeypatch.setattr(
      matplotlib.figure.Figure, "savefig",
      lambda fig, path, **kw: saved.__setitem__(os.path.basename(path), fig.axes[0]))
  plots.loss_vs_aspect(records, scorecard.select_best_lr(records), str(tmp_path))
  lines = saved["loss_vs_aspect_all.png"].lines
  assert len(lines) == 12
  styles = {(matplotlib.colors.to_hex(l.get_color()), l.get_linestyle()) for l in lines}
  assert len(styles) == 12, [(l.get_label(), l.get_color(), l.get_linestyle()) for l in lines]


def _finished(root, design, L, d, lr, loss, status="ok", name=None, **extra):
  """A run folder with a hand-written summary.json (no training)."""
  import json
  name = name or f"{design}_{L}x{d}_lr{lr:g}"
  os.makedirs(root / name)
  (root / name / "summary.json").write_text(json.dumps(dict(
      name=name, design=design, n_layers=L, d_model=d, aspect_ratio=d / L, lr=lr,
      final_val_loss=loss, status=status, params_total=1e6, **extra)))
  return root / name


def _grid(root, design, losses, lrs=(5e-4, 1e-3, 2e-3, 4e-3)):
  for (L, d), row in losses.items():
    for lr, loss in zip(lrs, row):
      if loss is not None:
        _finished(root, design, L, d, lr, loss)


def _scorecard_row(text, design):
  return next(l for l in text.splitlines() if l.startswith(f"| {design} |"))


def test_an_edge_lr_at_a_reference_depth_is_flagged_though_the_best_shape_is_not(tmp_path):
  """Pre-LN's 32-layer loss, which decides 'worse when deeper', came from the grid's top LR
  (4e-3): only the best shape's LR (16L, 1e-3, inside the grid) carried the † mark, so the
  trend read as settled though the paper's protocol says to extend the grid there."""
  _grid(tmp_path, "preln", {(16, 1216): (2.80, 2.759, 2.77, 2.79),
                            (32, 896): (2.85, 2.83, 2.80, 2.782)})
  text = scorecard.build_report(scorecard.collect_runs(str(tmp_path)))
  assert ("| preln | 2.759 | 2.782 † | worse when deeper | 16x1216 (76.0) | 2.759 | 1e-3 |"
          == _scorecard_row(text, "preln"))
  assert "| preln | 32x896 | 28.0 | 2.850 | 2.830 | 2.800 | **2.782** † |" in text
  assert "† best LR at an edge of the grid tried" in text


def test_a_design_variant_is_reported_apart_from_its_design(tmp_path):
  """README's one-run example with ``--config.model.residual.n_streams=2`` beside the suite's
  HC runs: the recipe checks leave a design's options to the run, so the 2-stream run joined
  HC's best-LR choice at 16 layers (2.700 for HC's 2.729) and its depth trend, unmarked. It is
  now its own row, named by the options it set away from the design's defaults."""
  _grid(tmp_path, "hc", {(16, 1216): (2.75, 2.729, 2.74, 2.76),
                         (32, 896): (2.75, 2.699, 2.72, 2.74)})
  _finished(tmp_path, "hc", 16, 1216, 1e-3, 2.700, name="hc_ns2", config={
      "model": {"residual": {"name": "hc", "n_streams": 2, "dynamic": True}}})
  text = scorecard.build_report(scorecard.collect_runs(str(tmp_path)))
  assert _scorecard_row(text, "hc").startswith("| hc | 2.729 | 2.699 |")
  assert _scorecard_row(text, "hc(n_streams=2)").startswith("| hc(n_streams=2) | 2.700 ‡ | – |")
  assert sweep.design_label({"design": "hc", "config": {"model": {"residual": {
      "name": "hc", "n_streams": 4, "retired_option": 1}}}}) == "hc"   # defaults; gone: unnamed


def test_a_mark_only_the_lr_table_shows_is_explained_too(tmp_path):
  """Best LRs inside the grid at both reference depths and the best shape, the grid's bottom LR
  at 56 layers: the LR table showed ``**2.800** †`` and no line of the report said what † was
  (the key read the scorecard's cells only)."""
  _grid(tmp_path, "preln", {(16, 1216): (2.80, 2.759, 2.77, 2.79),
                            (32, 896): (2.85, 2.782, 2.80, 2.81),
                            (56, 704): (2.800, 2.82, 2.84, 2.86)})
  text = scorecard.build_report(scorecard.collect_runs(str(tmp_path)))
  assert "†" not in _scorecard_row(text, "preln")
  assert "| preln | 56x704 | 12.6 | **2.800** † |" in text
  assert "† best LR at an edge of the grid tried: the optimum may lie outside it." in text


def test_runs_csv_names_each_run_by_its_folder(tmp_path):
  """A copy of a run under another folder repeated its config's name in runs.csv, while
  report.md names runs by folder: two rows called preln_4x128_lr1e-3."""
  import json
  _finished(tmp_path, "preln", 4, 128, 1e-3, 3.0)
  copy = tmp_path / "copy"
  copy.mkdir()
  (copy / "summary.json").write_text(
      (tmp_path / "preln_4x128_lr0.001" / "summary.json").read_text())
  assert json.loads((copy / "summary.json").read_text())["name"] == "preln_4x128_lr0.001"
  scorecard.write_report(str(tmp_path), plots=False)
  with open(tmp_path / "runs.csv") as f:
    assert sorted(r["name"] for r in csv.DictReader(f)) == ["copy", "preln_4x128_lr0.001"]


def test_a_run_restarted_and_stopped_before_its_first_log_is_still_a_run(tmp_path):
  """A run restarted from step 0 (no checkpoint) and stopped before it logged: its config.json
  and metrics.jsonl's session line alone. Its earlier records are rightly dropped, and then the
  report said 'no run ... nothing to report'. An HF export's hf/config.json is no run."""
  import json
  restarted = tmp_path / "preln_4x128_lr1e-3"
  restarted.mkdir()
  (restarted / "config.json").write_text(json.dumps(
      {"lr": 1e-3, "model": {"n_layers": 4, "d_model": 128, "residual": {"name": "preln"}}}))
  (restarted / "metrics.jsonl").write_text('{"step": 30, "train/loss": 5.0}\n'
                                           '{"step": 0, "session_from": 0.0}\n')
  (tmp_path / "hc_4x128_lr1e-3" / "hf").mkdir(parents=True)
  (tmp_path / "hc_4x128_lr1e-3" / "hf" / "config.json").write_text('{"model_type": "llama"}')
  _finished(tmp_path, "hc", 4, 128, 1e-3, 3.0)
  unfinished = scorecard.collect_unfinished(str(tmp_path))
  assert [(u["name"], u["key"], u["step"]) for u in unfinished] == [
      ("preln_4x128_lr1e-3", ("preln", 4, 128), None)]


def test_a_best_lr_from_an_incomplete_grid_says_which_lrs_it_lacks(tmp_path):
  """Full AttnRes at 24L: lr 1e-3 still training (config.json, metrics, a checkpoint) and the
  best picked from the other three with nothing in the scorecard or the LR table saying so (the
  cell was blank, as for an LR never in the grid); at 20L only 1e-3 ran; a 32L run whose
  summary.json was torn, with no metrics or checkpoint yet, vanished from the report."""
  import json
  _grid(tmp_path, "attnres_full", {(16, 1216): (2.78, 2.751, 2.76, 2.77),
                                   (24, 1024): (2.75, None, 2.73, 2.74),
                                   (32, 896): (None, 2.718, 2.725, 2.73)})
  _finished(tmp_path, "attnres_full", 20, 1088, 1e-3, 2.74)
  live = tmp_path / "attnres_full_24x1024_lr0.001"
  (live / "checkpoints" / "3000").mkdir(parents=True)
  (live / "metrics.jsonl").write_text('{"step": 3100, "train/loss": 2.9}\n')
  (live / "config.json").write_text(json.dumps(
      {"lr": 1e-3, "model": {"n_layers": 24, "d_model": 1024,
                             "residual": {"name": "attnres_full"}}}))
  torn = tmp_path / "attnres_full_32x896_lr0.0005"
  torn.mkdir()
  (torn / "summary.json").write_text('{"name": "attnres_full_32x896_lr5e-4", "sta')
  scorecard.write_report(str(tmp_path), plots=False)
  text = (tmp_path / "report.md").read_text()
  assert _scorecard_row(text, "attnres_full") == (
      "| attnres_full | 2.751 | 2.718 †§ | better when deeper | 32x896 (28.0) | 2.718 "
      "| 1e-3 †§ |")
  assert "§ best of an incomplete LR grid" in text
  assert "| attnres_full | 20x1088 | 54.4 | not run | **2.740** ‡§ | not run | not run |" in text
  assert ("| attnres_full | 24x1024 | 42.7 | 2.750 | no summary yet | **2.730** § | 2.740 |"
          in text)
  assert "| attnres_full | 16x1216 | 76.0 | 2.780 | **2.751** | 2.760 | 2.770 |" in text
  assert "| attnres_full_32x896_lr0.0005 (summary.json unreadable) |  | – |  |" in text
  # The torn run has no config.json: its folder name (sweep.parse_run_name) places it.
  assert ("| attnres_full | 32x896 | 28.0 | no summary yet | **2.718** †§ | 2.725 | 2.730 |"
          in text)
  assert "5 runs without a summary" not in text and "2 without a summary" in text


def test_designs_compared_on_different_shape_sets_say_so(tmp_path):
  """Block AttnRes has no 32L run and only mHC ran 70x640: the scorecard set mHC's best shape
  (70x640) beside designs that never ran it, and Block AttnRes's n/a, with no word of it."""
  for design in ("preln", "mhc", "attnres_block"):
    _finished(tmp_path, design, 16, 1216, 1e-3, 2.76)
    if design != "attnres_block":
      _finished(tmp_path, design, 32, 896, 1e-3, 2.75)
  _finished(tmp_path, "mhc", 70, 640, 1e-3, 2.70)
  _finished(tmp_path, "attnres_block", 32, 896, 1e-3, float("nan"))
  text = scorecard.build_report(scorecard.collect_runs(str(tmp_path)))
  assert _scorecard_row(text, "mhc").endswith("| 70x640 (9.1) | 2.700 | 1e-3 ‡ |")
  assert ("compare different shape sets: preln has none at 70x640 (AR 9.1); attnres_block has "
          "none at 32x896 (AR 28.0), 70x640 (AR 9.1).") in text
  # The NaN run (status 'ok') says why it is excluded, not 'ok'.
  assert "| attnres_block | 32x896 | 28.0 | val loss nan |" in text
  assert "| attnres_block_32x896_lr0.001 | ok |  | final val loss nan |" in text
  # ... and the header counts it beside the diverged runs (it once counted only 'diverged').
  assert "0 diverged; 1 with a non-finite final val loss; 0 without a summary." in text


def test_a_shape_without_a_usable_run_breaks_the_line_instead_of_bridging_it(tmp_path,
                                                                             monkeypatch):
  """HC's 24-layer runs all diverged (Pre-LN's finished): its line joined 16L straight to 32L,
  drawing a 24L value that was never measured; now the line stops at the gap, in both figures."""
  import math
  import matplotlib.figure
  from depthbench_jax.report import plots
  for L, d in ((16, 1216), (24, 1024), (32, 896)):
    _finished(tmp_path, "preln", L, d, 1e-3, 2.75)
    _finished(tmp_path, "hc", L, d, 1e-3, float("nan") if L == 24 else 2.70 - L / 1000,
              status="diverged" if L == 24 else "ok")
  records = scorecard.collect_runs(str(tmp_path))
  scorecard.assign_families(records)
  saved = {}
  monkeypatch.setattr(
      matplotlib.figure.Figure, "savefig",
      lambda fig, path, **kw: saved.__setitem__(os.path.basename(path), fig.axes[0]))
  plots.loss_vs_aspect(records, scorecard.select_best_lr(records), str(tmp_path / "plots"))
  hc_lines = [saved["loss_vs_aspect_hc.png"].lines[0]] + [
      l for l in saved["loss_vs_aspect_all.png"].lines if l.get_label() == "hc"]
  for line in hc_lines:
    ys = list(line.get_ydata())
    assert len(ys) == 3 and ys[0] == 2.684 and math.isnan(ys[1]) and ys[2] == 2.668, ys


def test_runs_name_the_code_they_trained_with(tmp_path):
  """summary.json's ``code`` (one entry per commit its sessions ran) reaches runs.csv's commit
  column, and report.md's header says when the runs span code revisions."""
  from depthbench_jax import revision
  a, b = {"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": True}
  run = lambda name, code: {"name": name, "design": "preln", "n_layers": 4, "d_model": 64,
                            "lr": 1e-3, "aspect_ratio": 16.0, "status": "ok",
                            "final_val_loss": 2.8, "workdir": f"/r/{name}", "code": code}
  records = [run("x", [a]), run("y", [a]), run("z", [a, b]), run("old", None)]
  assert revision.history([a], a) == [a] and revision.history([a], b) == [a, b]
  assert revision.history(None, a) == [a]
  assert scorecard.code_versions_note(records[:2] + records[3:]) == ""
  assert scorecard.code_versions_note(records) == (
      " Trained at 2 code revisions, 1 of the runs resumed under another: runs.csv's commit "
      "column says which; a comparison across them mixes code versions.")
  groups = scorecard.select_best_lr(records)
  scorecard.assign_families(records)
  scorecard.write_csv(records, str(tmp_path / "runs.csv"), groups)
  with open(tmp_path / "runs.csv") as f:
    commits = [r["commit"] for r in csv.DictReader(f)]
  assert commits == ["a" * 12, "a" * 12, "b" * 12 + "+dirty (+1 earlier)", ""]


def test_a_bench_result_names_its_one_commit_like_a_run():
  from depthbench_jax import revision
  assert revision.result_label({"code": {"commit": "c" * 40, "dirty": True}}) == "c" * 12 + "+dirty"
  assert revision.result_label({"code": {"commit": None, "dirty": None}}) == "unknown"  # no git
  assert revision.result_label({}) == "unknown"  # a result from before the field


@pytest.mark.parametrize("total_32", [402.1e6, 373.6e6])
def test_paper_comparison_only_for_shapes_of_one_total(total_32):
  """The iso-backbone control (16x1216 407.4M -> 32x864 373.6M, its backbone fixed) passed as a
  ~400M 16/32-layer sweep and was set beside the paper's iso-total losses. The 400M suite's
  32x896 (402.1M, -1.3%) stays compared; at -8.3% one line says why not."""
  records = report.collect_runs(FIXTURE)
  for r in records:
    if r["n_layers"] == 32:
      r["params_total"] = total_32
  text = scorecard.build_report(records)
  compared = "| architecture | paper 16L | ours 16L |" in text
  assert compared == (total_32 == 402.1e6)
  assert ("Not compared: the 16- and 32-layer models hold 407M and 374M parameters (-8.3%)"
          in text) == (not compared)


def test_paper_comparison_rows_set_the_papers_numbers_beside_ours():
  """Each row: the paper's 16L loss, ours, the paper's 32L, ours, the paper's trend, ours. The
  fixture's losses are the paper's own, where a row printing the paper's number as ours, the
  depths swapped or the paper's trend as ours read the same; three are moved here."""
  records = report.collect_runs(FIXTURE)
  moved = {("preln", 32): -0.05, ("hc", 16): 0.02, ("hc", 32): 0.01}
  for r in records:
    if r["final_val_loss"] is not None:
      r["final_val_loss"] += moved.get((r["design"], r["n_layers"]), 0.0)
  table = scorecard.build_report(records).split("## Against the paper (400M)")[1]
  assert ("| preln | 2.759 | 2.759 † | 2.782 | 2.732 † | worse when deeper | "
          "better when deeper |") in table
  assert ("| hc | 2.729 | 2.749 † | 2.699 | 2.709 † | better when deeper | "
          "better when deeper |") in table
  assert ("| attnres_block | – | 2.741 ‡ | 2.730 | 2.730 ‡ | peak in the middle (best 2.715 at "
          "20 layers) | peak in the middle (L=24) |") in table


@pytest.mark.parametrize("change, differ", [
    ({}, None), ({"data": {"seq_len": 8192}}, "data.seq_len=8192"),
    ({"data": {"tokenizer": "byte"}}, "data.tokenizer='byte'"),
    ({"steps": 2000}, "steps=2000"), ({"data": {"source": "embedded"}}, "data.source='embedded'"),
    ({"data": {"global_batch_size": 128}}, "data.global_batch_size=128"),
    ({"budget_design": ""}, "budget_design=''"),
    ({"tokens_per_param": 5.0}, "tokens_per_param=5.0")])
def test_paper_comparison_only_for_runs_of_the_paper_recipe(change, differ):
  """A long-context copy of the 400M suite (seq 8192) had its losses put beside the paper's
  seq-2048 ones as if one quantity; so did a 2000-step pilot (``steps`` overrides the
  20-tokens-per-parameter budget: 2.1B tokens, not 8B) and a run on the embedded demo text,
  and a byte-tokenized one (only the first recipe field was ever checked: a generator). The
  paper's recipe keeps the table; each other one is a line saying why not."""
  records = report.collect_runs(FIXTURE)
  for r in records:
    data = {"seq_len": 2048, "tokenizer": "gpt2", "source": "parquet", "global_batch_size": 512,
            **change.get("data", {})}
    r["config"] = dict(r.get("config") or {}, data=data, steps=change.get("steps", -1),
                       budget_design=change.get("budget_design", "preln"),
                       tokens_per_param=change.get("tokens_per_param", 20.0))
  text = scorecard.build_report(records)
  assert "## Against the paper (400M)" in text
  compared = "| architecture | paper 16L | ours 16L |" in text
  assert compared == (differ is None)
  assert (f"Not compared: these runs trained with {differ}; the paper's losses are at "
          "data.seq_len=2048" in text) == (differ is not None)


def test_a_family_off_iso_parameter_is_named_under_the_depth_trend():
  """A shape typed in off the solver's width (4x128 at 919K beside 6x112 at 1.01M): report.md
  read 'worse when deeper' with nothing saying the deeper model was 9% bigger; only the sweep's
  warning line did. The iso-backbone kind (same non-embedding count) is not named."""
  records = scorecard.collect_runs(FIXTURE)
  scorecard.assign_families(records)
  assert scorecard.size_spread_note(records) == ""      # the 400M suite's shapes: within 3.2%
  backbone = [dict(r, params_non_embedding=300_000_000,
                   params_total=r["params_total"] * (1.15 if r["n_layers"] == 32 else 1))
              for r in records]
  assert scorecard.size_spread_note(backbone) == ""     # the iso-backbone kind: not named
  for r in records:
    if r["n_layers"] == 32:
      r["params_total"] = int(r["params_total"] * 1.1)
  note = scorecard.size_spread_note(records)
  assert note == (" The shapes are not iso-parameter: 24x1024 has 406,500,000 parameters, 32x896 "
                  "442,310,000 (+8.8%), so the depth trend is also a size trend.")
  assert note in scorecard.build_report(records)


def _seed_copy_records() -> list[dict]:
  """HC at two shapes: 16x1216 single runs, 32x896 two seeds at its best LR (2.727, 2.721)."""
  run = lambda L, d, lr, loss, seed=0: {
      "name": f"hc_{L}x{d}_lr{lr}", "design": "hc", "n_layers": L, "d_model": d, "lr": lr,
      "aspect_ratio": d / L, "status": "ok", "final_val_loss": loss, "family": 0,
      "workdir": f"/r/{L}_{lr}_{seed}"}
  return [run(16, 1216, 1e-3, 2.729), run(16, 1216, 2e-3, 2.74),
          run(32, 896, 1e-3, 2.727), run(32, 896, 1e-3, 2.721, seed=1),
          run(32, 896, 2e-3, 2.75)]


def test_a_best_lr_over_seed_copies_is_marked_as_their_minimum():
  """Two seeds of HC 32x896 at one LR (2.727, 2.721) beside HC 16x1216's single run (2.729):
  the best read 2.721 and the trend 'better when deeper', where the seed-0 run alone is flat
  within TREND_TOL; nothing said it was a minimum of two."""
  records = _seed_copy_records()
  groups = scorecard.select_best_lr(records)
  assert groups[("hc", 32, 896)]["copies"] == 2 and groups[("hc", 16, 1216)]["copies"] == 1
  assert scorecard.lr_marks(("hc", 32, 896), groups) == "†¶"
  assert scorecard.lr_marks(("hc", 16, 1216), groups) == "†"
  text = scorecard.build_report(records)
  assert "¶ the lowest of several runs at that LR" in text


def test_loss_plot_draws_a_seed_copy_at_the_best_lr_apart_from_other_lrs(tmp_path,
                                                                          monkeypatch):
  """The loss plot's grey "other LRs" dots held the best LR's other seed (2.727 at 1e-3)."""
  import matplotlib.figure
  from depthbench_jax.report import plots
  records = _seed_copy_records()
  saved = {}
  monkeypatch.setattr(
      matplotlib.figure.Figure, "savefig",
      lambda fig, path, **kw: saved.__setitem__(os.path.basename(path), fig.axes[0]))
  plots.loss_vs_aspect(records, scorecard.select_best_lr(records), str(tmp_path))
  dots = {c.get_label(): c.get_offsets().tolist()
          for c in saved["loss_vs_aspect_hc.png"].collections}
  assert dots == {"other LRs": [[76.0, 2.74], [28.0, 2.75]],
                  "other runs at the best LR": [[28.0, 2.727]]}


def test_designs_trained_on_other_token_counts_at_a_shape_are_named():
  """A run from before budget_design (MoDA trained 20 tokens per its own, 13% larger, count)
  passed the recipe check, its config having no field to differ in; every summary records its
  tokens, which the report now compares per shape."""
  run = lambda design, tokens: {
      "name": f"{design}_16x1216_lr1e-3", "design": design, "n_layers": 16, "d_model": 1216,
      "lr": 1e-3, "aspect_ratio": 76.0, "status": "ok", "final_val_loss": 2.7,
      "tokens": tokens, "family": 0, "workdir": f"/r/{design}"}
  same = [run("preln", 8.15e9), run("hc", 8.15e9)]
  assert scorecard.token_budget_note(same, scorecard.select_best_lr(same)) == ""
  mixed = same + [run("moda", 9.2e9)]
  note = scorecard.token_budget_note(mixed, scorecard.select_best_lr(mixed))
  assert note == (" At 16x1216 the designs' best-LR runs trained different token counts "
                  "(preln 8.15B, hc 8.15B, moda 9.2B): their losses compare budgets too.")
