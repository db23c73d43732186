import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
  """A fresh compilation cache directory per session, shared by the xdist workers (they inherit
  the controller's environment) and handed to subprocesses by ``helpers.subprocess_env``."""
  if os.environ.get("DEPTHBENCH_TEST_COMPILATION_CACHE") or hasattr(config, "workerinput"):
    return
  import atexit
  import shutil
  import tempfile
  path = tempfile.mkdtemp(prefix="depthbench-xla-cache-")
  os.environ["DEPTHBENCH_TEST_COMPILATION_CACHE"] = path
  atexit.register(shutil.rmtree, path, ignore_errors=True)
