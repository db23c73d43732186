"""Measured device-hours: bench results matched to the systems table's models."""

from __future__ import annotations

import json
import os

import pytest

from depthbench_jax.systems import __main__ as cli
from depthbench_jax.systems import measured

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(ROOT, "configs", "smoke.py")
BATCH, SEQ = 2, 64


@pytest.fixture(scope="module")
def cost_rows():
  result = cli.build(SMOKE, 64, designs=["preln", "hc"], shapes=["4x128"], with_xla=False,
                     log=lambda s: None)
  return {r["design"]: r for r in result["rows"]}


def bench_json(path, rows, device="fakedev", commit="abc", remat="nothing_saveable"):
  """A bench result with the fields ``measured`` reads: ``rows`` are (design, flops per token,
  tokens/s, step over Pre-LN)."""
  train = [{"design": d, "shape": "4x128", "step_s": BATCH * SEQ / tps, "tokens_per_s": tps,
            "model_flops_per_step": fpt * BATCH * SEQ, "step_over_preln": ratio,
            "step_over_preln_rounds": {"q1": ratio - 0.01, "median": ratio, "q3": ratio + 0.02},
            "remat_policy": remat}
           for d, fpt, tps, ratio in rows]
  path.write_text(json.dumps({"device": device, "code": {"commit": commit, "dirty": False},
                              "preset": {"batch": BATCH, "seq_len": SEQ, "dtype": "float32"},
                              "train": train}))
  return str(path)


def test_measured_hours_are_the_budget_over_the_timed_throughput(tmp_path, cost_rows):
  pre, hc = cost_rows["preln"], cost_rows["hc"]
  # Pre-LN reads its budget in exactly 2 hours, HC (1.5x slower) in 3.
  tps = pre["train_tokens"] / (2 * 3600)
  hc_tps = hc["train_tokens"] / (3 * 3600)
  path = bench_json(tmp_path / "a.json", [("preln", pre["train_flops_per_token"], tps, 1.0),
                                          ("hc", hc["train_flops_per_token"], hc_tps, 1.5)])
  rows, skipped = measured.match(cost_rows.values(), measured.bench_rows([path]),
                                 peak_flops=1e12)
  assert skipped == []
  got = {r["design"]: r for r in rows}
  assert got["preln"]["device_hours_measured"] == pytest.approx(2.0)
  assert got["hc"]["device_hours_measured"] == pytest.approx(3.0)
  assert got["hc"]["mfu_at_peak"] == pytest.approx(hc["train_flops_per_token"] * hc_tps / 1e12)
  assert got["hc"]["step_over_preln_iqr"] == [pytest.approx(1.49), pytest.approx(1.52)]
  assert got["hc"]["device_hours_analytic"] == hc["device_hours"]
  assert measured.ranking(rows) == ["fakedev 4x128, most device-hours first: "
                                    "hc 1.50x > preln 1.00x"]


def test_a_bench_of_another_model_is_left_out_and_the_first_file_wins(tmp_path, cost_rows):
  pre, hc = cost_rows["preln"], cost_rows["hc"]
  first = bench_json(tmp_path / "a.json", [("preln", pre["train_flops_per_token"], 100.0, 1.0),
                                           ("hc", hc["train_flops_per_token"] * 1.02, 80.0, 1.2)])
  second = bench_json(tmp_path / "b.json", [("preln", pre["train_flops_per_token"], 50.0, 1.0)])
  rows, skipped = measured.match(cost_rows.values(), measured.bench_rows([first, second]),
                                 peak_flops=1e12)
  assert [(r["design"], r["tokens_per_s"]) for r in rows] == [("preln", 100.0)]
  assert len(skipped) == 2 and "hc 4x128 timed a different model" in skipped[0]
  assert first in skipped[0] and skipped[0].endswith(", +2.0%)")   # two figures read equal
  # The second file's Pre-LN, timed on the same device, is left out with a word.
  assert skipped[1] == (f"{second}: preln 4x128 on fakedev is timed by {first} too, given "
                        "first: that one is shown")


