"""Every `--flag` the docs give a `python -m depthbench_jax.X` (or `launch/run_sweep.sh`)
command is one that X defines, and every environment variable README names is one the code reads:
users copy these commands, so a renamed flag or variable breaks them.

Static: flags are read from each CLI's source (argparse `add_argument("--name"`, absl
`DEFINE_*("name"`), nothing is imported or run.
"""

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = ("README.md", "DEVELOPERS.md", "benchmarks/README.md")
# `python -m depthbench_jax.X ...` or `launch/run_sweep.sh ...` (the sweep's flags) up to the end
# of the command: a backtick, a `#` comment, `&&`, `;` or the end of the (joined) line.
_COMMAND = re.compile(r"(?:python -m (depthbench_jax(?:\.\w+)*)"
                      r"|(?<![\w.-])(?:launch/)?run_sweep\.sh)"
                      r"([^`#;\n]*?)(?=`|#|&&|;|$)", re.M)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)(?![\w.])")   # `--config.x=` is an override.
_ARGPARSE = re.compile(r"add_argument\(\s*\"--(\w+)\"")
_ABSL = re.compile(r"DEFINE_\w+\(\s*\"(\w+)\"")
_ABSL_BOOL = re.compile(r"DEFINE_bool(?:ean)?\(\s*\"(\w+)\"")
_GENERIC = {"help", "helpfull"}


def module_source(module: str) -> str:
  """The source of the file `python -m module` runs."""
  path = os.path.join(ROOT, *module.split("."))
  for candidate in (path + ".py", os.path.join(path, "__main__.py")):
    if os.path.exists(candidate):
      with open(candidate) as f:
        return f.read()
  raise AssertionError(f"the docs run `python -m {module}`, which has no module file")


def defined_flags(module: str) -> set[str]:
  """Flag names `module` defines; absl booleans also as `no<name>`."""
  src = module_source(module)
  names = set(_ARGPARSE.findall(src)) | set(_ABSL.findall(src))
  return names | {"no" + b for b in _ABSL_BOOL.findall(src)} | _GENERIC


def doc_flags() -> list[tuple[str, str, str]]:
  """(doc, module, flag) for every flag in a documented command, continuation lines joined."""
  found = []
  for doc in DOCS:
    with open(os.path.join(ROOT, doc)) as f:
      text = re.sub(r"\\\n", " ", f.read())
    for m in _COMMAND.finditer(text):
      module = m.group(1) or "depthbench_jax.sweep"
      found += [(doc, module, flag) for flag in _FLAG.findall(m.group(2))]
  return sorted(set(found))


DOC_FLAGS = doc_flags()


def test_the_docs_commands_are_found():
  """Guards the parametrized test below against passing on an empty list: the docs give at least
  the sweep's --dry_run, main's --workdir and the systems table's --seq_len."""
  assert len(DOC_FLAGS) >= 30, DOC_FLAGS
  for want in [("depthbench_jax.sweep", "dry_run"), ("depthbench_jax.main", "workdir"),
               ("depthbench_jax.systems", "seq_len"), ("depthbench_jax.evaluate", "export_hf")]:
    assert want in {(m, f) for _, m, f in DOC_FLAGS}, want


def test_flag_extraction_sees_a_stale_flag():
  """The reader is not blind: a flag no CLI defines is not in the defined set."""
  assert "dry_run" in defined_flags("depthbench_jax.sweep")
  assert "dryrun" not in defined_flags("depthbench_jax.sweep")
  assert "nogenerate" in defined_flags("depthbench_jax.evaluate")   # absl bool negation.


@pytest.mark.parametrize("doc,module,flag", DOC_FLAGS)
def test_documented_flag_exists(doc, module, flag):
  assert flag in defined_flags(module), (
      f"{doc} gives `python -m {module} --{flag}`, which {module} does not define")


# A shell-style variable name: `JAX_NUM_PROCESSES`, `DEPTHBENCH_VERBOSE`, `SLURM_LOCALID`.
_VARIABLE = re.compile(r"(?<![\w-])([A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9])(?![\w-])")
_READERS = ("depthbench_jax", "launch", "configs", ".ci", "benchmarks")


def code_words() -> set[str]:
  """Every identifier-like word in the code that launches and runs (Python and shell)."""
  words = set()
  for top in _READERS:
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        if name.endswith((".py", ".sh", ".txt")) or name == "run":
          with open(os.path.join(folder, name), errors="replace") as f:
            words |= set(re.findall(r"[A-Za-z0-9_]+", f.read()))
  return words


def test_every_variable_readme_names_is_one_the_code_reads():
  """README's pod and run commands name environment variables (`JAX_NUM_PROCESSES=4`): a typo
  there (`JAX_NUM_PROCESS`) passed every test, as only flags were checked."""
  with open(os.path.join(ROOT, "README.md")) as f:
    named = set(_VARIABLE.findall(f.read()))
  assert {"JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "DEPTHBENCH_VERBOSE"} <= named, sorted(named)
  words = code_words()
  assert "JAX_NUM_PROCESS" not in words      # the check is by whole word
  assert sorted(named - words) == []
