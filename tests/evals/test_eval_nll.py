"""NLL on a fixture equals a hand computation; answer extraction; evaluate() end to end."""

import dataclasses
import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

from depthbench_jax import evaluate
from depthbench_jax.evals import datasets, report_section, tasks
from depthbench_jax.model.transformer import abstract_params
from evals_helpers import FIXTURES, ByteTok, tiny_model_cfg


def bigram_model():
  """Attention/MLP weights zero, so x_L = E[t]: logits(t) = rmsnorm(E[t]) @ W, a bigram model.

  E[t] = one-hot(t mod d) gives rmsnorm(E[t]) = one-hot / sqrt(1/d + eps), so
  logits(t) = W[t mod d] / sqrt(1/d + eps): computable by hand.
  """
  cfg = tiny_model_cfg()
  params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), nn.unbox(abstract_params(cfg)))
  d, v = cfg.d_model, cfg.vocab_size
  params["embed"]["embedding"] = np.eye(d, dtype=np.float32)[np.arange(v) % d]
  params["layers"]["residual"] = jax.tree.map(np.ones_like, params["layers"]["residual"])
  params["residual_io"]["final_norm"]["scale"] = np.ones(d, np.float32)
  w = np.random.RandomState(0).randn(d, v).astype(np.float32)
  params["lm_head"]["kernel"] = w
  table = w.astype(np.float64) / np.sqrt(1.0 / d + cfg.norm_eps)   # [d, V]
  table = table - np.log(np.exp(table).sum(-1, keepdims=True))     # log-softmax rows
  return cfg, params, table


def hand_nll(table, d, prompt_ids, answer_ids):
  seq = prompt_ids + answer_ids
  return -sum(table[seq[j - 1] % d, seq[j]] for j in range(len(prompt_ids), len(seq)))


def test_nll_equals_hand_computed_value():
  cfg, params, table = bigram_model()
  tok = ByteTok()
  examples = datasets.load_set("gsm8k", FIXTURES)
  got = tasks.nll_metrics(cfg, params, tok, examples, batch_size=2)
  sums = [hand_nll(table, cfg.d_model, [tok.eos_id] + tok.encode(e.prompt), tok.encode(e.answer))
          for e in examples]
  counts = [len(tok.encode(e.answer)) for e in examples]
  assert got["tokens"] == sum(counts)
  np.testing.assert_allclose(got["nll_per_token"], sum(sums) / sum(counts), rtol=1e-5)
  np.testing.assert_allclose(got["nll_per_example"], np.mean(sums), rtol=1e-5)
  # Truncation: a 64-token window keeps the last 64 tokens and still scores the whole answer
  # when it fits.
  short = tasks.nll_metrics(cfg, params, tok, examples[:1], max_len=64, batch_size=2)
  ids = ([tok.eos_id] + tok.encode(examples[0].prompt) + tok.encode(examples[0].answer))[-64:]
  n = min(len(tok.encode(examples[0].answer)), 63)
  want = -sum(table[ids[j - 1] % cfg.d_model, ids[j]] for j in range(len(ids) - n, len(ids)))
  np.testing.assert_allclose(short["per_example"][0]["nll"], want, rtol=1e-5)


def test_nll_counts_the_examples_a_short_window_cuts():
  """gsm8k fixture: eos + prompt of 82 and 75 tokens, answers of 42 and 62. A 64-token window
  cuts both contexts and no answer (62 <= 63); a 48-token window also cuts the 62-token answer,
  scoring its last 47 tokens (42 + 47 = 89 in all); the full 512 cuts nothing."""
  cfg, params, _ = bigram_model()
  examples = datasets.load_set("gsm8k", FIXTURES)
  count = lambda n: {k: v for k, v in tasks.nll_metrics(cfg, params, ByteTok(), examples,
                                                         max_len=n, batch_size=2).items()
                     if k in ("tokens", "context_cut", "answer_cut")}
  assert count(None) == {"tokens": 104, "context_cut": 0, "answer_cut": 0}
  assert count(64) == {"tokens": 104, "context_cut": 2, "answer_cut": 0}
  assert count(48) == {"tokens": 89, "context_cut": 2, "answer_cut": 1}


def test_nll_of_no_scored_token_is_nan_not_zero():
  """Answers that encode to no token: nothing was scored, and 0.0 read as a perfect model in
  its domain's mean."""
  cfg, params, _ = bigram_model()
  examples = [dataclasses.replace(e, answer="") for e in datasets.load_set("gsm8k", FIXTURES)]
  got = tasks.nll_metrics(cfg, params, ByteTok(), examples, batch_size=2)
  assert got["tokens"] == 0 and np.isnan(got["nll_per_token"])
  assert np.isnan(got["nll_per_example"])   # it read 0.0
  # One empty answer of two: the per-example mean is the other's NLL, not half of it.
  examples[1] = datasets.load_set("gsm8k", FIXTURES)[1]
  got = tasks.nll_metrics(cfg, params, ByteTok(), examples, batch_size=2)
  scored = [e["nll"] for e in got["per_example"] if e["tokens"]]
  assert len(scored) == 1 and got["nll_per_example"] == pytest.approx(scored[0])


