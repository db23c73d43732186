"""The report reads the suite it was swept from (--config): progress, 'not started' cells and
the run folders the suite no longer lists, on a hand-written half-finished sweep (no training)."""

import json
import os
import shutil
import subprocess
import textwrap

import pytest

from depthbench_jax.report import __main__ as report_main
from depthbench_jax.sweep import format_lr
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# 3 designs x 2 shapes x 2 LRs = 12 planned runs.
HALF_SUITE = textwrap.dedent("""
    from configs import smoke
    NAME = "half"
    get_config = smoke.get_config
    def sweep():
      return [dict(arch=arch, shape=shape, lr=lr) for arch in ("preln", "hc", "mhc")
              for shape in ("4x128", "8x96") for lr in (1e-3, 3e-3)]
""")


def _run_dir(root, design, L, d, lr):
  return root / f"{design}_{L}x{d}_lr{format_lr(lr)}"   # the sweep's run name


def _summary(root, design, L, d, lr, loss, status="ok"):
  workdir = _run_dir(root, design, L, d, lr)
  workdir.mkdir(parents=True)
  (workdir / "summary.json").write_text(json.dumps(dict(
      name=workdir.name, design=design, n_layers=L, d_model=d, aspect_ratio=d / L, lr=lr,
      final_val_loss=loss, status=status, params_total=1e6,
      diverged_step=50 if status == "diverged" else None)))


def _snapshot(root):
  """Every file under ``root`` but the report's own outputs, with its bytes."""
  out = {}
  for folder, _, files in os.walk(root):
    for f in files:
      path = os.path.join(folder, f)
      if f not in ("report.md", "runs.csv") and "plots" not in path:
        out[path] = open(path, "rb").read()
  return out


@pytest.fixture
def half(tmp_path):
  """Finished: preln x4 (8x96 at 3e-3 diverged), hc 4x128 at 1e-3. Started: hc 4x128 at 3e-3
  (metrics, a checkpoint). An empty folder (hc 8x96 at 1e-3) is not started, as for the sweep;
  mhc has no folder. preln 16x64 is on disk but not in the suite (edited since)."""
  config = tmp_path / "half_suite.py"
  config.write_text(HALF_SUITE)
  results = tmp_path / "results"
  _summary(results, "preln", 4, 128, 1e-3, 2.90)
  _summary(results, "preln", 4, 128, 3e-3, 2.80)
  _summary(results, "preln", 8, 96, 1e-3, 2.95)
  _summary(results, "preln", 8, 96, 3e-3, None, status="diverged")
  _summary(results, "hc", 4, 128, 1e-3, 2.85)
  live = _run_dir(results, "hc", 4, 128, 3e-3)
  (live / "checkpoints" / "40").mkdir(parents=True)
  (live / "metrics.jsonl").write_text('{"step": 45, "train/loss": 3.25}\n')
  _run_dir(results, "hc", 8, 96, 1e-3).mkdir()
  _summary(results, "preln", 16, 64, 1e-3, 2.70)
  return {"config": str(config), "results": results}


def test_the_report_counts_the_plan_and_marks_what_has_not_started(half):
  before = _snapshot(half["results"])
  assert report_main.main([str(half["results"]), "--no_plots",
                           f"--config={half['config']}"]) == 0
  text = (half["results"] / "report.md").read_text()
  # Hand counts: 12 planned; ok 3 preln + 1 hc; diverged 1; started 1; not started 6.
  assert (f"Plan ({half['config']}): **5 of 12 planned runs finished** (4 ok, 1 diverged); "
          "1 started without a summary (training, interrupted or crashed); 6 not started."
          in text)
  assert "| preln | 4 of 4 | 3 | 1 | 0 | 0 |" in text
  assert "| hc | 1 of 4 | 1 | 0 | 1 | 2 |" in text
  assert "| mhc | 0 of 4 | 0 | 0 | 0 | 4 |" in text   # listed, no run begun
  assert (f"Not in {half['config']} (on disk, still reported): preln_16x64_lr1e-3."
          in text)
  # Near the top: before the scorecard.
  assert text.index("planned runs finished") < text.index("## Val loss and depth trend")
  table = text.split("## Val loss by LR")[1]
  assert "| hc | 4x128 | 32.0 | **2.850** ‡§ | no summary yet |" in table   # started
  assert "| hc | 8x96 | 12.0 | not started | not started |" in table     # a shape none began
  assert "| mhc | 4x128 | 32.0 | not started | not started |" in table
  assert "| mhc | 8x96 | 12.0 | not started | not started |" in table
  # Off plan, still reported; 3e-3 is not planned at 16x64: blank, not 'not run'.
  assert "| preln | 16x64 | 4.0 | **2.700** ‡ |  |" in table
  assert "| preln | 8x96 | 12.0 | **2.950** † | diverged @50 |" in table
  assert "not run" not in table
  assert _snapshot(half["results"]) == before   # no run file deleted or rewritten


