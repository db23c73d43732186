"""launch/bootstrap.sh's own logic, with python3 and the venv's interpreter faked (no installs)."""

import os
import shutil
import subprocess

from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The venv's interpreter: pip works, uv cannot be installed (so the pip fallback runs).
WORKING_PYTHON = """#!/bin/sh
echo "python $*" >> "$FAKE_LOG"
case "$*" in *uv==*|*"pip config"*) exit 1 ;; esac
exit 0
"""
# python3 on PATH: `-m venv DIR` makes DIR/bin/python a WORKING_PYTHON.
PYTHON3 = """#!/bin/sh
echo "python3 $*" >> "$FAKE_LOG"
mkdir -p "$3/bin" && cp "$WORKING" "$3/bin/python" && chmod +x "$3/bin/python"
"""


def fake_repo(tmp_path):
  """A copy of the bootstrap's inputs under tmp_path/repo, python3 faked; returns (root, run,
  log): run() bootstraps it, log holds every interpreter call."""
  root = tmp_path / "repo"
  (root / "launch").mkdir(parents=True)
  for name in ("setup.py", "launch/constraints.txt", "launch/bootstrap.sh"):
    shutil.copy(os.path.join(REPO, name), root / name)
  fakes = tmp_path / "bin"
  fakes.mkdir()
  for path, text in ((fakes / "python3", PYTHON3), (tmp_path / "working", WORKING_PYTHON)):
    path.write_text(text)
    path.chmod(0o755)
  log = tmp_path / "log"
  env = dict(os.environ, PATH=f"{fakes}:{os.environ['PATH']}", FAKE_LOG=str(log),
             WORKING=str(tmp_path / "working"))
  env.pop("DEPTHBENCH_GPU", None)
  run = lambda: subprocess.run(["bash", str(root / "launch" / "bootstrap.sh")], env=env,
                               capture_output=True, text=True, timeout=60)
  return root, run, log


def test_a_venv_left_without_pip_is_made_again(tmp_path):
  """`python3 -m venv` without Debian's python3-venv (or cut short) leaves bin/python and no
  pip; every later bootstrap failed at its first pip call until the user removed .venv."""
  root, run, log = fake_repo(tmp_path)
  half = root / ".venv" / "bin" / "python"
  half.parent.mkdir(parents=True)
  half.write_text("#!/bin/sh\necho 'No module named pip' >&2\nexit 1\n")
  half.chmod(0o755)
  out = run()
  assert out.returncode == 0, out.stderr
  calls = log.read_text().splitlines()
  assert calls[0] == f"python3 -m venv {root / '.venv'}"
  # Installed with pip, pinned, from the checkout's own folder wherever it is run from (the
  # pins or the absolute path dropped passed "'-e' and '[test]' in a call").
  assert any(c.endswith(f" -c {root}/launch/constraints.txt -e {root}[test]") for c in calls), \
      calls
  assert (root / ".venv" / ".depthbench-installed").exists()
  log.write_text("")
  assert run().returncode == 0 and log.read_text() == ""          # stamp current: nothing runs


def test_a_changed_constraints_file_reinstalls_with_the_no_deps_packages(tmp_path):
  """The stamp hashes the constraints (a pin bump must reinstall), and every install also puts
  the NO_DEPS packages in without their dependencies: without that line the parity tests of
  HC, AttnRes and MoDA would skip and CI still pass. Neither was checked."""
  root, run, log = fake_repo(tmp_path)
  assert run().returncode == 0
  no_deps = [c for c in log.read_text().splitlines() if "--no-deps" in c]
  assert len(no_deps) == 1 and all(
      package in no_deps[0] for package in ("openai-whisper==", "hyper-connections==",
                                            "attn-res==", "moda-attention=="))
  log.write_text("")
  assert run().returncode == 0 and log.read_text() == ""          # stamp current
  with open(root / "launch" / "constraints.txt", "a") as f:
    f.write("\nsome-package==1.0\n")
  assert run().returncode == 0
  calls = log.read_text().splitlines()
  assert any(" -e " in c for c in calls) and any("--no-deps" in c for c in calls), calls
  # And so does setup.py (a new install_requires entry): the stamp hashes it too.
  log.write_text("")
  with open(root / "setup.py", "a") as f:
    f.write("\n# a new requirement\n")
  assert run().returncode == 0
  assert any(" -e " in c for c in log.read_text().splitlines()), log.read_text()