def test_multiple_choice_matches_hand_log_likelihoods():
  cfg, params, table = bigram_model()
  tok = ByteTok()
  examples = datasets.load_set("sciq", FIXTURES)
  got = tasks.mc_metrics(cfg, params, tok, examples, batch_size=4)
  acc = []
  for e in examples:
    ctx = [tok.eos_id] + tok.encode(e.prompt)
    ll = [-hand_nll(table, cfg.d_model, ctx, tok.encode(c)) for c in e.choices]
    acc.append(ll[e.label] > max(ll[:e.label] + ll[e.label + 1:]))
  assert got["acc"] == np.mean(acc)


def test_multiple_choice_scores_each_choice_after_eos_and_prompt_within_score_len(monkeypatch):
  """The bigram model above reads only the context's last token: a context without its leading
  ``<eos>``, or scored past the trained window, passed it. Each choice is scored after
  ``[eos] + prompt``, within ``score_len`` (``evaluate_set``), both for NLL and for acc."""
  seen = []
  monkeypatch.setattr(tasks, "continuation_logprobs", lambda cfg, params, pairs, **k: (
      seen.append((pairs, k["max_len"])) or [np.array([-1.0]) for _ in pairs]))
  tok = ByteTok()
  examples = datasets.load_set("sciq", FIXTURES)
  tasks.evaluate_set("sciq", None, None, tok, examples, max_len=64, score_len=32)
  (nll_pairs, nll_len), (mc_pairs, mc_len) = seen
  assert nll_len == mc_len == 32
  want = [([tok.eos_id] + tok.encode(e.prompt), tok.encode(c))
          for e in examples for c in e.choices]
  assert [(list(c), list(a)) for c, a in mc_pairs] == want
  assert [list(c) for c, _ in nll_pairs] == [[tok.eos_id] + tok.encode(e.prompt)
                                             for e in examples]


def test_acc_norm_divides_by_characters_not_tokens():
  """acc_norm compares log-likelihood per character of each choice (lm-eval-harness's
  ``acc_norm``), which differs from per token where a character is several bytes (tokens)."""
  cfg, params, table = bigram_model()
  tok = ByteTok()
  rng = np.random.RandomState(3)
  letters = list("abcdefgh") + ["\u00e9", "\u00fc", "\u4e2d"]    # 1, 2 and 3 UTF-8 bytes
  word = lambda: "".join(rng.choice(letters, rng.randint(1, 6)))
  examples = [datasets.Example(id=str(i), prompt=word(), answer="", label=int(rng.randint(3)),
                               choices=tuple(" " + word() for _ in range(3))) for i in range(40)]
  by_chars, by_tokens = [], []
  for e in examples:
    ctx = [tok.eos_id] + tok.encode(e.prompt)
    ll = np.array([-hand_nll(table, cfg.d_model, ctx, tok.encode(c)) for c in e.choices])
    for norm, out in (([len(c) - 1 for c in e.choices], by_chars),   # less the joining ' '
                      ([len(tok.encode(c)) for c in e.choices], by_tokens)):
      per = ll / np.array(norm)
      out.append(per[e.label] > np.delete(per, e.label).max())
  assert by_chars != by_tokens   # the case tells the two normalisations apart
  got = tasks.mc_metrics(cfg, params, tok, examples, batch_size=8)
  assert got["acc_norm"] == pytest.approx(np.mean(by_chars))


def test_acc_norm_leaves_the_joining_space_out_of_the_length(monkeypatch):
  """Choices ' ab' (log-likelihood -2) and ' abcdef' (-5), the second correct: per character of
  the choice text, -1.0 vs -0.833 picks the second, as lm-eval-harness (len(choice) without
  its target delimiter); counting the space, -0.667 vs -0.714 picked the first."""
  lls = {" ab": -2.0, " abcdef": -5.0}
  monkeypatch.setattr(tasks, "continuation_logprobs", lambda cfg, params, pairs, **k: [
      np.array([lls[bytes(c).decode()]]) for _, c in pairs])
  example = datasets.Example(id="x", prompt="Q", answer=" abcdef", choices=(" ab", " abcdef"),
                             label=1)
  got = tasks.mc_metrics(None, None, ByteTok(), [example])
  assert (got["acc"], got["acc_norm"]) == (0.0, 1.0)


def test_a_tie_with_another_choice_is_no_correct_answer(monkeypatch):
  """``acc`` needs the strictly highest log-likelihood (module docstring): a model scoring every
  choice alike (a uniform one) gets 0, not 1; ``acc_norm`` the same at equal lengths."""
  monkeypatch.setattr(tasks, "continuation_logprobs", lambda cfg, params, pairs, **k: [
      np.array([-3.0]) for _ in pairs])
  example = datasets.Example(id="x", prompt="Q", answer=" b", choices=(" a", " b", " c"),
                             label=1)
  got = tasks.mc_metrics(None, None, ByteTok(), [example])
  assert (got["acc"], got["acc_norm"]) == (0.0, 0.0)