def _report_with_the_diverged_run_trained_under(half, **changes) -> str:
  """report.md with --config after the diverged preln 8x96 run's summary records the suite's
  config with ``changes``."""
  from configs import smoke
  workdir = _run_dir(half["results"], "preln", 8, 96, 3e-3)
  summary = json.loads((workdir / "summary.json").read_text())
  summary["config"] = dict(smoke.get_config("arch=preln,shape=8x96,lr=3e-3").to_dict(),
                           **changes)
  (workdir / "summary.json").write_text(json.dumps(summary))
  assert report_main.main([str(half["results"]), "--no_plots",
                           f"--config={half['config']}"]) == 0
  return (half["results"] / "report.md").read_text()


def test_a_run_diverged_under_other_divergence_rules_counts_as_started(half):
  """The sweep relaunches a run that diverged under other rules than the suite now sets
  (sweep.run_state); the report's plan read it as finished 'diverged', so its LR sat in the grid
  as tried while the sweep was about to train it again."""
  text = _report_with_the_diverged_run_trained_under(half, skip_nonfinite_steps=True)
  # Counted apart from the runs started without a summary (it has one).
  assert ("**4 of 12 planned runs finished** (4 ok, 0 diverged); 1 started without a summary "
          "(training, interrupted or crashed); 1 diverged under other divergence rules than "
          "the suite's now (the sweep trains them again); 6 not started.") in text
  # The rest of the report read it as finished: its LR tried (no § at that shape's best LR)
  # and the run counted diverged without a word that the sweep retrains it.
  assert "; 1 diverged (1 of them to be retrained by the sweep); " in text
  table = text.split("## Val loss by LR")[1]
  assert "| preln | 8x96 | 12.0 | **2.950** †§ | diverged @50 |" in table, table


def test_a_diverged_run_of_another_recipe_is_set_aside_not_also_retrained(half):
  """A diverged run under other divergence rules *and* another step count: the sweep refuses it
  (another recipe), it does not retrain it. The report set it aside and still counted it among
  the retrained runs: the started runs read one fewer ('-1 started' with no other started run)
  and the header promised a retrain the sweep refuses."""
  text = _report_with_the_diverged_run_trained_under(half, skip_nonfinite_steps=True, steps=40)
  # Hand counts: 4 ok, the live hc run started, the diverged one set aside, 6 not started.
  assert ("**4 of 12 planned runs finished** (4 ok, 0 diverged); 1 started without a summary "
          "(training, interrupted or crashed); 6 not started. 1 trained with another recipe "
          "than the suite's now") in text
  assert "retrain" not in text


