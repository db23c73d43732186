"""Every registered design runs the shared checks: a residual test file binds it through
``shared_checks_test`` (DEVELOPERS.md), or it is named in ``OWN_CHECKS`` with the file that checks
the same invariants its own way. Read from the files' source (ast): nothing is imported or run."""

import ast
import glob
import os

from depthbench_jax.residual import registry

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# design -> the test file with its scan-vs-unrolled, gate, permutation and training checks.
OWN_CHECKS = {"preln": "model/test_transformer.py",
              "attnres_full": "residual/test_attnres.py",
              "attnres_block": "residual/test_attnres.py",
              "moda": "residual/test_moda.py"}


def bound_designs(source: str) -> set[str]:
  """The designs a test module passes to ``shared_checks_test``: a tuple or list literal, or a
  module-level name bound to one."""
  tree = ast.parse(source)
  names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
           for t in node.targets if isinstance(t, ast.Name)}
  out = set()
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "shared_checks_test"
        and node.args):
      arg = node.args[0]
      arg = names.get(arg.id, arg) if isinstance(arg, ast.Name) else arg
      out |= set(ast.literal_eval(arg))
  return out


def test_bound_designs_reads_literals_and_module_names():
  assert bound_designs("D = ('a', 'b')\nt = shared_checks_test(D)\nu = shared_checks_test(['c'])"
                       ) == {"a", "b", "c"}
  assert bound_designs("t = other(('a',))") == set()


def test_every_registered_design_runs_the_shared_checks():
  bound = set()
  for path in glob.glob(os.path.join(TESTS, "residual", "test_*.py")):
    with open(path) as f:
      bound |= bound_designs(f.read())
  for design, path in OWN_CHECKS.items():
    assert os.path.exists(os.path.join(TESTS, path)), (design, path)
  missing = [d for d in registry.names() if d not in bound and d not in OWN_CHECKS]
  assert not missing, (f"{missing}: registered but no tests/residual/test_*.py binds "
                       "shared_checks_test for them (DEVELOPERS.md, 'The residual interface')")