def test_a_continuation_longer_than_the_window_scores_its_last_tokens():
  """max_len 32, context of 4, continuation of 40: the window keeps the last 32 tokens and
  scores every one after its first (31 log-probs, the continuation's last 31)."""
  from depthbench_jax.evals.scoring import continuation_logprobs
  cfg, params, table = bigram_model()
  rng = np.random.RandomState(4)
  ctx, cont = [256, 5, 6, 7], [int(t) for t in rng.randint(0, 256, 40)]
  (got,) = continuation_logprobs(cfg, params, [(ctx, cont)], max_len=32)
  seq = (ctx + cont)[-32:]
  want = [table[seq[j - 1] % cfg.d_model, seq[j]] for j in range(1, 32)]
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_padded_batch_scores_as_each_row_alone_unpadded():
  """Rows of 6 and 40 tokens share one batch padded with zeros to 64; each continuation's
  log-probs equal those of its row alone and unpadded: the short one scored with a window of
  exactly its length, the long one by a numpy log-softmax of the model's logits. MoDA, as its
  depth KV attends over positions beside the usual causal attention: at 3 layers (at the
  helper's 1 layer, no depth slot is written before the only layer: Pre-LN)."""
  from depthbench_jax.evals.scoring import continuation_logprobs
  from depthbench_jax.model.transformer import Transformer
  cfg = tiny_model_cfg(residual={"name": "moda"}, n_layers=3)
  rng = np.random.RandomState(5)
  leaves, tree = jax.tree.flatten(nn.unbox(abstract_params(cfg)))
  params = jax.tree.unflatten(tree, [(0.3 * rng.randn(*s.shape)).astype(np.float32)
                                     for s in leaves])
  (ctx, cont), (long_ctx, long_cont) = [
      ([256] + list(rng.randint(0, 256, n)), list(rng.randint(0, 256, m)))
      for n, m in ((3, 2), (25, 14))]
  short, long = continuation_logprobs(cfg, params, [(ctx, cont), (long_ctx, long_cont)],
                                      batch_size=2)
  (alone,) = continuation_logprobs(cfg, params, [(ctx, cont)], batch_size=1, max_len=6)
  np.testing.assert_allclose(short, alone, atol=1e-5)
  seq = np.array([long_ctx + long_cont], np.int32)
  logits = np.asarray(jax.jit(Transformer(cfg).apply)({"params": params}, seq), np.float64)[0]
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  want = [logp[j - 1, seq[0, j]] for j in range(len(long_ctx), seq.shape[1])]
  np.testing.assert_allclose(long, want, atol=1e-5)


def test_answer_extraction():
  assert tasks.gsm8k_extract("3 apples and 4 more make 7") == "7"   # no ####: the last number
  assert tasks.gsm8k_extract("so 3+4=7.\n#### 1,000") == "1000"
  assert tasks.gsm8k_extract("The answer is 12.") == "12"
  # A leading '.' belongs to the number: '-.5' read as '5', an exact match against 5.
  assert tasks.gsm8k_extract("The answer is -.5") == "-0.5"
  assert tasks.gsm8k_extract("It takes .5 hours") == "0.5"
  assert tasks.math_extract(r"$\boxed{.5}$") == tasks.math_extract(r"$\boxed{0.5}$")
  assert tasks.normalize_number("7.0") == "7"
  assert tasks.math_extract(r"thus $\boxed{\dfrac{3}{4}}$.") == r"\frac{3}{4}"
  assert tasks.math_extract(r"\boxed{x^{2}+1} and \boxed{ 42 }") == "42"
  assert tasks.normalize_math(r"\left( 1, 2 \right)") == "(1,2)"
  assert tasks.math_extract("no box") == ""
  # MATH's last_boxed_only_string: the brace-less form up to '$', and \fbox when no \boxed.
  assert tasks.math_extract(r"so $\boxed 5$.") == "5"
  assert tasks.math_extract(r"\fbox{7}") == "7"


@pytest.mark.parametrize("gold, answer, same", [
    # A list is no number: the commas went, and one of two solutions matched "0, 1" as 1.
    ("0, 1", "1", False), ("3, 5, 7", "357", False), ("-2,1", "-21", False),
    ("0, 1", "0,1", True), ("3, 120", "3120", False), ("1,000", "1000", True),
    # The grader's own steps (hendrycks_math's strip_string), which a model's answer may need:
    (r"\$32,\!348", "32348", True), (r"\$18.90", "18.9", True),   # '\$' left a backslash
    (r"\frac{4}{3}", r"\frac43", True), ("5", "x=5", True), (r"\sqrt{2}", r"\sqrt2", True),
    (r"\frac{1}{2}", "1/2", True), (r"\frac{1}{2}", "0.5", True),
    ("5.4", r"5.4 \text{ cents}", True), ("x+y=5", "5", False)])
def test_math_answers_normalise_as_the_math_grader_does(gold, answer, same):
  assert (tasks.normalize_math(gold) == tasks.normalize_math(answer)) == same, (
      tasks.normalize_math(gold), tasks.normalize_math(answer))


def test_numbers_compare_exactly_at_any_length():
  """Through a float, 400 digits raised OverflowError (ending the evaluation) and integers past
  2^53 collapsed: ...891 and ...890 were one answer."""
  assert tasks.gsm8k_extract("The answer is " + "1" * 400) == "1" * 400
  assert tasks.math_extract(r"\boxed{" + "9" * 400 + "}") == "9" * 400
  assert tasks.gsm8k_extract("#### 12345678901234567891") != tasks.gsm8k_extract(
      "#### 12345678901234567890")
  assert [tasks.normalize_number(t) for t in ("1,234.50", "$7.", "0.10", "-3.0", "1e3", "inf",
                                              "2/3")] == ["1234.5", "7", "0.1", "-3", "1000",
                                                          "inf", "2/3"]
  # Past the decimal context's 28 digits normalize() rounded: 1.000...0001 matched 1.
  assert tasks.normalize_number("1.0000000000000000000000000001") == (
      "1.0000000000000000000000000001")
  assert tasks.normalize_number("2.50000000000000000000000000000000") == "2.5"


