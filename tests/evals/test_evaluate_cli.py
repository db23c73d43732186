"""``python -m depthbench_jax.evaluate --workdir`` on a saved run dir, with the HF export."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from evals_helpers import FIXTURES
from tests import helpers


@pytest.mark.slow
def test_cli_writes_evals_json_and_a_loadable_hf_export(tmp_path):
  torch = helpers.required("torch")
  transformers = helpers.required("transformers")
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.model.transformer import Transformer

  workdir = str(tmp_path / "run")
  config, params = helpers.saved_run(workdir, tensorboard=True)
  cfg = model_config_from(config.model)

  proc = subprocess.run(
      [sys.executable, "-m", "depthbench_jax.evaluate", f"--workdir={workdir}",
       f"--eval_data_dir={FIXTURES}", "--sets=gsm8k,humaneval,sciq", "--max_examples=1",
       "--max_new_tokens=4", "--export_hf"],
      cwd=helpers.ROOT, env=helpers.subprocess_env(), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  evals = json.load(open(os.path.join(workdir, "evals.json")))
  assert evals["step"] == 5 and evals["design"] == "preln" and evals["tokenizer"] == "byte"
  # Beside the JSON line, one line says where it went and over how many examples (--max_examples).
  assert (f"evals at step 5 -> {os.path.join(workdir, 'evals.json')}: NLL per token by domain"
          in proc.stderr and "gsm8k 1 examples" in proc.stderr)
  assert set(json.loads(proc.stdout.strip().splitlines()[-1])) == set(evals["domains"])
  assert evals["options"]["score_len"] == config.data.seq_len   # scored within the trained context
  # ... and so scored, not only recorded: gsm8k's first example, 124 tokens with its <eos>,
  # loses its first ones to the 33-token window (scored at max_seq_len it was whole).
  gsm8k = evals["sets"]["gsm8k"]
  assert gsm8k["context_cut"] == 1 and gsm8k["tokens"] <= config.data.seq_len
  assert set(evals["domains"]) == {"coding", "stem", "math"}
  assert os.listdir(os.path.join(workdir, "tensorboard"))

  assert os.path.exists(os.path.join(workdir, "hf", "generation_config.json"))
  with open(os.path.join(workdir, "hf", "depthbench_export.json")) as f:
    assert json.load(f)["step"] == 5   # which checkpoint the export holds
  model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(workdir, "hf")).eval()
  tokens = np.arange(1, 17, dtype=np.int32)[None] * 7 % 257
  with torch.no_grad():
    theirs = model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
  ours = np.asarray(Transformer(cfg).apply({"params": params}, tokens))
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_cli_unknown_set_is_one_error_before_the_checkpoint_loads(tmp_path):
  """--sets=nope (once a traceback after the checkpoint and tokenizer loaded): one error line
  naming the allowed sets, exit 2, the run dir untouched."""
  from depthbench_jax.evals import datasets
  (tmp_path / "summary.json").write_text('{"status": "ok"}')
  proc = subprocess.run([sys.executable, "-m", "depthbench_jax.evaluate",
                         f"--workdir={tmp_path}", "--sets=gsm8k,nope"], cwd=helpers.ROOT,
                        env=helpers.subprocess_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      "error: --sets: unknown ['nope']; allowed: " + ", ".join(datasets.SETS)]
  assert os.listdir(tmp_path) == ["summary.json"]


@pytest.mark.parametrize("flag, named", [
    ("--batch_size=0", "--batch_size=0"),           # once a range() traceback after the restore
    ("--max_examples=0", "--max_examples=0"),       # once silently one example
    ("--max_examples=-1", "--max_examples=-1"),     # once silently one example
    ("--max_new_tokens=0", "--max_new_tokens=0"),
    ("--timeout_s=0", "--timeout_s=0"),             # once every program a timeout: pass@1 = 0
    ("--generate=maybe", "--generate=maybe"),       # absl: a FATAL line and exit 1
    ("--nope=1", "nope"),
    ("run_b", "unexpected argument 'run_b': not a flag"),   # once dropped without a word
])
def test_cli_bad_flag_is_one_error_line_before_the_checkpoint_loads(tmp_path, flag, named):
  helpers.assert_cli_refuses_before_loading("depthbench_jax.evaluate", tmp_path, [flag], named)


@pytest.mark.parametrize("flags, named", [
    # Once a ConfigError traceback, exit 1.
    (["--export_hf", "--sets=humaneval"], "--export_hf: the run's config.model.residual.name="
     "'hc' has no Hugging Face LLaMA/Qwen3 equivalent; allowed: preln, or no --export_hf"),
    # Once a MissingEvalSet traceback, exit 1, after the sets before it were scored.
    (["--strict", "--sets=humaneval,gsm8k"], "--strict"),
    # Once a FileNotFoundError traceback, exit 1.
    (["--sets=gsm8k"], "--sets=gsm8k"),
    # A set given twice passed the 'none found' check (1 missing of 2): the same traceback.
    (["--sets=gsm8k,gsm8k"], "--sets=gsm8k: gsm8k not found"),
    (["--sets="], "--sets"),
    # A typo once read the sets from their default places (humaneval from its wheel) unsaid.
    (["--eval_data_dir=/nonexistent/evals", "--sets=humaneval"],
     "--eval_data_dir=/nonexistent/evals: no such directory"),
    # '~' is the home dir (as in config.data.path), not a folder named '~' in the cwd.
    (["--eval_data_dir=~/nonexistent_evals", "--sets=humaneval"],
     f"--eval_data_dir={os.path.expanduser('~')}/nonexistent_evals: no such directory"),
    # A header-only file: a ValueError traceback after the sets before it were scored.
    (["--sets=humaneval,gpqa"], "gpqa_diamond.csv: no 'gpqa' examples in it"),
])
def test_cli_refusal_after_the_config_is_read_is_one_error_line_and_writes_nothing(
    tmp_path, flags, named):
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir, **{"model.residual.name": "hc"})
  (tmp_path / "no_sets" / "gpqa").mkdir(parents=True)
  (tmp_path / "no_sets" / "gpqa" / "gpqa_diamond.csv").write_text("Question,Correct Answer\n")
  before = sorted(os.listdir(workdir))
  proc = subprocess.run(
      [sys.executable, "-m", "depthbench_jax.evaluate", f"--workdir={workdir}",
       f"--eval_data_dir={tmp_path / 'no_sets'}", "--max_examples=1", "--generate=false", *flags],
      cwd=helpers.ROOT, env=helpers.subprocess_env(), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("error: ")]
  assert len(lines) == 1 and named in lines[0] and "allowed" in lines[0], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert sorted(os.listdir(workdir)) == before


def test_cli_on_a_host_without_the_runs_tokenizer_is_one_error_line(tmp_path):
  """A gpt2-tokenized run evaluated where openai-whisper has no BPE file (a device image): a
  traceback after the restore; now one error line naming the tokenizer, nothing written."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir)
  saved = json.loads(open(os.path.join(workdir, "config.json")).read())
  saved["data"]["tokenizer"] = "gpt2"
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(saved, f)
  (tmp_path / "shadow" / "whisper").mkdir(parents=True)   # installed, but without its assets
  (tmp_path / "shadow" / "whisper" / "__init__.py").write_text("")
  before = sorted(os.listdir(workdir))
  env = helpers.subprocess_env()
  env["PYTHONPATH"] = f"{tmp_path / 'shadow'}{os.pathsep}{env['PYTHONPATH']}"
  proc = subprocess.run([sys.executable, "-m", "depthbench_jax.evaluate", f"--workdir={workdir}",
                         f"--eval_data_dir={FIXTURES}", "--sets=sciq", "--max_examples=1"],
                        cwd=helpers.ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  (line,) = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
  assert line.startswith("error: config.data.tokenizer='gpt2': openai-whisper is installed "
                         "but has no assets/gpt2.tiktoken"), line
  assert sorted(os.listdir(workdir)) == before


def test_cli_a_later_record_lacking_its_fields_is_one_error_line_before_any_set_is_scored(
    tmp_path):
  """Only each file's first record was checked before scoring: a second gsm8k record without
  its answer was a ValueError traceback after sciq had been scored, and no evals.json."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir)
  data = tmp_path / "evals"
  (data / "gsm8k").mkdir(parents=True)
  (data / "gsm8k" / "test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n'
                                             '{"question": "2+2?"}\n')
  before = sorted(os.listdir(workdir))
  proc = _evaluate(workdir, f"--eval_data_dir={data}", "--sets=gsm8k", "--generate=false")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  (line,) = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
  assert "test.jsonl: record 1 lacks the published field(s) ['answer']" in line, line
  assert sorted(os.listdir(workdir)) == before


# A finished evaluation as the CLI records it (tiny run: score_len = config.data.seq_len = 32).
FULL = {"sets": ["gsm8k", "sciq"], "eval_data_dir": FIXTURES, "max_examples": None,
        "generate": True, "max_new_tokens": 4, "timeout_s": 10.0, "score_len": 32,
        "batch_size": 8}
FULL_FLAGS = [f"--eval_data_dir={FIXTURES}", "--sets=gsm8k,sciq", "--max_new_tokens=4"]
# A cheap debug rerun and what it records.
DEBUG = dict(FULL, sets=["sciq"], max_examples=1, generate=False)
DEBUG_FLAGS = [*FULL_FLAGS, "--sets=sciq", "--max_examples=1", "--generate=false"]


def _run_with_evals(tmp_path, options, **overrides):
  """A saved run (``tiny_config(**overrides)``) whose evals.json was made with ``options``;
  returns (workdir, its bytes)."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir, **overrides)
  path = os.path.join(workdir, "evals.json")
  with open(path, "w") as f:
    json.dump({"step": 1, "options": options, "sets": {}, "domains": {}, "missing": {}}, f)
  return workdir, open(path, "rb").read()


def _evaluate(workdir, *flags):
  return subprocess.run([sys.executable, "-m", "depthbench_jax.evaluate", f"--workdir={workdir}",
                         *flags], cwd=helpers.ROOT, env=helpers.subprocess_env(),
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flag, named", [
    ("--max_examples=1", "--max_examples=1"),
    ("--sets=humaneval", '--sets=["humaneval"]'),
    ("--generate=false", "--generate=false"),
])
def test_cli_lesser_rerun_is_refused_and_leaves_the_finished_evals(tmp_path, flag, named):
  """A debug rerun (fewer examples, one set, no generation) once silently replaced a full
  evals.json: now one error line naming the flag, the file and its value, and the way out."""
  workdir, before = _run_with_evals(tmp_path, FULL)
  files = sorted(os.listdir(workdir))
  proc = _evaluate(workdir, *FULL_FLAGS, flag)
  helpers.assert_refused_untouched(proc, named, os.path.join(workdir, "evals.json"), before,
                                   files)  # No tensorboard/ either.


