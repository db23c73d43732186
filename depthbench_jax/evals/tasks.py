"""Per-set evaluation: teacher-forced NLL for every set, plus the task score of its kind.

* NLL (all sets): ``nll_per_token`` = sum over the set's examples of the answer tokens'
  ``-log p(a_j | <eos>, prompt, a_<j)`` / the number of those tokens (nats; token-weighted over
  the set, not a mean of per-example means); ``nll_per_example`` = mean over examples (those
  with a scored token) of the summed answer NLL. Scored: the answer's tokens only, none of the
  prompt, no eos after the answer (as lm-eval-harness's loglikelihood). ``<eos>`` opens the
  context as documents follow eos in training. Prompt and answer are tokenized separately, so
  the scored tokens are exactly ``encode(answer)`` whatever the context (lm-eval-harness
  instead moves the context's trailing whitespace into the answer and scores the tokens of the
  joint encoding after the context's; with GPT-2 BPE the joint and separate encodings differ
  only where the answer starts with whitespace that merges with the prompt's: 1 of 164
  HumanEval problems, HumanEval/81's ``'\\n' + '\\n'`` for ``'\\n\\n'``; none of the
  ``' {answer}'`` sets). A sequence over ``max_len`` loses prompt tokens from the front, then
  answer tokens (unscored, counted in ``context_cut``/``answer_cut``).
* mc (SciQ, GPQA): ``acc`` = the correct choice has the strictly highest summed log-likelihood;
  ``acc_norm`` = the same with log-likelihood divided by the choice's length in characters,
  without the ``' '`` that joins it to the prompt (lm-eval-harness's ``len(choice)``).
* math (GSM8K, MATH-500): greedy generation, ``exact_match`` of the extracted final answer
  (GSM8K: the number after ``####``, else the last number; MATH: the last ``\\boxed{...}``)
  against the reference after normalisation.
* code (HumanEval, MBPP): greedy generation, ``pass@1`` = the program (HumanEval: prompt +
  completion + tests + ``check(entry_point)``; MBPP: completion + asserts) exits 0 in the sandbox.
"""

from __future__ import annotations

import decimal
import re
from typing import Any, Sequence

import numpy as np

from depthbench_jax.evals import sandbox
from depthbench_jax.evals.datasets import SETS, Example
from depthbench_jax.evals.scoring import continuation_logprobs, greedy_completions

STOPS = {
    "humaneval": ("\nclass", "\ndef", "\n#", "\nif", "\nprint"),   # Chen et al. (2021)
    "mbpp": ('\n"""', "\nassert", "\nif __name__", "\nprint(", "\n#"),
    "gsm8k": ("\n\n", "Question:"),    # lm-eval's gsm8k (a run-on answer's last number differs)
    "math500": ("\nProblem:", "\n\n\n"),
}


# ---------------------------------------------------------------------------------------------
# Answer extraction and normalisation.
# ---------------------------------------------------------------------------------------------

# A leading '.' is a number too: '-.5' and '.5' read as '5' (a false exact match against 5).
_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")


def normalize_number(text: str) -> str:
  """``'1,234.50'`` -> ``'1234.5'``; ``'$7.'`` -> ``'7'``; non-numbers are stripped text.

  Exact decimal arithmetic: through a float, a 400-digit answer (greedy decoding's ``1111...``)
  raised OverflowError and ended the whole evaluation, and integers past 2^53 collapsed onto
  each other (a false exact match)."""
  t = text.strip().replace(",", "").replace("$", "").rstrip(".")
  try:
    value = decimal.Decimal(t)
  except decimal.InvalidOperation:
    return t
  if not value.is_finite():
    return t
  if value == value.to_integral_value():
    return str(int(value))
  # Not normalize(): it rounds to the context's 28 digits (1.000...0001 read as 1).
  return format(value, "f").rstrip("0").rstrip(".")


def gsm8k_extract(text: str) -> str:
  m = re.search(r"####\s*(-?[\d,]*\.?\d+)", text)
  if m:
    return normalize_number(m.group(1))
  numbers = _NUMBER.findall(text)
  return normalize_number(numbers[-1]) if numbers else ""