def test_evaluate_on_fixtures_writes_evals_and_tensorboard(tmp_path):
  cfg = tiny_model_cfg()
  params = jax.tree.map(lambda s: (0.05 * np.random.RandomState(1).randn(*s.shape)).astype(
      np.float32), nn.unbox(abstract_params(cfg)))
  out = evaluate.evaluate(cfg, params, ByteTok(), data_dir=FIXTURES, max_new_tokens=4,
                          batch_size=2, timeout_s=5)
  assert set(out["sets"]) == set(datasets.SETS) and not out["missing"]
  assert set(out["domains"]) == {"coding", "stem", "math"}
  for name, res in out["sets"].items():
    assert np.isfinite(res["nll_per_token"]) and res["nll_per_token"] > 0, name
  assert "pass@1" in out["sets"]["humaneval"] and "exact_match" in out["sets"]["gsm8k"]
  assert "acc" in out["sets"]["gpqa"]
  path = evaluate.write_evals(str(tmp_path), out, step=7)
  assert json.load(open(path))["domains"]["math"]["sets"] == ["gsm8k", "math500"]
  assert os.listdir(tmp_path / "tensorboard")


def test_a_sequence_of_score_len_plus_one_tokens_fills_the_trained_positions_uncut():
  """A training row is seq_len + 1 tokens over seq_len positions; scoring capped sequences at
  seq_len tokens, so an example of exactly one training row lost its eos and was marked cut.
  gsm8k's first fixture: eos + prompt 82 tokens, answer 42: 124 tokens, 123 positions."""
  cfg = tiny_model_cfg()
  params = jax.tree.map(lambda s: (0.05 * np.random.RandomState(1).randn(*s.shape)).astype(
      np.float32), nn.unbox(abstract_params(cfg)))
  cut = lambda n: evaluate.evaluate(cfg, params, ByteTok(), sets=["gsm8k"], generate=False,
                                    data_dir=FIXTURES, max_examples=1, batch_size=2,
                                    score_len=n)["sets"]["gsm8k"]["context_cut"]
  assert (cut(123), cut(122)) == (0, 1)


def test_evaluate_scores_within_score_len():
  # The CLI caps scoring at the training context: a cap below the fixtures' lengths cuts their
  # contexts (different NLL), a cap above them changes nothing.
  cfg = tiny_model_cfg()
  params = jax.tree.map(lambda s: (0.5 * np.random.RandomState(2).randn(*s.shape)).astype(
      np.float32), nn.unbox(abstract_params(cfg)))
  run = lambda n: evaluate.evaluate(cfg, params, ByteTok(), sets=["gsm8k"], generate=False,
                                    data_dir=FIXTURES, batch_size=2, score_len=n)
  full = run(None)["sets"]["gsm8k"]
  # Above the fixtures' longest sequence (137 tokens) and below max_seq_len (run(max_seq_len) was
  # run(None) itself: the same cap).
  assert 137 < 160 < cfg.max_seq_len
  above = run(160)["sets"]["gsm8k"]
  assert above["nll_per_token"] == pytest.approx(full["nll_per_token"], rel=1e-6)
  assert not above.get("context_cut") and not above.get("answer_cut")
  cap = max(e["tokens"] for e in full["per_example"]) + 4   # every answer fits, no question
  cut = run(cap)["sets"]["gsm8k"]
  assert cut["tokens"] == full["tokens"]
  assert abs(cut["nll_per_token"] - full["nll_per_token"]) > 1e-4


def test_generation_budget_over_the_context_is_one_clear_error():
  # It cut every prompt to its last token before, silently.
  from depthbench_jax.evals.scoring import greedy_completions
  cfg = tiny_model_cfg()
  with pytest.raises(ValueError, match=r"--max_new_tokens=512 .*allowed: < 512"):
    greedy_completions(cfg, None, ByteTok(), ["Tom has 3 apples."], max_new_tokens=512)


def test_missing_sets_are_listed_not_fatal(tmp_path):
  """gsm8k's file present, gpqa's not: gsm8k is scored and gpqa listed with where its file goes
  (both were present here once, so the missing-set path was never taken); with none found it is
  an error, and with --strict any one missing."""
  cfg = tiny_model_cfg()
  params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), nn.unbox(abstract_params(cfg)))
  shutil.copytree(os.path.join(FIXTURES, "gsm8k"), tmp_path / "gsm8k")
  out = evaluate.evaluate(cfg, params, ByteTok(), sets=["gsm8k", "gpqa"],
                          data_dir=str(tmp_path), generate=False)
  assert set(out["sets"]) == {"gsm8k"} and list(out["missing"]) == ["gpqa"]
  assert "gpqa_diamond.csv" in out["missing"]["gpqa"]
  with pytest.raises(FileNotFoundError, match="gpqa_diamond.csv"):
    evaluate.evaluate(cfg, params, ByteTok(), sets=["gpqa"], data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match="gpqa_diamond.csv"):
    evaluate.evaluate(cfg, params, ByteTok(), sets=["gsm8k", "gpqa"], data_dir=str(tmp_path),
                      generate=False, strict=True)


