"""Every registered design runs the shared checks: a residual test file binds it through
``shared_checks_test`` (DEVELOPERS.md), or it is named in ``OWN_CHECKS`` with the file that checks
the same invariants its own way. Read from the files' source (ast): nothing is imported or run."""

import ast
import glob
import os

from depthbench_jax.residual import registry

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# design -> the test files with its scan-vs-unrolled, gate, permutation and training checks.
OWN_CHECKS = {"preln": ("model/test_transformer.py", "train/test_train_loop.py"),
              "attnres_full": ("residual/test_attnres.py",),
              "attnres_block": ("residual/test_attnres.py",),
              "moda": ("residual/test_moda.py",)}
# Each of these must start the name of some test function in a design's own files.
OWN_CHECK_TOPICS = ("scan", "gate", "permut", "train|loss")


def bound_designs(source: str) -> set[str]:
  """The designs a test module passes to ``shared_checks_test`` where pytest collects the result:
  a module-level ``test_*`` name bound to the call, whose argument is a tuple or list literal
  or a module-level name bound to one. A call bound to another name (or inside a function)
  runs no test: counting every call, ``shared_checks = shared_checks_test(DESIGNS)`` passed."""
  tree = ast.parse(source)
  names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
           for t in node.targets if isinstance(t, ast.Name)}
  out = set()
  for node in tree.body:
    call = node.value if isinstance(node, ast.Assign) else None
    if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "shared_checks_test"
        and call.args and any(isinstance(t, ast.Name) and t.id.startswith("test")
                              for t in node.targets)):
      arg = call.args[0]
      arg = names.get(arg.id, arg) if isinstance(arg, ast.Name) else arg
      out |= set(ast.literal_eval(arg))
  return out


def test_bound_designs_reads_literals_and_module_names():
  assert bound_designs("D = ('a', 'b')\ntest_t = shared_checks_test(D)\n"
                       "test_u = shared_checks_test(['c'])") == {"a", "b", "c"}
  assert bound_designs("test_t = other(('a',))") == set()
  assert bound_designs("x = shared_checks_test(('a',))") == set()       # pytest collects no x
  assert bound_designs("def f():\n  test_t = shared_checks_test(('a',))") == set()


def own_check_gaps(design: str, sources: list[str]) -> list[str]:
  """What a design's own test files lack: its registry name as a string literal (so a rename
  fails here), or a test function for one of ``OWN_CHECK_TOPICS``."""
  trees = [ast.parse(source) for source in sources]
  names = [node.name.lower() for tree in trees for node in ast.walk(tree)
           if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
  literals = {node.value for tree in trees for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str)}
  gaps = [] if design in literals else [f"the literal {design!r}"]
  return gaps + [f"a test_* function about {topic!r}" for topic in OWN_CHECK_TOPICS
                 if not any(word in name for word in topic.split("|") for name in names)]


def test_own_check_gaps_finds_a_missing_topic_and_a_renamed_design():
  source = "def test_scan(): f('x')\ndef test_gate(): pass\ndef test_permutation(): pass\n"
  assert own_check_gaps("x", [source, "def test_training(): pass"]) == []
  assert own_check_gaps("y", [source]) == ["the literal 'y'",
                                           "a test_* function about 'train|loss'"]


def test_every_design_named_in_own_checks_is_checked_there():
  for design, paths in OWN_CHECKS.items():
    sources = []
    for path in paths:
      with open(os.path.join(TESTS, path)) as f:
        sources.append(f.read())
    assert not own_check_gaps(design, sources), (design, paths, own_check_gaps(design, sources))


def test_every_registered_design_runs_the_shared_checks():
  bound = set()
  for path in glob.glob(os.path.join(TESTS, "residual", "test_*.py")):
    with open(path) as f:
      bound |= bound_designs(f.read())
  missing = [d for d in registry.names() if d not in bound and d not in OWN_CHECKS]
  assert not missing, (f"{missing}: registered but no tests/residual/test_*.py binds "
                       "shared_checks_test for them (DEVELOPERS.md, 'The residual interface')")