def test_cli_rerun_with_the_same_settings_replaces_evals_and_records_them(tmp_path):
  """A later checkpoint (step 5 over step 1) under the same settings replaces the file; the
  eval data dir named relative to the working directory is the same setting. The console
  carries no INFO lines (orbax's restore once printed ~30)."""
  workdir, _ = _run_with_evals(tmp_path, DEBUG)
  relative = f"--eval_data_dir={os.path.relpath(FIXTURES, helpers.ROOT)}"
  proc = _evaluate(workdir, *DEBUG_FLAGS, relative)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not re.search(r"^I\d{4} ", proc.stderr, re.M), proc.stderr[-2000:]
  evals = json.load(open(os.path.join(workdir, "evals.json")))
  assert evals["step"] == 5 and evals["options"] == DEBUG and set(evals["sets"]) == {"sciq"}
  assert not os.path.exists(os.path.join(workdir, "tensorboard"))  # the run's tensorboard=False


def test_cli_out_holding_another_runs_result_is_refused(tmp_path):
  """A debug --out reused for a second run replaced the first run's result unsaid (evals.json
  recorded no workdir, and both runs had one name). It records its run now, and another run's
  result there is refused; one recording none (older files) is not."""
  workdir, _ = _run_with_evals(tmp_path, FULL)
  side = tmp_path / "debug" / "evals.json"
  assert _evaluate(workdir, *DEBUG_FLAGS, f"--out={side}").returncode == 0
  assert json.load(open(side))["workdir"] == os.path.abspath(workdir)
  other = str(tmp_path / "other")
  helpers.saved_run(other)
  proc = _evaluate(other, *DEBUG_FLAGS, f"--out={side}")
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert lines == [f"error: --workdir={other}: {side} holds the result of another run "
                   f"({os.path.abspath(workdir)}), which this run would replace; allowed: "
                   "another --out, or --overwrite"], proc.stderr[-2000:]
  assert json.load(open(side))["workdir"] == os.path.abspath(workdir)