def _generating(monkeypatch, texts):
  """``generation_metrics`` with the model's completions replaced by ``texts``."""
  monkeypatch.setattr(tasks, "greedy_completions", lambda *a, **k: list(texts))


def test_exact_match_and_pass_at_1_by_hand(monkeypatch):
  gsm = datasets.load_set("gsm8k", FIXTURES)[:2]
  _generating(monkeypatch, [f"so #### {e.target}" for e in gsm])
  assert tasks.generation_metrics("gsm8k", None, None, None, gsm)["exact_match"] == 1.0
  _generating(monkeypatch, [f"so #### {gsm[0].target}", "no number"])
  assert tasks.generation_metrics("gsm8k", None, None, None, gsm)["exact_match"] == 0.5
  blank = [datasets.Example(id="x", prompt="q", answer="", target="")]
  _generating(monkeypatch, ["no number"])   # an empty reference never matches
  assert tasks.generation_metrics("gsm8k", None, None, None, blank)["exact_match"] == 0.0
  code = datasets.load_set("humaneval", FIXTURES)[:1]
  _generating(monkeypatch, [code[0].answer])
  out = tasks.generation_metrics("humaneval", None, None, None, code, timeout_s=10.0)
  assert (out["pass@1"], out["timeouts"]) == (1.0, 0)
  _generating(monkeypatch, ["    while True:\n        pass\n"])
  out = tasks.generation_metrics("humaneval", None, None, None, code, timeout_s=1.0)
  assert (out["pass@1"], out["timeouts"]) == (0.0, 1)   # a timeout is no pass
  # Nor a program that runs and fails (no completion went through here but a pass and a loop).
  _generating(monkeypatch, ["    return None\n"])
  out = tasks.generation_metrics("humaneval", None, None, None, code, timeout_s=10.0)
  assert (out["pass@1"], out["timeouts"]) == (0.0, 0)


def test_math500_exact_match_reads_the_boxed_answer_against_the_normalised_reference(
    monkeypatch):
  """The MATH branch never ran with a known answer: GSM8K's extraction or an unnormalised
  reference there passed (the fixture's references are already normal). Boxed \\dfrac34 is
  \\frac{3}{4}; a reference of \\$18.90 is 18.9; 42 is no 0.5."""
  E = lambda i, target: datasets.Example(id=i, prompt="q", answer="", target=target)
  math = [E("a", r"\frac{3}{4}"), E("b", "0.5"), E("c", r"\$18.90")]
  _generating(monkeypatch, [r"so $\boxed{\dfrac34}$", r"\boxed{42} and 7",
                            r"it costs \boxed{18.9} #### 3"])
  got = tasks.generation_metrics("math500", None, None, None, math)["exact_match"]
  assert got == pytest.approx(2 / 3)


def test_domain_means_average_the_sets_found():
  assert evaluate.domain_means({"gsm8k": {"nll_per_token": 2.0}})["math"]["nll_per_token"] == 2.0
  coding = evaluate.domain_means({"humaneval": {"nll_per_token": 1.0},
                                  "mbpp": {"nll_per_token": 3.0}})["coding"]
  assert coding["nll_per_token"] == 2.0 and set(coding["sets"]) == {"humaneval", "mbpp"}


def test_evaluate_refuses_unknown_sets_and_reports_missing_ones(tmp_path):
  """An unknown set is one error naming the allowed sets; a missing file raises under --strict,
  else is skipped, and with nothing found at all the error lists every missing set."""
  with pytest.raises(ValueError, match="--sets: unknown \\['nope'\\]; allowed: .*gsm8k"):
    evaluate.evaluate(None, None, None, sets=["gsm8k", "nope"], data_dir=str(tmp_path))
  with pytest.raises(datasets.MissingEvalSet):
    evaluate.evaluate(None, None, None, sets=["gsm8k"], data_dir=str(tmp_path), strict=True)
  with pytest.raises(FileNotFoundError, match="no eval set found:\n.*gsm8k"):
    evaluate.evaluate(None, None, None, sets=["gsm8k"], data_dir=str(tmp_path))


def test_scalars_name_every_number_but_the_time_and_flags():
  """``evals/<set>/<metric>`` for each number of a set (not time_s, not booleans, not lists) and
  ``evals/<domain>/nll_per_token``."""
  evals = {"sets": {"gsm8k": {"nll_per_token": 1.5, "n": 3, "exact_match": 0.25, "time_s": 9.0,
                              "truncated": True, "per_example": [{"nll": 1.0}]}},
           "domains": {"math": {"nll_per_token": 1.5, "sets": ["gsm8k"]}}}
  assert evaluate.scalars(evals) == {"evals/gsm8k/nll_per_token": 1.5, "evals/gsm8k/n": 3.0,
                                     "evals/gsm8k/exact_match": 0.25,
                                     "evals/math/nll_per_token": 1.5}