def test_one_shape_on_one_device_is_shown_from_one_run(tmp_path, cost_rows):
  """The first file timed Pre-LN at the shape, the second Pre-LN and HC: HC's ratio (against
  the second run's Pre-LN) sat beside the first run's Pre-LN row, and the ranking compared the
  two runs' throughputs. The shape is shown from the first file; HC from the second is named."""
  pre, hc = cost_rows["preln"], cost_rows["hc"]
  first = bench_json(tmp_path / "a.json", [("preln", pre["train_flops_per_token"], 100.0, 1.0)])
  second = bench_json(tmp_path / "b.json", [("preln", pre["train_flops_per_token"], 50.0, 1.0),
                                            ("hc", hc["train_flops_per_token"], 40.0, 1.25)])
  rows, skipped = measured.match(cost_rows.values(), measured.bench_rows([first, second]),
                                 peak_flops=1e12)
  assert [(r["design"], r["source"]) for r in rows] == [("preln", first)]
  assert skipped[1] == (f"{second}: hc 4x128 on fakedev: that shape is shown from {first}, "
                        "given first (its step ratios and ranking compare the designs of one run)")
  rows, skipped = measured.match(cost_rows.values(), measured.bench_rows([second, first]),
                                 peak_flops=1e12)
  assert {(r["design"], r["source"]) for r in rows} == {("preln", second), ("hc", second)}
  assert measured.ranking(rows) == ["fakedev 4x128, most device-hours first: "
                                    "hc 1.25x > preln 1.00x"]


def test_a_bench_under_another_remat_policy_than_the_runs_says_so(tmp_path, cost_rows):
  """The GPU bench times dots_saveable, the suites train nothing_saveable (9% slower for Pre-LN
  at 16x1216 on the H200): the measured device-hours were labelled 'the same models'."""
  pre = cost_rows["preln"]
  assert pre["remat_policy"] == "nothing_saveable"
  for remat, said in (("nothing_saveable", False), ("dots_saveable", True)):
    path = bench_json(tmp_path / f"{remat}.json",
                      [("preln", pre["train_flops_per_token"], 100.0, 1.0)], remat=remat)
    rows, _ = measured.match(cost_rows.values(), measured.bench_rows([path]), peak_flops=1e12)
    text = measured.markdown(rows)
    assert ("Timed under another remat policy than the runs train with (bench dots_saveable, "
            "runs nothing_saveable)" in text) == said, text


def test_each_device_keeps_its_rows_and_the_ranking_orders_by_device_hours(tmp_path, cost_rows):
  pre = cost_rows["preln"]
  rows_of = lambda tps: [("preln", pre["train_flops_per_token"], tps, 1.0)]
  files = [bench_json(tmp_path / "a.json", rows_of(100.0), device="h100"),
           bench_json(tmp_path / "b.json", rows_of(150.0), device="h200")]
  rows, _ = measured.match(cost_rows.values(), measured.bench_rows(files), peak_flops=1e12)
  assert [(r["device"], r["tokens_per_s"]) for r in rows] == [("h100", 100.0), ("h200", 150.0)]
  # Ranked by device-hours, which differ from the step ratios when the budgets differ.
  ranked = [{"device": "d", "shape": "s", "design": "preln", "device_hours_measured": 2.0,
             "step_over_preln": 1.0},
            {"device": "d", "shape": "s", "design": "moda", "device_hours_measured": 1.5,
             "step_over_preln": 1.1}]
  assert measured.ranking(ranked) == ["d s, most device-hours first: preln 1.00x > moda 1.10x"]


def test_cli_adds_the_measured_table_and_refuses_a_file_that_is_not_a_bench_result(
    tmp_path, capsys, cost_rows):
  pre, hc = cost_rows["preln"], cost_rows["hc"]
  path = bench_json(tmp_path / "a.json", [("preln", pre["train_flops_per_token"], 100.0, 1.0),
                                          ("hc", hc["train_flops_per_token"], 80.0, 1.25)])
  out = tmp_path / "sys"
  argv = ["--config", SMOKE, "--seq_len", "64", "--designs", "preln,hc", "--shapes", "4x128",
          "--xla", "false", "--out", str(out)]
  assert cli.main(argv + ["--measured", path]) == 0
  text = capsys.readouterr().out
  assert "Measured training cost" in text
  assert "| hc | 4x128 | fakedev | 80 | 1.250 (1.240-1.270) |" in text
  saved = json.loads((out / "systems.json").read_text())
  assert [r["design"] for r in saved["measured"]] == ["preln", "hc"]

  before = (out / "systems.md").read_text()
  assert cli.main(argv + ["--measured", str(out / "systems.md")]) == 2
  err = capsys.readouterr().err
  assert "--measured=" in err and "cannot read it as JSON" in err
  assert (out / "systems.md").read_text() == before  # The earlier result is kept.