def test_cli_rerun_with_another_sandbox_timeout_is_refused_where_code_runs(tmp_path):
  """The timeout decides pass@1 (a 3 s program passes at 10 s, fails at 1 s), yet a rerun at
  --timeout_s=1 replaced the result silently, and evals.json never said which it was."""
  code = dict(FULL, sets=["humaneval"])
  workdir, before = _run_with_evals(tmp_path, code)
  proc = _evaluate(workdir, f"--eval_data_dir={FIXTURES}", "--sets=humaneval",
                   "--max_new_tokens=4", "--timeout_s=1")
  assert proc.returncode == 2
  assert "error: --timeout_s=1.0: " in proc.stderr and "timeout_s=10.0" in proc.stderr
  assert open(os.path.join(workdir, "evals.json"), "rb").read() == before


def test_cli_without_generation_max_new_tokens_decides_nothing(tmp_path):
  """A --generate=false rerun was refused for the max_new_tokens an earlier one recorded,
  though without generation it decides nothing. On gsm8k, a set that could generate (sciq
  alone never does, so the rerun passed even with the bug back)."""
  workdir, _ = _run_with_evals(tmp_path, dict(DEBUG, sets=["gsm8k"]))
  proc = _evaluate(workdir, *FULL_FLAGS, "--sets=gsm8k", "--max_examples=1",
                   "--generate=false", "--max_new_tokens=8")
  assert proc.returncode == 0, proc.stderr[-2000:]