def test_evals_table_rows_and_trend_words_by_hand():
  """Rows in depth order (not name order), the depth from evals.json before the summary's, a NaN
  NLL shown as '-' and left out of the slope; |slope| 0.004 reads flat, 0.010 deeper worse."""
  def run(name, depth, coding, stem):
    return ({"design": "preln", "n_layers": 99, "name": name},
            {"n_layers": depth, "domains": {"coding": {"nll_per_token": coding},
                                            "stem": {"nll_per_token": stem}}})
  text = report_section.evals_table([run("a", 16, 2.010, 1.004), run("b", 8, 2.0, 1.0),
                                     run("c", 32, float("nan"), float("nan"))])
  rows = [l for l in text.splitlines() if l.startswith("| preln |")]
  assert rows[:3] == ["| preln | 8 | - | 2.000 | 1.000 | - |",
                      "| preln | 16 | - | 2.010 | 1.004 | - |",
                      "| preln | 32 | - | - | - | - |"]
  assert rows[3] == "| preln | 8, 16, 32 | +0.010 (deeper worse) | +0.004 (flat) | - |"
  assert "| design | L | lr |" in text   # no width stated: the depths alone


def test_evals_table_names_the_best_lr_runs_not_yet_evaluated(tmp_path):
  """A best-LR run without evals.json was left out of the rows and its design's depth trend
  without a word: a trend over 8 and 32 layers read as the design's whole sweep."""
  records = []
  for depth in (8, 16, 32):
    workdir = tmp_path / f"preln_{depth}x64"
    workdir.mkdir()
    records.append({"name": workdir.name, "workdir": str(workdir), "design": "preln",
                    "n_layers": depth, "d_model": 64, "lr": 1e-3, "status": "ok",
                    "final_val_loss": 3.0, "family": 0})
    if depth != 16:
      (workdir / "evals.json").write_text(json.dumps(
          {"n_layers": depth, "domains": {"coding": {"nll_per_token": 2.0}}}))
  text = report_section.evals_table(records)
  assert ("so missing from the rows and depth trends: preln_16x64." in text), text
  # The column holds each run's shape, not its depth alone (its header said L).
  assert "| design | shape | lr | coding NLL |" in text and "| preln | 8x64 | 0.001 |" in text
  assert "Not evaluated" not in report_section.evals_table([records[0], records[2]])


def test_depth_trend_keeps_scale_families_apart():
  def run(family, depth, nll):
    return ({"design": "preln", "n_layers": depth, "family": family, "name": f"f{family}L{depth}"},
            {"domains": {"coding": {"nll_per_token": nll}}})
  text = report_section.evals_table([run(0, 16, 2.0), run(0, 32, 1.9), run(1, 16, 1.5),
                                     run(1, 32, 1.6)])
  assert "| preln (family 0) | 16, 32 | -0.100 (deeper better) |" in text
  assert "| preln (family 1) | 16, 32 | +0.100 (deeper worse) |" in text


def test_depth_trend_compares_only_like_numbers():
  """A first-4-examples run trends apart from the full-set runs (it moved the full slope from
  -0.100 to +0.410 before), and a math domain averaged over gsm8k alone at one depth and over
  gsm8k + math500 at another has no slope ('sets differ'), while coding (same sets) keeps its."""
  def run(depth, nll, limit=None, math_sets=("gsm8k", "math500")):
    evals = {"n_layers": depth, "options": {"max_examples": limit},
             "domains": {"coding": {"nll_per_token": nll, "sets": ["humaneval", "mbpp"]},
                         "math": {"nll_per_token": nll, "sets": list(math_sets)}}}
    return {"design": "preln", "name": f"L{depth}{limit}"}, evals
  full = [run(8, 2.0), run(16, 1.9)]
  text = report_section.evals_table(full + [run(32, 3.0, limit=4), run(64, 3.0, limit=4)])
  assert "| preln | 8, 16 | -0.100 (deeper better) | - | -0.100 (deeper better) |" in text
  assert "| preln (first 4) | 32, 64 | +0.000 (flat) | - | +0.000 (flat) |" in text
  text = report_section.evals_table([run(8, 2.0, math_sets=("gsm8k",)), run(16, 1.9)])
  assert "| preln | 8, 16 | -0.100 (deeper better) | - | sets differ |" in text


def test_depth_trend_compares_a_set_only_over_the_same_examples(tmp_path):
  """GPQA diamond (198 items) at one depth and GPQA main (448) at another are both 'gpqa' (the
  first file found): the stem slope mixed two sets' difficulty with no mark. evaluate records
  each set's file and examples' fingerprint; other examples read 'sets differ', named."""
  cfg = tiny_model_cfg()
  params = jax.tree.map(lambda s: (0.05 * np.random.RandomState(1).randn(*s.shape)).astype(
      np.float32), nn.unbox(abstract_params(cfg)))
  main_dir = tmp_path / "main"
  (main_dir / "gpqa").mkdir(parents=True)
  rows = open(os.path.join(FIXTURES, "gpqa", "gpqa_diamond.csv")).read().splitlines()
  (main_dir / "gpqa" / "gpqa_main.csv").write_text("\n".join(rows[:2]) + "\n")  # one item
  score = lambda data_dir: evaluate.evaluate(cfg, params, ByteTok(), sets=["gpqa", "sciq"],
                                             data_dir=data_dir, generate=False, batch_size=2)
  diamond, also_diamond = score(FIXTURES), score(FIXTURES)
  shutil.copytree(os.path.join(FIXTURES, "sciq"), main_dir / "sciq")
  other = score(str(main_dir))
  assert diamond["sets"]["gpqa"]["file"].endswith("gpqa_diamond.csv")
  assert other["sets"]["gpqa"]["file"].endswith("gpqa_main.csv")
  assert diamond["domains"]["stem"]["examples_sha1"] == also_diamond["domains"]["stem"][
      "examples_sha1"]
  run = lambda depth, evals: ({"design": "preln", "n_layers": depth, "name": f"L{depth}"},
                              {**evals, "n_layers": depth})
  text = report_section.evals_table([run(8, diamond), run(16, also_diamond)])
  assert "| preln | 8, 16 | - | +0.000 (flat) | - |" in text
  text = report_section.evals_table([run(8, diamond), run(16, other)])
  assert "| preln | 8, 16 | - | sets differ | - |" in text
  assert ("they differ between rows: those rows' NLLs are not one quantity): stem = gpqa "
          "(gpqa_diamond.csv, n=2)+sciq (preln 8); gpqa (gpqa_main.csv, n=1)+sciq (preln 16)."
          in text), text


