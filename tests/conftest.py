import os
import signal
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.helpers import TEST_XLA_FLAGS  # pylint: disable=wrong-import-position

# Before jax starts (xdist workers inherit it): see helpers.TEST_XLA_FLAGS.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


def pytest_configure(config):
  """A fresh compilation cache directory per session, shared by the xdist workers (they inherit
  the controller's environment), used by this process's own compiles and handed to
  subprocesses by ``helpers.subprocess_env``. The key is the HLO plus compile options, so a hit
  is the same executable: tests that build the same tiny model (another file's, another
  worker's) compile it once; measured on tests/model + tests/residual, 11% less time."""
  import atexit
  import shutil
  import tempfile
  from tests.helpers import COMPILATION_CACHE_ENV
  if not os.environ.get(COMPILATION_CACHE_ENV) and not hasattr(config, "workerinput"):
    path = tempfile.mkdtemp(prefix="depthbench-xla-cache-")
    os.environ[COMPILATION_CACHE_ENV] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
  if os.environ.get(COMPILATION_CACHE_ENV):
    import jax
    jax.config.update("jax_compilation_cache_dir", os.environ[COMPILATION_CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_collection_modifyitems(config, items):
  """Slow-marked tests first, the rest in their own order (a stable sort). xdist hands tests out
  in collection order, so the 20-60 s tests start first and the short ones fill both workers'
  ends, instead of one worker finishing a long test while the other idles."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def train_in_process():
  """``train_and_evaluate`` here (no process start-up); pytest's signal handlers are its own
  again after each run (the trainer restores them; checked)."""
  from depthbench_jax.train.loop import train_and_evaluate
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  def train(*args, **kwargs):
    result = train_and_evaluate(*args, **kwargs)
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    return result
  yield train
  for signum, handler in handlers.items():
    signal.signal(signum, handler)