def test_cli_overwrite_replaces_evals_made_with_other_settings(tmp_path):
  workdir, _ = _run_with_evals(tmp_path, FULL)
  proc = _evaluate(workdir, *DEBUG_FLAGS, "--overwrite")
  assert proc.returncode == 0, proc.stderr[-2000:]
  evals = json.load(open(os.path.join(workdir, "evals.json")))
  assert evals["step"] == 5 and evals["options"] == DEBUG


def test_cli_out_writes_elsewhere_and_leaves_the_finished_evals(tmp_path):
  """--out: the result and its scalars go beside PATH; the run's evals.json and tensorboard/
  stay as they were."""
  workdir, before = _run_with_evals(tmp_path, FULL, tensorboard=True)
  side = tmp_path / "debug" / "evals.json"
  proc = _evaluate(workdir, *DEBUG_FLAGS, f"--out={side}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.load(open(side))["options"] == DEBUG
  assert os.listdir(tmp_path / "debug" / "tensorboard")
  assert open(os.path.join(workdir, "evals.json"), "rb").read() == before
  assert not os.path.exists(os.path.join(workdir, "tensorboard"))


def test_cli_out_under_a_file_is_one_error_line_before_any_compute(tmp_path):
  """--out=AFILE/evals.json ran every set, then raised FileExistsError at the write."""
  workdir, before = _run_with_evals(tmp_path, FULL)
  (tmp_path / "afile").write_text("x")
  proc = _evaluate(workdir, *DEBUG_FLAGS, f"--out={tmp_path}/afile/evals.json")
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert lines == [f"error: --out={tmp_path}/afile/evals.json: {tmp_path}/afile is a file; "
                   "allowed: a folder there (made if missing)"], proc.stderr[-2000:]
  assert open(os.path.join(workdir, "evals.json"), "rb").read() == before


def test_cli_out_inside_the_run_keeps_its_scalars_and_export_out_of_the_runs_own(tmp_path):
  """A debug --out=RUN/evals_debug.json wrote its scalars into the run's tensorboard/ at the
  run's step (TensorBoard then showed the debug value for the run), and --export_hf replaced
  the run's hf/ wherever --out pointed. They now go to tensorboard/evals_debug and
  evals_debug_hf/."""
  workdir, before = _run_with_evals(tmp_path, FULL, tensorboard=True)
  proc = _evaluate(workdir, *DEBUG_FLAGS, f"--out={workdir}/evals_debug.json", "--export_hf")
  assert proc.returncode == 0, proc.stderr[-2000:]
  board = os.path.join(workdir, "tensorboard")
  assert os.listdir(board) == ["evals_debug"] and os.listdir(os.path.join(board, "evals_debug"))
  assert os.path.exists(os.path.join(workdir, "evals_debug_hf", "depthbench_export.json"))
  assert not os.path.exists(os.path.join(workdir, "hf"))
  assert open(os.path.join(workdir, "evals.json"), "rb").read() == before


def test_cli_generation_budget_over_the_models_context_is_one_error_before_scoring(tmp_path):
  """--max_new_tokens >= max_seq_len was a ValueError traceback after the sets before the first
  generating one were scored, and no evals.json."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir, **{"model.max_seq_len": 64})
  proc = _evaluate(workdir, f"--eval_data_dir={FIXTURES}", "--sets=sciq,gsm8k",
                   "--max_new_tokens=64")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert ("error: --max_new_tokens=64 leaves no room for a prompt in the model's "
          "config.model.max_seq_len=64") in proc.stderr
  assert not os.path.exists(os.path.join(workdir, "evals.json"))


def test_cli_a_run_whose_config_names_a_missing_eval_dir_is_refused(tmp_path):
  """A run trained elsewhere (config.evals.data_dir not on this host) read HumanEval from its
  wheel and finished with coding only; a mistyped --eval_data_dir was already refused."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir, **{"evals.data_dir": "/nonexistent/evals"})
  proc = _evaluate(workdir, "--generate=false", "--max_examples=1")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert ("error: config.evals.data_dir (the run's)=/nonexistent/evals: no such directory"
          in proc.stderr)


def test_cli_a_rerun_that_finds_fewer_sets_is_refused(tmp_path):
  """The guard compared the sets asked for: with gsm8k's file gone from the same folder a rerun
  of the same flags replaced a two-set result with a one-set one."""
  import shutil
  evals_dir = str(tmp_path / "evals")
  shutil.copytree(FIXTURES, evals_dir)
  workdir, before = _run_with_evals(tmp_path, dict(FULL, eval_data_dir=evals_dir))
  files = sorted(os.listdir(workdir))
  shutil.rmtree(os.path.join(evals_dir, "gsm8k"))
  proc = _evaluate(workdir, *FULL_FLAGS, f"--eval_data_dir={evals_dir}")
  helpers.assert_refused_untouched(proc, '--sets=["sciq"]', os.path.join(workdir, "evals.json"),
                                   before, files)
  # The other way, the file put back after a run that lacked it: a fuller result replaces it.
  shutil.copytree(os.path.join(FIXTURES, "gsm8k"), os.path.join(evals_dir, "gsm8k"))
  with open(os.path.join(workdir, "evals.json"), "w") as f:
    json.dump({"step": 1, "options": dict(FULL, sets=["sciq"], eval_data_dir=evals_dir),
               "sets": {}, "domains": {}, "missing": {}}, f)
  proc = _evaluate(workdir, *FULL_FLAGS, f"--eval_data_dir={evals_dir}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.load(open(os.path.join(workdir, "evals.json")))["options"]["sets"] == [
      "gsm8k", "sciq"]


def test_cli_multiple_choice_reruns_are_not_decided_by_generation(tmp_path):
  """sciq never generates, yet a --generate=false rerun of a sciq-only result was refused."""
  workdir, _ = _run_with_evals(tmp_path, dict(FULL, sets=["sciq"]))
  proc = _evaluate(workdir, f"--eval_data_dir={FIXTURES}", "--sets=sciq", "--generate=false")
  assert proc.returncode == 0, proc.stderr[-2000:]


def test_export_hf_names_the_packages_a_plain_install_lacks(tmp_path):
  """``pip install -e .`` (no test extra) scored every set, wrote evals.json, then --export_hf
  failed on its import (a ModuleNotFoundError traceback): what is missing is named before any
  set is scored. Here safetensors is hidden from find_spec in the CLI's process."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir)
  before = sorted(os.listdir(workdir))
  hide = ("import importlib.util as u, runpy, sys; f = u.find_spec; "
          "u.find_spec = lambda n, *a: None if n == 'safetensors' else f(n, *a); "
          "sys.argv = sys.argv[:1] + sys.argv[2:]; "
          "runpy.run_module('depthbench_jax.evaluate', run_name='__main__')")
  proc = subprocess.run(
      [sys.executable, "-c", hide, "-", f"--workdir={workdir}", f"--eval_data_dir={FIXTURES}",
       "--sets=gsm8k", "--max_examples=1", "--export_hf"],
      cwd=helpers.ROOT, env=helpers.subprocess_env(), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
      "error: --export_hf: needs safetensors, not installed; allowed: pip install -e '.[test]' "
      "(launch/bootstrap.sh installs it), or no --export_hf"], proc.stderr[-2000:]
  assert sorted(os.listdir(workdir)) == before


def test_cli_step_reads_that_checkpoint_and_an_earlier_one_does_not_replace_a_later(tmp_path):
  """Every --step test ran on a run of one checkpoint, its latest: --step dropped (the latest
  read), or the step guard, passed them. An earlier --step than the result holds is refused."""
  workdir = str(tmp_path / "run")
  helpers.saved_run(workdir, step=10, earlier=(5,))
  flags = [f"--eval_data_dir={FIXTURES}", "--sets=sciq", "--max_examples=1"]
  proc = _evaluate(workdir, *flags, "--step=5")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.load(open(os.path.join(workdir, "evals.json")))["step"] == 5
  assert _evaluate(workdir, *flags).returncode == 0   # the latest, 10, replaces it
  assert json.load(open(os.path.join(workdir, "evals.json")))["step"] == 10
  proc = _evaluate(workdir, *flags, "--step=5")
  assert proc.returncode == 2 and "holds the result of the later step 10" in proc.stderr, (
      proc.stderr[-2000:])