def last_boxed(text: str) -> str | None:
  """Contents of the last ``\\boxed{...}`` (balanced braces), else of ``\\fbox{...}``, or None;
  ``\\boxed 5`` (no braces) is ``5``, up to a ``$`` (MATH's ``last_boxed_only_string``: the
  brace-less form read the next brace anywhere after it, ``\\fbox`` nothing)."""
  k = text.rfind("\\boxed")
  if k == -1:
    k = text.rfind("\\fbox")
  if k == -1:
    return None
  command = "\\boxed" if text.startswith("\\boxed", k) else "\\fbox"
  after = text[k + len(command):]
  if after.startswith(" "):
    return after.split("$")[0].strip()
  i = k + len(command)
  if not after.startswith("{"):
    return None
  depth = 0
  for j in range(i, len(text)):
    depth += {"{": 1, "}": -1}.get(text[j], 0)
    if depth == 0:
      return text[i + 1:j]
  return None


# A number as MATH writes one: commas only between thousands ("0, 1" is a list of two).
_MATH_NUMBER = re.compile(r"-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")


def _braced_fracs(t: str) -> str:
  """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{b}`` -> ``\\frac{1}{b}``."""
  head, *parts = t.split("\\frac")
  out = [head]
  for part in parts:
    if part.startswith("{") or len(part) < 2:
      out.append(part)
    elif part[1] == "{":
      out.append("{" + part[0] + "}" + part[1:])
    else:
      out.append("{" + part[0] + "}{" + part[1] + "}" + part[2:])
  return "\\frac".join(out)