def test_a_planned_run_of_another_recipe_is_set_aside_not_counted_finished(half):
  """A results dir whose hc 4x128 run trained 40 steps where the suite now gives 120: the report
  counted it among the suite's finished runs and compared its loss (the sweep refuses it)."""
  from configs import smoke
  workdir = _run_dir(half["results"], "hc", 4, 128, 1e-3)
  summary = json.loads((workdir / "summary.json").read_text())
  summary["config"] = dict(smoke.get_config("arch=hc,shape=4x128,lr=1e-3").to_dict(), steps=40)
  (workdir / "summary.json").write_text(json.dumps(summary))
  assert report_main.main([str(half["results"]), "--no_plots",
                           f"--config={half['config']}"]) == 0
  text = (half["results"] / "report.md").read_text()
  assert ("**4 of 12 planned runs finished** (3 ok, 1 diverged)" in text
          and "1 trained with another recipe than the suite's now" in text)
  assert "| hc | 0 of 4 | 0 | 0 | 1 | 2 | 1 |" in text
  assert "- `hc_4x128_lr1e-3`: steps=40 (reported: 120)" in text
  table = text.split("## Val loss by LR")[1].split("## Set aside")[0]
  assert "**2.850**" not in table
  # Its LR is a gap of the grid there, named (the best LR there was picked without it).
  assert "| hc | 4x128 | 32.0 | other recipe | no summary yet |" in table
  # A run's own fields are no recipe: its data read from another path (this shell lacks the
  # job's $FINEWEB_EDU_PATH) is the suite's run, counted and compared.
  summary["config"] = dict(smoke.get_config("arch=hc,shape=4x128,lr=1e-3").to_dict(),
                           data=dict(smoke.get_config().data.to_dict(), path="/shared/data"))
  (workdir / "summary.json").write_text(json.dumps(summary))
  assert report_main.main([str(half["results"]), "--no_plots",
                           f"--config={half['config']}"]) == 0
  text = (half["results"] / "report.md").read_text()
  assert "**5 of 12 planned runs finished**" in text and "## Set aside" not in text


def test_off_plan_runs_and_runs_without_a_summary_of_another_recipe_are_set_aside(half):
  """Only planned folders were checked against the suite: a copy of a 40-step hc run under
  another name was reported as the suite's hc result, and a 40-step run stopped midway at an
  LR the suite does not plan made a pending column of the suite's grid."""
  from configs import smoke
  copy = half["results"] / "hc_copy"
  copy.mkdir()
  (copy / "summary.json").write_text(json.dumps(dict(
      name="hc_4x128_lr1e-3", design="hc", n_layers=4, d_model=128, aspect_ratio=32.0, lr=1e-3,
      final_val_loss=2.5, status="ok", params_total=1e6,
      config=dict(smoke.get_config("arch=hc,shape=4x128,lr=1e-3").to_dict(), steps=40))))
  stopped = _run_dir(half["results"], "preln", 4, 128, 1e-2)
  (stopped / "checkpoints" / "20").mkdir(parents=True)
  (stopped / "config.json").write_text(json.dumps(
      dict(smoke.get_config("arch=preln,shape=4x128,lr=1e-2").to_dict(), steps=40)))
  assert report_main.main([str(half["results"]), "--no_plots",
                           f"--config={half['config']}"]) == 0
  text = (half["results"] / "report.md").read_text()
  aside = text.split("## Set aside")[1].split("##")[0]
  assert "- `hc_copy`: steps=40 (reported: 120)" in aside
  assert "- `preln_4x128_lr1e-2`: steps=40 (reported: 120)" in aside
  # Named as off plan with the run that is reported, not as 'still reported' too.
  assert (f"Not in {half['config']} (on disk, still reported): preln_16x64_lr1e-3. Not in "
          f"{half['config']}, and of another recipe than it gives them (set aside below): "
          f"hc_copy, preln_4x128_lr1e-2." in text)
  assert "2.500" not in text.split("## Set aside")[0]
  assert "lr 1e-2" not in text   # no column for the stopped run's LR


def test_a_report_whose_every_run_is_set_aside_draws_no_empty_table_or_plot(tmp_path):
  """Every finished run of another recipe (two 40-step smoke runs under the 120-step suite):
  report.md had a trend heading over no table, an LR table of no column, and embedded
  loss_vs_aspect_all.png, an empty axes."""
  from configs import smoke
  config = tmp_path / "half_suite.py"
  config.write_text(HALF_SUITE)
  results = tmp_path / "results"
  for design in ("preln", "hc"):
    workdir = _run_dir(results, design, 4, 128, 1e-3)
    workdir.mkdir(parents=True)
    (workdir / "summary.json").write_text(json.dumps(dict(
        name=workdir.name, design=design, n_layers=4, d_model=128, aspect_ratio=32.0, lr=1e-3,
        final_val_loss=2.5, status="ok", params_total=1e6,
        config=dict(smoke.get_config(f"arch={design},shape=4x128,lr=1e-3").to_dict(),
                    steps=40))))
  assert report_main.main([str(results), f"--config={config}"]) == 0
  text = (results / "report.md").read_text()
  assert "## Set aside: 2 runs of another recipe" in text
  assert "No finished run of this recipe to compare." in text
  for heading in ("## Val loss and depth trend", "## Val loss by LR", "## Loss vs aspect ratio"):
    assert heading not in text
  assert not (results / "plots").exists()