def test_report_section_shows_the_measured_rows_of_the_runs_shapes(tmp_path):
  import shutil
  from depthbench_jax.report import scorecard
  from depthbench_jax.systems.report_section import systems_table
  runs = tmp_path / "results_small"
  shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "results_small"), runs)
  row = {"shape": "16x1216", "n_layers": 16, "device": "fakedev", "source": "b.json",
         "commit": "abc", "batch": 8, "seq_len": 2048, "dtype": "bfloat16", "step_s": 0.1,
         "tokens_per_s": 1e5, "step_over_preln_iqr": [1.4, 1.6], "mfu_at_peak": 0.2,
         "device_hours_measured": 25.0, "device_hours_analytic": 13.0, "mfu_assumed": 0.4}
  timed = [{**row, "design": "preln", "step_over_preln": 1.0},
           {**row, "design": "hc", "step_over_preln": 1.5},
           {**row, "design": "moda", "step_over_preln": 3.8}]  # No run of MoDA: left out.
  (runs / "systems.json").write_text(json.dumps({"seq_len": 4096, "rows": [],
                                                 "measured": timed}))
  # A second systems.json, in one run's own directory, timing HC again: one HC row is shown.
  (runs / "hc_16x1216_lr1e-3" / "systems.json").write_text(json.dumps(
      {"seq_len": 4096, "rows": [], "measured": [{**row, "design": "hc", "step_over_preln": 1.7}]}))
  # A systems.json of another prefill length is not this table's: it is never merged.
  (runs / "preln_16x1216_lr1e-3" / "systems.json").write_text(json.dumps(
      {"seq_len": 64, "rows": [],
       "measured": [{**row, "design": "attnres_block", "step_over_preln": 9.9}]}))
  section = systems_table(scorecard.collect_runs(str(runs)))
  assert "9.900" not in section and "| attnres_block | 16x1216 | fakedev |" not in section
  assert "Measured by the bench on the same models" in section
  assert section.count("| hc | 16x1216 | fakedev |") == 1
  # The nearer file's: HC's run's own (1.7), read before any parent's (the suite's 1.5 once won
  # only because an earlier run reached the suite folder first).
  assert "| hc | 16x1216 | fakedev | 100,000 | 1.700 (1.400-1.600) |" in section
  assert "moda" not in section
  # A file costed at another peak or MFU (systems --peak_flops=1979e12): its measured rows'
  # MFU and device-hours are at that peak, under a table costed at 989 TFLOP/s: not merged.
  (runs / "hc_16x1216_lr1e-3" / "systems.json").write_text(json.dumps(
      {"seq_len": 4096, "rows": [{"design": "hc", "shape": "16x1216", "peak_flops": 1979e12,
                                  "mfu": 0.5}],
       "measured": [{**row, "design": "hc", "step_over_preln": 1.7}]}))
  section = systems_table(scorecard.collect_runs(str(runs)))
  assert "1.700" not in section
  # The whole row: MFU at peak, the measured and the analytic device-hours, each in its column.
  assert ("| hc | 16x1216 | fakedev | 100,000 | 1.500 (1.400-1.600) | 0.200 | 25.0 | 13.0 |"
          in section)
  assert "| MFU at the table's peak | device-h measured | device-h at MFU 0.40 |" in section
  assert ("Measured rows not merged: " + str(runs / "hc_16x1216_lr1e-3" / "systems.json") +
          " costs them at peak 1979 TFLOP/s and MFU 0.50, this table at 989 TFLOP/s and MFU "
          "0.40") in section