def test_a_venv_with_the_cuda_plugin_keeps_it_across_reinstalls(tmp_path):
  """README's GPU step installs '.[gpu]' by hand; a later reinstall of '[test]' alone (a jax
  bump) left the old plugin, which jaxlib skips with a warning: every run then trained on the
  host's CPU. A venv holding the plugin is installed with the 'gpu' extra, once."""
  root, run, log = fake_repo(tmp_path)
  assert run().returncode == 0
  installs = lambda: [c for c in log.read_text().splitlines() if " -e " in c]
  assert installs() and all(c.endswith("[test]") for c in installs())
  (root / ".venv" / "lib" / "python3.12" / "site-packages" / "jax_cuda12_plugin").mkdir(
      parents=True)
  log.write_text("")
  out = run()
  assert out.returncode == 0, out.stderr
  assert installs() and all(c.endswith("[test,gpu]") for c in installs())
  log.write_text("")
  assert run().returncode == 0 and log.read_text() == ""          # recorded in the stamp


# The venv's interpreter where uv installs: `pip install uv==...` makes bin/uv, which logs.
UV_PYTHON = """#!/bin/sh
echo "python $*" >> "$FAKE_LOG"
case "$*" in
  *uv==*) dir=$(dirname "$0"); printf '#!/bin/sh\\necho "uv $*" >> "$FAKE_LOG"\\n' > "$dir/uv";
          chmod +x "$dir/uv" ;;
  *"pip config get global.find-links"*) echo /etc/wheels ;;
  *"pip config"*) exit 1 ;;
esac
exit 0
"""


def test_uv_is_given_pips_find_links_from_config_and_environment(tmp_path):
  """uv reads no pip configuration: the bootstrap passed it pip's config files' find-links but
  not PIP_FIND_LINKS/PIP_CONSTRAINT, so a machine giving its CPU-only torch wheel that way got
  PyPI's CUDA build (and several GB of NVIDIA libraries) under uv."""
  root, run, log = fake_repo(tmp_path)
  (tmp_path / "working").write_text(UV_PYTHON)
  out = subprocess.run(["bash", str(root / "launch" / "bootstrap.sh")], capture_output=True,
                       text=True, timeout=60, env=dict(
                           os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                           FAKE_LOG=str(log), WORKING=str(tmp_path / "working"),
                           PIP_FIND_LINKS="/wheels", PIP_CONSTRAINT="/caps.txt"))
  assert out.returncode == 0, out.stderr
  uv = [c for c in log.read_text().splitlines() if c.startswith("uv ") and " -e " in c]
  assert len(uv) == 1 and "uv failed" not in out.stderr
  assert uv[0].endswith(f" -c {root}/launch/constraints.txt -e {root}[test]"), uv[0]
  for flag in ("--find-links /wheels", "--find-links /etc/wheels", "--constraints /caps.txt"):
    assert flag in uv[0], uv[0]


def test_a_filesystem_without_locks_installs_unlocked(tmp_path):
  """flock(2) is ENOSYS on a Lustre mounted noflock: `flock 9` failed under set -e and every
  host's sweep stopped whenever a reinstall was due."""
  root, run, log = fake_repo(tmp_path)
  flock = tmp_path / "bin" / "flock"
  flock.write_text("#!/bin/sh\necho 'flock: 9: Function not implemented' >&2\nexit 1\n")
  flock.chmod(0o755)
  out = run()
  assert out.returncode == 0, out.stderr
  assert "flock failed" in out.stderr and "[bootstrap] done" in out.stderr


def test_test_sh_passes_fast_and_workers_to_pytest(tmp_path):
  """FAST=1 and the worker choice reach pytest as README says (CI runs neither, so a broken
  line went unseen): FAST=1 deselects the slow tests, -n N or TEST_WORKERS=0 replaces the two
  default xdist workers, and extra arguments follow."""
  script = helpers.fake_launch_repo(tmp_path, "test.sh", '#!/bin/sh\necho "$*" > "$FAKE_LOG"\n')
  log = tmp_path / "log"

  def pytest_args(*args, **env):
    out = subprocess.run(["bash", str(script), *args], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "FAKE_LOG": str(log), "FAST": "0",
                              "TEST_WORKERS": "2", **env})
    assert out.returncode == 0, out.stderr
    return log.read_text().split()
  assert pytest_args() == ["-m", "pytest", "-n", "2", "--dist", "loadgroup"]
  assert pytest_args("-x", FAST="1") == ["-m", "pytest", "-n", "2", "--dist", "loadgroup",
                                         "-m", "not", "slow", "-x"]
  assert pytest_args("-n", "3", "tests/model") == ["-m", "pytest", "-n", "3", "tests/model"]
  assert pytest_args(TEST_WORKERS="0") == ["-m", "pytest"]