def test_a_suite_that_plans_none_of_the_folders_runs_is_named_in_a_warning(half, tmp_path,
                                                                          capsys):
  """Another suite's --config (suite_400m over a smoke folder) replaced report.md with its plan,
  every run off plan, and no word that the suite was not the one swept into the folder. Seven
  run folders: six summaries and the started hc run (the empty folder is no run)."""
  other = tmp_path / "other_suite.py"
  other.write_text(HALF_SUITE.replace('("preln", "hc", "mhc")', '("moda",)'))
  capsys.readouterr()
  assert report_main.main([str(half["results"]), "--no_plots", f"--config={other}"]) == 0
  err = capsys.readouterr().err.splitlines()
  assert err == [f"warning: --config={other} plans none of the 7 run folders in "
                 f"{half['results']} (it plans e.g. moda_4x128_lr1e-3): is it the suite swept "
                 f"into them?"], err
  assert report_main.main([str(half["results"]), "--no_plots",
                           f"--config={half['config']}"]) == 0
  assert "warning" not in capsys.readouterr().err
  other.write_text(HALF_SUITE.replace('("preln", "hc", "mhc")', '()'))   # a sweep() of nothing
  assert report_main.main([str(half["results"]), "--no_plots", f"--config={other}"]) == 0
  assert "(it plans no run): is it the suite swept into them?" in capsys.readouterr().err


def test_with_config_a_variant_is_set_aside_in_a_planned_folder_and_reported_off_plan(half):
  """README's one-run example with ``--config.model.residual.n_streams=2``: off plan, a variant
  of the suite's recipe, reported as its own row (``hc(n_streams=2)``), and set aside only for
  a recipe field (``steps=40``; the plan once looked its label up as a design, found none, and
  the 40-step run read 'still reported'). In a planned HC folder it is no run of the suite's
  (it counted as the suite's finished HC run, which the sweep refuses). An mHC run on the
  Pallas Sinkhorn is neither."""
  from configs import smoke
  from depthbench_jax import sweep
  variant = half["results"] / "hc_ns2"
  variant.mkdir()
  config = smoke.get_config("arch=hc,shape=4x128,lr=1e-3").to_dict()
  config["model"]["residual"]["n_streams"] = 2
  summary = dict(name="hc_ns2", design="hc", n_layers=4, d_model=128, aspect_ratio=32.0,
                 lr=1e-3, final_val_loss=2.5, status="ok", params_total=1e6, config=config)
  report = lambda: (report_main.main([str(half["results"]), "--no_plots",
                                      f"--config={half['config']}"]),
                    (half["results"] / "report.md").read_text())[1]
  (variant / "summary.json").write_text(json.dumps(summary))
  text = report()
  assert "## Set aside" not in text and "| hc(n_streams=2) | 4x128 | 32.0 | **2.500** ‡" in text
  (variant / "summary.json").write_text(json.dumps(dict(summary, config=dict(config, steps=40))))
  text = report()
  assert "- `hc_ns2`: steps=40 (reported: 120)" in text.split("## Set aside")[1]
  assert ("and of another recipe than it gives them (set aside below): hc_ns2." in text
          and "still reported): preln_16x64_lr1e-3." in text)
  shutil.rmtree(variant)
  workdir = _run_dir(half["results"], "hc", 4, 128, 1e-3)
  planned = json.loads((workdir / "summary.json").read_text())
  (workdir / "summary.json").write_text(json.dumps(dict(planned, config=config)))
  text = report()
  assert "1 trained with another recipe than the suite's now" in text
  assert ("- `hc_4x128_lr1e-3`: model.residual.n_streams=2 (reported: 4)"
          in text.split("## Set aside")[1])
  (workdir / "summary.json").write_text(json.dumps(planned))
  pallas = smoke.get_config("arch=mhc,shape=4x128,lr=1e-3").to_dict()
  pallas["model"]["residual"]["sinkhorn_kernel"] = "pallas"
  _summary(half["results"], "mhc", 4, 128, 1e-3, 2.6)
  mhc_run = _run_dir(half["results"], "mhc", 4, 128, 1e-3)
  (mhc_run / "summary.json").write_text(json.dumps(dict(
      json.loads((mhc_run / "summary.json").read_text()), config=pallas)))
  text = report()
  assert "## Set aside" not in text and "| mhc | 1 of 4 | 1 |" in text
  mhc = {"config": {"model": {"residual": {"name": "mhc", "sinkhorn_kernel": "pallas"}}}}
  assert sweep.design_label(mhc) == "mhc"