def test_evals_table_names_the_sets_each_domain_averaged():
  """hc's coding NLL averaged humaneval and mbpp, attnres_block's humaneval alone (its mbpp file
  missing), and the table set the two side by side under 'mean over its sets' with no word;
  with one set list per domain it names that list (by default coding is humaneval alone)."""
  def run(design, coding):
    return ({"design": design, "n_layers": 8, "d_model": 96, "name": design},
            {"domains": {"coding": {"nll_per_token": 3.5, "sets": list(coding)},
                         "stem": {"nll_per_token": 2.0, "sets": ["sciq"]}}})
  text = report_section.evals_table([run("hc", ["humaneval", "mbpp"]),
                                     run("attnres_block", ["humaneval"])])
  assert ("Sets averaged per domain (they differ between rows: those rows' NLLs are not one "
          "quantity): coding = humaneval (attnres_block 8x96); humaneval+mbpp (hc 8x96); "
          "stem = sciq.") in text
  text = report_section.evals_table([run("hc", ["humaneval"]), run("attnres_block", ["humaneval"])])
  assert "Sets averaged per domain: coding = humaneval; stem = sciq." in text


def test_evals_table_marks_domains_with_examples_cut_to_the_window():
  """gsm8k had one answer cut at depth 8: math reads 2.000*, with the note; coding (no cut)
  and the depth-16 row (no cut) read plain."""
  def run(depth, cut):
    sets = {"gsm8k": {"answer_cut": cut, "context_cut": 0}, "mbpp": {"context_cut": 0}}
    doms = {"coding": {"nll_per_token": 1.0, "sets": ["mbpp"]},
            "math": {"nll_per_token": 2.0, "sets": ["gsm8k"]}}
    return {"design": "preln", "name": f"L{depth}"}, {"n_layers": depth, "sets": sets,
                                                       "domains": doms}
  text = report_section.evals_table([run(8, 1), run(16, 0)])
  assert "| preln | 8 | - | 1.000 | - | 2.000* |" in text
  assert "| preln | 16 | - | 1.000 | - | 2.000 |" in text
  assert "*: some examples of that domain's sets exceed the scoring window" in text
  assert "exceed the scoring window" not in report_section.evals_table([run(8, 0)])


def test_report_section_depth_trend(tmp_path):
  def run(design, depth, nll):
    summary = {"design": design, "n_layers": depth, "name": f"{design}{depth}"}
    evals = {"domains": {"coding": {"nll_per_token": nll}, "math": {"nll_per_token": nll + 1}},
             "sets": {"gsm8k": {"exact_match": 0.25}}}
    return summary, evals
  runs = [run("preln", 8, 2.0), run("preln", 16, 1.9), run("preln", 32, 1.8), run("hc", 8, 2.0)]
  text = report_section.evals_table(runs)
  assert "| preln | 16 | - | 1.900 | - | 2.900 | 0.250 |" in text
  trend = "| preln | 8, 16, 32 | -0.100 (deeper better) | - | -0.100 (deeper better) |"
  assert trend in text
  assert "| hc | 8 | - | - | - |" in text
  assert report_section.evals_table([({"design": "x"}, {})]) is None
  # Run records as report.scorecard passes them: summary dicts with a workdir holding evals.json.
  # Only each shape's best-LR run counts: a worse LR and a diverged run at 32 layers, both with
  # a high NLL, appear nowhere and leave the trend as it was.
  records = []
  extra = [(dict(run("preln", 32, 5.5)[0], name="preln32_lr2e-3", lr=2e-3, final_val_loss=2.9),
            run("preln", 32, 5.5)[1]),
           (dict(run("preln", 32, 5.5)[0], name="preln32_lr4e-3", lr=4e-3, status="diverged"),
            run("preln", 32, 5.5)[1])]
  for summary, evals in [(dict(s, lr=1e-3, final_val_loss=2.8), e) for s, e in runs] + extra:
    workdir = tmp_path / summary["name"]
    workdir.mkdir()
    (workdir / "evals.json").write_text(json.dumps(evals))
    records.append(dict({"status": "ok"}, **summary, d_model=64, workdir=str(workdir)))
  table = report_section.evals_table(records)
  assert trend in table and "5.500" not in table
  assert "| preln | 16x64 | 0.001 | 1.900 | - | 2.900 | 0.250 |" in table


