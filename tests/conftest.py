import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
  """A fresh compilation cache directory per session, shared by the xdist workers (they inherit
  the controller's environment) and handed to subprocesses by ``helpers.subprocess_env``."""
  import atexit
  import shutil
  import tempfile
  from tests.helpers import COMPILATION_CACHE_ENV
  if os.environ.get(COMPILATION_CACHE_ENV) or hasattr(config, "workerinput"):
    return
  path = tempfile.mkdtemp(prefix="depthbench-xla-cache-")
  os.environ[COMPILATION_CACHE_ENV] = path
  atexit.register(shutil.rmtree, path, ignore_errors=True)