NS2_SUITE = textwrap.dedent("""
    from configs import smoke
    NAME = "ns2"
    def get_config(arg=None):
      c = smoke.get_config(arg)
      c.model.residual.n_streams = 2   # after apply_run, as README says a design option goes
      return c
    def sweep():
      return [dict(arch="hc", shape="4x128", lr=lr) for lr in (1e-3, 3e-3)]
""")


def test_a_suites_own_design_option_keys_its_planned_cells_as_its_records(tmp_path):
  """A suite that sets HC's n_streams=2 planned its cells under 'hc' while its runs report as
  ``hc(n_streams=2)``: a phantom 'hc' row held the not-started LR, and the finished cell lost
  its § (an LR of its grid not started)."""
  from configs import smoke
  config_path = tmp_path / "ns2_suite.py"
  config_path.write_text(NS2_SUITE)
  results = tmp_path / "results"
  config = smoke.get_config("arch=hc,shape=4x128,lr=1e-3").to_dict()
  config["model"]["residual"]["n_streams"] = 2
  _summary(results, "hc", 4, 128, 1e-3, 2.5)
  workdir = _run_dir(results, "hc", 4, 128, 1e-3)
  summary = json.loads((workdir / "summary.json").read_text())
  (workdir / "summary.json").write_text(json.dumps(dict(summary, config=config)))
  assert report_main.main([str(results), "--no_plots", f"--config={config_path}"]) == 0
  text = (results / "report.md").read_text()
  assert "| hc(n_streams=2) | 4x128 | 32.0 | **2.500** ‡§ | not started |" in text, text
  assert "| hc | 4x128 |" not in text


def test_without_config_the_report_infers_gaps_from_disk_as_before(half):
  assert report_main.main([str(half["results"]), "--no_plots"]) == 0
  text = (half["results"] / "report.md").read_text()
  assert "planned runs" not in text and "| not started" not in text and "mhc" not in text
  assert "| preln | 16x64 | 4.0 | **2.700** ‡§ | not run |" in text


@pytest.mark.parametrize("bad", ["missing.py", "base", "syntax", "readme"])
def test_a_bad_config_is_one_error_line_naming_the_flag_and_nothing_is_written(half, tmp_path,
                                                                               capsys, bad):
  path = {"missing.py": str(tmp_path / "missing.py"),
          "base": os.path.join(REPO, "configs", "base.py"),   # a config, but no suite
          "syntax": str(tmp_path / "broken.py"),
          "readme": os.path.join(REPO, "README.md")}[bad]
  (tmp_path / "broken.py").write_text("def sweep(:\n")
  before = sorted(os.listdir(half["results"]))
  with pytest.raises(SystemExit) as exit_info:
    report_main.main([str(half["results"]), "--no_plots", f"--config={path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: --config={path}: "), err
  assert "allowed:" in err[0]
  assert sorted(os.listdir(half["results"])) == before   # no report.md, runs.csv or plots


def test_an_empty_results_dir_with_a_plan_reports_nothing_started(half, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  assert report_main.main([str(empty), "--no_plots", f"--config={half['config']}"]) == 0
  text = (empty / "report.md").read_text()
  assert "**0 of 12 planned runs finished** (0 ok, 0 diverged); 0 started" in text
  assert "12 not started." in text and "no run has finished yet" in text


# Stands in for .venv/bin/python under a copy of launch/: logs each call, answers the two
# calls whose output run_sweep.sh reads (hostmem's tunables, the sweep's results dir).
FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/sh
    echo "$*" >> "$FAKE_LOG"
    case "$*" in
      *depthbench_jax.hostmem*) echo "glibc.malloc.arena_max=1" ;;
      *--print_results_dir*) echo "$FAKE_RESULTS" ;;
      *depthbench_jax.sweep*) exit "${FAKE_SWEEP_RC:-0}" ;;
      *depthbench_jax.report*) exit "${FAKE_REPORT_RC:-0}" ;;
    esac