def normalize_math(text: str) -> str:
  """MATH answer normalisation, the steps of the MATH grader's ``strip_string`` (Hendrycks et
  al., 2021; lm-eval-harness's ``hendrycks_math``, PRM800K's MATH-500 grader) in its order: no
  line breaks, ``\\!``, ``\\left``/``\\right``, degrees, ``\\$``, units after ``\\text{ ``,
  ``\\%``; ``dfrac``/``tfrac`` -> ``frac``; ``.5`` -> ``0.5``; a short left side dropped (``x=5``
  -> ``5``); ``\\sqrt3`` -> ``\\sqrt{3}``; no spaces; ``\\frac12`` -> ``\\frac{1}{2}``;
  ``a/b`` of integers -> ``\\frac{a}{b}``. Then ours: ``\\text{x}`` -> ``x``, no ``$`` or trailing
  period, and a number canonical (``1,000.50`` -> ``1000.5``; commas only between thousands and
  never before a space, so the lists ``0, 1`` and ``3, 120`` stay lists), then ``0.5`` ->
  ``\\frac{1}{2}`` as the grader does (after the ``a/b`` step here, which changes no answer)."""
  t = text.strip().replace("\n", "")
  for old, new in (("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                   ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""),
                   ("\\$", "")):
    t = t.replace(old, new)
  t = t.split("\\text{ ")[0] if "\\text{ " in t else t   # units on the right: 5.4 \text{ cents}
  t = t.replace("\\%", "").replace("%", "")
  t = t.replace(" .", " 0.").replace("{.", "{0.")
  t = "0" + t if t.startswith(".") else t
  left, eq, right = t.partition("=")
  if eq and "=" not in right and len(left.strip()) <= 2:   # "k = 5", not "x+y=5"
    t = right
  t = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", t)
  listed = re.search(r",\s", t)   # "3, 120" is a list of two, not the number 3120
  t = _braced_fracs(t.replace(" ", ""))
  t = re.sub(r"\\text\{([^}]*)\}", r"\1", t).replace("$", "").rstrip(".")
  fraction = re.fullmatch(r"(-?\d+)/(\d+)", t)
  if fraction:
    t = f"\\frac{{{fraction.group(1)}}}{{{fraction.group(2)}}}"
  if _MATH_NUMBER.fullmatch(t) and not listed:
    t = normalize_number(t)
  return "\\frac{1}{2}" if t == "0.5" else t


def math_extract(text: str) -> str:
  boxed = last_boxed(text)
  return normalize_math(boxed) if boxed is not None else ""


# ---------------------------------------------------------------------------------------------
# Scoring one set.
# ---------------------------------------------------------------------------------------------

def nll_metrics(cfg, params, tokenizer, examples: Sequence[Example], *, batch_size: int = 8,
                max_len: int | None = None) -> dict:
  """Teacher-forced NLL of each reference answer (module doc). ``context_cut``: examples whose
  ``<eos>`` + prompt + answer exceeds ``max_len`` (the prompt lost its first tokens);
  ``answer_cut``: those whose answer alone exceeds ``max_len - 1`` (its first tokens unscored,
  so ``tokens`` is below the answers' length)."""
  pairs = [([tokenizer.eos_id] + tokenizer.encode(e.prompt), tokenizer.encode(e.answer))
           for e in examples]
  logps = continuation_logprobs(cfg, params, pairs, batch_size=batch_size, max_len=max_len)
  sums = np.array([-float(lp.sum()) for lp in logps])
  counts = np.array([len(lp) for lp in logps])
  window = max_len or cfg.max_seq_len
  return {"n": len(examples), "tokens": int(counts.sum()),
          "context_cut": sum(len(c) + len(a) > window for c, a in pairs),
          "answer_cut": sum(len(lp) < len(a) for lp, (_, a) in zip(logps, pairs)),
          # No scored token (empty answers): no number, not 0.0 averaged into the domain (nor
          # an example's 0.0 into the per-example mean: two answers, one empty, halved it).
          "nll_per_token": float(sums.sum() / counts.sum()) if counts.sum() else float("nan"),
          "nll_per_example": float(sums[counts > 0].mean()) if counts.any() else float("nan"),
          "per_example": [{"id": e.id, "nll": float(s), "tokens": int(c)}
                          for e, s, c in zip(examples, sums, counts)]}


def mc_metrics(cfg, params, tokenizer, examples: Sequence[Example], *, batch_size: int = 8,
               max_len: int | None = None) -> dict:
  pairs, owners = [], []
  for i, e in enumerate(examples):
    ctx = [tokenizer.eos_id] + tokenizer.encode(e.prompt)
    for c in e.choices:
      pairs.append((ctx, tokenizer.encode(c)))
      owners.append(i)
  logps = continuation_logprobs(cfg, params, pairs, batch_size=batch_size, max_len=max_len)
  acc, acc_norm, k = [], [], 0
  for e in examples:
    ll = np.array([float(lp.sum()) for lp in logps[k:k + len(e.choices)]])
    norm = ll / np.array([max(1, len(c.strip())) for c in e.choices])
    k += len(e.choices)
    others = [j for j in range(len(e.choices)) if j != e.label]
    acc.append(bool(ll[e.label] > ll[others].max()))
    acc_norm.append(bool(norm[e.label] > norm[others].max()))
  return {"acc": float(np.mean(acc)), "acc_norm": float(np.mean(acc_norm))}


def code_program(name: str, example: Example, completion: str) -> str:
  if name == "humaneval":
    return example.prompt + completion + "\n\n" + example.test
  return completion + "\n\n" + example.test


def generation_metrics(name: str, cfg, params, tokenizer, examples: Sequence[Example], *,
                       max_new_tokens: int = 256, batch_size: int = 8,
                       max_len: int | None = None, timeout_s: float = 10.0) -> dict:
  kind = SETS[name].kind
  texts = greedy_completions(cfg, params, tokenizer, [e.prompt for e in examples],
                             max_new_tokens=max_new_tokens, stops=STOPS.get(name, ()),
                             batch_size=batch_size, max_len=max_len)
  if kind == "math":
    extract = gsm8k_extract if name == "gsm8k" else math_extract
    target = (lambda e: normalize_number(e.target)) if name == "gsm8k" else (
        lambda e: normalize_math(e.target))
    hits = [extract(t) == target(e) and target(e) != "" for t, e in zip(texts, examples)]
    return {"exact_match": float(np.mean(hits)), "samples": texts[:3]}
  if kind == "code":
    results = [sandbox.run_program(code_program(name, e, t), timeout_s)
               for t, e in zip(texts, examples)]
    return {"pass@1": float(np.mean([r.passed for r in results])),
            "timeouts": sum(r.status == "timeout" for r in results), "samples": texts[:3]}
  return {}


def evaluate_set(name: str, cfg, params, tokenizer, examples: Sequence[Example], *,
                 generate: bool = True, max_new_tokens: int = 256, batch_size: int = 8,
                 max_len: int | None = None, timeout_s: float = 10.0,
                 score_len: int | None = None) -> dict[str, Any]:
  """All metrics of one set: NLL always; acc for mc; exact match / pass@1 when ``generate``.

  ``score_len`` caps the scored sequences (default ``max_len``), ``max_len`` the generated ones.
  """
  spec = SETS[name]
  out: dict[str, Any] = {"domain": spec.domain, "kind": spec.kind}
  score_len = score_len or max_len
  out.update(nll_metrics(cfg, params, tokenizer, examples, batch_size=batch_size,
                         max_len=score_len))
  if spec.kind == "mc":
    out.update(mc_metrics(cfg, params, tokenizer, examples, batch_size=batch_size,
                          max_len=score_len))
  elif generate:
    out.update(generation_metrics(name, cfg, params, tokenizer, examples,
                                  max_new_tokens=max_new_tokens, batch_size=batch_size,
                                  max_len=max_len, timeout_s=timeout_s))
  return out
