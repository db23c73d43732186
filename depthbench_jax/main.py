"""``python -m depthbench_jax.main --config=configs/FILE.py[:ARG] --workdir=DIR``.

Multi-host: every host runs the same command. The coordinator comes from the flags or from
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``; with none of them set
and a cluster JAX recognises (SLURM, ...), ``jax.distributed.initialize()`` auto-detects it.
On CPU the processes exchange collectives over gloo.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs, summary).")
_COORD = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of JAX processes.")
_PID = flags.DEFINE_integer("process_id", None, "This process's id.")
flags.mark_flags_as_required(["config", "workdir"])


def initialize_distributed(coordinator: str | None, num_processes: int | None,
                           process_id: int | None) -> None:
  """Starts JAX's multi-host runtime when more than one process is asked for or detected."""
  import jax
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
  num_processes = num_processes or _env_int("JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  if coordinator and num_processes and num_processes > 1:
    # CPU collectives over gloo (the GPU backend ignores this and uses NCCL). Must be set
    # before the backend starts, so it cannot depend on jax.default_backend().
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id,
                               initialization_timeout=int(os.environ.get(
                                   "JAX_INIT_TIMEOUT_S", "300")))
  elif "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    jax.distributed.initialize()


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  return int(value) if value else None


def main(argv):
  del argv
  if not os.environ.get("DEPTHBENCH_VERBOSE"):
    logging.set_verbosity(logging.WARNING)  # Orbax and grain log every save at INFO.
  from depthbench_jax.errors import ConfigError
  initialize_distributed(_COORD.value, _NPROC.value, _PID.value)
  from depthbench_jax.train.loop import train_and_evaluate
  try:
    result = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except ConfigError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
  logging.info("Finished %s: status=%s val_loss=%s", result["name"], result["status"],
               result["final_val_loss"])


if __name__ == "__main__":
  app.run(main)