""")


def _fake_repo(tmp_path):
  """A copy of launch/run_sweep.sh whose bootstrap and interpreter are fakes (FAKE_PYTHON)."""
  return helpers.fake_launch_repo(tmp_path, "run_sweep.sh", FAKE_PYTHON)


def _calls_of(script, args, tmp_path):
  """Runs the faked script from ``tmp_path``; returns the interpreter calls it made."""
  results, log = tmp_path / "results", tmp_path / "log"
  results.mkdir(exist_ok=True)
  out = subprocess.run([str(script)] + args, cwd=tmp_path, capture_output=True, text=True,
                       timeout=60,
                       env=dict(os.environ, FAKE_LOG=str(log), FAKE_RESULTS=str(results)))
  assert out.returncode == 0, out.stderr[-2000:]
  return log.read_text().splitlines()


def test_run_sweep_sh_passes_the_suite_to_the_report(tmp_path):
  # The script itself, with the interpreter it calls faked: the report must get the suite the
  # sweep was given (jax-free, so this takes milliseconds, not a real sweep's seconds).
  script = _fake_repo(tmp_path)
  config, results = tmp_path / "half_suite.py", tmp_path / "results"
  config.write_text(HALF_SUITE)
  calls = _calls_of(script, [str(config), "--results_dir", str(results)], tmp_path)
  assert f"-m depthbench_jax.sweep {config} --results_dir {results}" in calls, calls
  assert calls[-1] == f"-m depthbench_jax.report {results} --config={config}", calls


def test_run_sweep_sh_without_arguments_sweeps_and_reports_the_smoke_suite(tmp_path):
  """README's first command: no argument at all. Its default suite was never checked (every
  call named a suite), so another CONFIG= in the script passed."""
  script = _fake_repo(tmp_path)
  calls = _calls_of(script, [], tmp_path)
  results = tmp_path / "results"
  assert "-m depthbench_jax.sweep configs/smoke.py --print_results_dir" in calls, calls
  assert calls[-1] == f"-m depthbench_jax.report {results} --config=configs/smoke.py", calls


def test_the_smoke_suite_plans_every_design_at_its_two_shapes(tmp_path, capsys):
  """What run_sweep.sh runs by default, checked as the sweep checks it (every run's config, the
  shape sets, the LR tables): the tests swept copies with shapes of their own, so a width in
  configs/smoke.py the heads do not divide passed them and stopped README's first command."""
  from depthbench_jax import sweep
  from depthbench_jax.residual import registry
  smoke = os.path.join(helpers.ROOT, "configs", "smoke.py")
  assert sweep.main([smoke, "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 0
  out = capsys.readouterr().out
  assert f"{2 * len(registry.names())} runs (0 done, {2 * len(registry.names())} to run)" in out
  assert "warning" not in out


@pytest.mark.parametrize("spelling", [["--config=half_suite.py"], ["--config", "half_suite.py"]])
def test_run_sweep_sh_takes_the_suite_as_config_flag(tmp_path, spelling):
  # `--config=FILE`, as the sweep, systems and report spell it: that suite is swept and
  # reported, read from the caller's directory (it once swept configs/smoke.py beside it,
  # which the sweep refused as two suite files).
  script = _fake_repo(tmp_path)
  config, results = tmp_path / "half_suite.py", tmp_path / "results"
  config.write_text(HALF_SUITE)
  calls = _calls_of(script, spelling + ["--results_dir", str(results)], tmp_path)
  assert f"-m depthbench_jax.sweep {config} --results_dir {results}" in calls, calls
  assert calls[-1] == f"-m depthbench_jax.report {results} --config={config}", calls


def test_run_sweep_sh_takes_the_same_suite_given_both_ways(tmp_path):
  """`half_suite.py --config=half_suite.py` named one file twice, yet the script made only the
  positional absolute and the sweep refused the pair as two suites."""
  script = _fake_repo(tmp_path)
  config, results = tmp_path / "half_suite.py", tmp_path / "results"
  config.write_text(HALF_SUITE)
  calls = _calls_of(script, ["half_suite.py", "--config=half_suite.py", "--results_dir",
                             str(results)], tmp_path)
  assert f"-m depthbench_jax.sweep {config} --results_dir {results} --config={config}" in calls
  from depthbench_jax import sweep
  assert sweep.main([str(config), f"--config={os.path.relpath(config)}", "--results_dir",
                     str(results), "--dry_run"]) == 0


@pytest.mark.parametrize("cwd, given, passed", [
    ("repo", "results/try2", "results/try2"), ("repo/results", "try2", "results/try2"),
    (".", "out", "{tmp}/out")])
def test_run_sweep_sh_keeps_a_results_dir_inside_the_checkout_relative_to_it(tmp_path, cwd,
                                                                              given, passed):
  """It made every --results_dir absolute: hosts mounting one shared checkout at other paths
  then gave one run two workdirs, and main.check_same_run (which compares the workdir as
  written, for that case) stopped the sweep at its first run. One outside stays absolute."""
  script = _fake_repo(tmp_path)
  (tmp_path / "repo" / "results").mkdir()
  log = tmp_path / "log"
  out = subprocess.run([str(script), "--results_dir", given], cwd=tmp_path / cwd,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, FAKE_LOG=str(log), FAKE_RESULTS=str(tmp_path)))
  assert out.returncode == 0, out.stderr[-2000:]
  passed = passed.format(tmp=tmp_path)
  assert any(c.endswith(f" --results_dir {passed} --print_results_dir")
             for c in log.read_text().splitlines()), log.read_text()


@pytest.mark.parametrize("sweep_rc, report_rc, want", [(0, 1, 1), (1, 0, 1), (1, 3, 1), (0, 0, 0)])
def test_run_sweep_sh_exits_with_the_sweeps_status_else_the_reports(tmp_path, sweep_rc,
                                                                   report_rc, want):
  """A failed report exited 0 and left the previous sweep's report.md reading as this one's; a
  failed run (the sweep's 1) still gets the report, and the script exits 1."""
  script = _fake_repo(tmp_path)
  (tmp_path / "results").mkdir()
  out = subprocess.run([str(script), "configs/smoke.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60,
                       env=dict(os.environ, FAKE_LOG=str(tmp_path / "log"),
                                FAKE_RESULTS=str(tmp_path / "results"),
                                FAKE_SWEEP_RC=str(sweep_rc), FAKE_REPORT_RC=str(report_rc)))
  assert out.returncode == want, out.stderr
  assert (tmp_path / "log").read_text().splitlines()[-1].startswith("-m depthbench_jax.report")
  assert ("[run_sweep] report failed" in out.stderr) == bool(report_rc)


@pytest.mark.parametrize("args, flag", [
    (["--config"], "--config"), (["--results_dir"], "--results_dir"),
    # Empty (an unset variable): the caller's own directory here, results/<suite> to the sweep.
    (["--results_dir="], "--results_dir"), (["--results_dir", ""], "--results_dir"),
    # The next flag as the value: from outside the checkout it trained into ./--dry_run.
    (["--results_dir", "--dry_run"], "--results_dir"), (["--config="], "--config")])
def test_run_sweep_sh_flag_without_a_value_is_one_error(tmp_path, args, flag):
  """From outside the checkout, as README allows."""
  script = _fake_repo(tmp_path)
  out = subprocess.run([str(script), "configs/smoke.py", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, FAKE_LOG=str(tmp_path / "log")))
  assert out.returncode == 2 and out.stderr.splitlines() == [
      f"error: {flag} has no value; allowed: {flag} PATH or {flag}=PATH"], out.stderr
  assert not (tmp_path / "log").exists()   # nothing ran