def test_greedy_completions_keep_the_prompt_tail_and_cut_at_eos_and_the_earliest_stop(
    monkeypatch):
  """Each prompt keeps its last max_len - max_new_tokens tokens (eos prepended first); a short
  last batch is padded to batch_size rows with only its real rows counted; the generated eos is
  dropped and the text cut at the earliest stop, whatever the order of ``stops``."""
  from depthbench_jax.evals import scoring

  class EosTok(ByteTok):
    def decode(self, ids):
      return "".join("<eos>" if i == self.eos_id else chr(i) for i in ids)

  calls = []
  def fake_generate(cfg, params, prompts, max_new_tokens, *, eos_id, pad_to, n_real):
    calls.append(([list(p) for p in prompts], max_new_tokens, n_real))
    return [list(b"A\nB|C") + [eos_id] for _ in prompts]
  monkeypatch.setattr(scoring, "greedy_generate", fake_generate)
  cfg, tok = tiny_model_cfg(), EosTok()
  texts = scoring.greedy_completions(cfg, None, tok, ["abcdefgh", "hi", "zz"], max_new_tokens=4,
                                     batch_size=2, max_len=8)
  assert texts == ["A\nB|C"] * 3
  assert calls[0] == ([list(b"efgh"), [256] + list(b"hi")], 4, 2)
  assert calls[1] == ([[256] + list(b"zz"), [256]], 4, 1)
  assert scoring.greedy_completions(cfg, None, tok, ["q"], max_new_tokens=4, max_len=8,
                                    stops=["\n", "|"]) == ["A"]
  # The earliest stop, not the first listed (in that order both were "\n").
  assert scoring.greedy_completions(cfg, None, tok, ["q"], max_new_tokens=4, max_len=8,
                                    stops=["|", "\n"]) == ["A"]
  # A completion that ran out of tokens ends with no eos: its last token is text, kept.
  monkeypatch.setattr(scoring, "greedy_generate", lambda *a, **k: [list(b"A\nB|C")])
  assert scoring.greedy_completions(cfg, None, tok, ["q"], max_new_tokens=4,
                                    max_len=8) == ["A\nB|C"]


def test_the_examples_fingerprint_follows_the_answers():
  """Two files of one set whose answers differ (a corrected copy) scored under one fingerprint
  when only the ids and prompts counted; the test beside it changed the ids too."""
  import dataclasses
  ex = datasets.load_set("gsm8k", FIXTURES)
  changed = [dataclasses.replace(ex[0], answer=ex[0].answer + " (corrected)"), *ex[1:]]
  assert datasets.examples_fingerprint(ex) != datasets.examples_fingerprint(changed)
  assert datasets.examples_fingerprint(ex) == datasets.examples_fingerprint(list(ex))


def test_score_rows_pad_to_a_power_of_two_within_the_window():
  from depthbench_jax.evals.scoring import _bucket
  assert [_bucket(n, 512) for n in (1, 32, 33, 64, 65, 300)] == [32, 32, 64, 64, 128, 512]
  assert _bucket(100, 96) == 96   # never wider than max_len


def test_evals_table_marks_a_run_scored_on_the_first_examples_only():
  """evaluate --max_examples=N (recorded in evals.json's options) once gave a row that read like
  a full-set NLL beside the full-set rows; its shape now says how many examples it scored."""
  def run(name, depth, nll, max_examples):
    return ({"design": "preln", "n_layers": depth, "name": name, "d_model": 64},
            {"domains": {"coding": {"nll_per_token": nll}},
             "options": {"max_examples": max_examples}})
  text = report_section.evals_table([run("a", 8, 2.0, None), run("b", 16, 1.5, 4)])
  assert "| preln | 8x64 | - | 2.000 |" in text
  assert "| preln | 16x64 (first 4) | - | 1.500 |" in text
  assert "(first N): only the first N examples of each set" in text
  assert "first N" not in report_section.evals_table([run("a", 8, 2.0, None)])


def test_evals_table_marks_a_run_evaluated_before_its_last_step():
  """evals.json made at step 500 of a 7770-step run read as the final result, and its NLL
  entered the depth trend of the final rows."""
  def run(name, depth, nll, step):
    return ({"design": "preln", "n_layers": depth, "name": name, "d_model": 64, "steps": 7770},
            {"domains": {"coding": {"nll_per_token": nll}}, "step": step})
  text = report_section.evals_table([run("a", 8, 2.0, 7770), run("b", 16, 3.5, 500),
                                     run("c", 16, 1.5, 7770)])
  assert "| preln | 16x64 (step 500 of 7770) | - | 3.500 |" in text
  assert "| preln | 16x64 | - | 1.500 |" in text and "(step s of n): evaluated at" in text
  trend = text.split("Depth trend")[1]
  assert "| preln | 8, 16 |" in trend and "| preln (step 500 of 7770) | 16 |" in trend


def test_domain_trend_names_a_non_monotonic_one():
  """The paper calls Pre-LN's domain NLL 'weak or non-monotonic'; a slope alone read a dip and
  rise over three depths as flat or as one direction."""
  def run(depth, nll):
    return ({"design": "preln", "n_layers": depth, "name": f"p{depth}", "d_model": 64},
            {"domains": {"math": {"nll_per_token": nll}}})
  trend = lambda *nlls: report_section.evals_table(
      [run(d, v) for d, v in zip((16, 32, 64), nlls)]).split("Depth trend")[1]
  assert "(non-monotonic)" in trend(2.00, 1.90, 2.02)
  assert "(deeper better)" in trend(2.10, 2.00, 1.90)
  assert "(flat)" in trend(2.000, 2.003, 2.001)   # within FLAT_TOL: no turn
