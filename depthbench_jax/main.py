"""``python -m depthbench_jax.main --config=configs/FILE.py[:ARG] --workdir=DIR``.

Multi-host: every host runs the same command. The coordinator comes from the flags or from
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``; with none of them set,
inside a SLURM ``srun`` step of several tasks, ``jax.distributed.initialize()`` auto-detects it.
Other launchers (``mpirun``, ...) must set the three variables: each rank would otherwise train
alone. One process per node drives every GPU of its node (``local_device_ids``).
On CPU the processes exchange collectives over gloo.

Failures. Bad input (a flag that does not parse, an unknown config field, a bad value, a
``ConfigError`` from the config file's ``get_config``, a ``JAX_*`` variable that cannot start:
``distributed_settings``) prints one ``error: ...`` line naming the field and what is allowed
and exits 2, before anything is compiled or written. In a multi-process run, a process whose
collective fails because another process died prints an ``error:`` line and exits 1 at once,
skipping JAX's shutdown barrier (which would wait for the dead peer until the heartbeat
timeout, then abort). A process blocked outside a collective is
stopped by the coordination service after ``JAX_HEARTBEAT_TIMEOUT_S`` (default 100) seconds
without a heartbeat from a peer.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import sys
import traceback
import uuid

from absl import app, flags, logging
from ml_collections import config_flags

from depthbench_jax.errors import (HOSTS_DIFFER, ConfigError, HostsDiffer, fail, flag_error_line,
                                   quiet_logs, refuse_arguments)
from depthbench_jax.hosts import gather_text, refusals_agreed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs, summary).")
_COORD = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of JAX processes.")
_PID = flags.DEFINE_integer("process_id", None, "This process's id.")
flags.mark_flags_as_required(["config", "workdir"])

USAGE = ("python -m depthbench_jax.main --config=configs/FILE.py[:ARG] --workdir=DIR "
         "[--config.FIELD=VALUE ...]")


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every failure turned into one ``error:`` line and exit 2."""
  from depthbench_jax import sweep  # A suite file given by path from another directory imports
  sweep.put_repo_on_path()          # ``configs``: "No module named 'configs'" without it.
  try:
    rest = flags.FLAGS(argv)
  except Exception as err:  # flags.Error, and config_flags' KeyError on an unknown field.
    fail(flag_error_message(err, argv))
  try:
    flags.FLAGS["config"].value.get("name")  # config_flags defers a missing file's error.
  except OSError:
    fail(f"flag --config={_config_flag(argv)}: no such file; allowed: a config file such as "
          f"configs/base.py or configs/smoke.py[:ARG]")
  return refuse_arguments(rest, USAGE)


def _config_flag(argv: list[str]) -> str | None:
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith(("--config=", "-config=")):
      return arg.split("=", 1)[1]
    if arg in ("--config", "-config") and i + 1 < len(argv):
      return argv[i + 1]
  return None


def flag_error_message(err: Exception, argv: list[str]) -> str:
  """One line for a flag-parsing failure: the flag, what is wrong, and what is allowed."""
  text = str(err)
  # config_flags re-raises a get_config error with its traceback in the message; the
  # ConfigError's own text (e.g. ``config argument arch='x'; allowed: ...``) is its last line.
  found = re.findall(r"ConfigError: (.*)", text)
  if found:
    return found[-1]
  config_arg = _config_flag(argv)
  if config_arg and not os.path.isfile(config_arg.split(":", 1)[0]):
    return (f"flag --config={config_arg}: no such file; allowed: a config file such as "
            f"configs/base.py or configs/smoke.py[:ARG]")
  if config_arg:
    from depthbench_jax import sweep  # Loads config files the way config_flags does.
    path, _, run_arg = config_arg.partition(":")
    try:  # An error in the file's get_config (a field of the wrong type), as the sweep says it.
      sweep.config_of(sweep.load_config_module(path), run_arg)
    except ConfigError as config_error:
      return str(config_error)
    except Exception:  # pylint: disable=broad-except
      pass
    # A field given twice (``--config.steps=200 --config.steps=abc``): config_flags names the
    # first value in its error; the one it quotes as the bad literal is the one to name.
    quoted = lambda arg: f"'{arg.partition('=')[2]}'" in text
    for arg in sorted(argv[1:], key=lambda a: not quoted(a)):
      if arg.lstrip("-").startswith("config."):
        name, _, value = arg.lstrip("-").partition("=")
        problem = _override_problem(config_arg, name, value, text)
        if problem:
          return f"flag --{name}={value}: {problem}"
  return flag_error_line(err, USAGE)


def _override_problem(config_arg: str, name: str, value: str, text: str) -> str | None:
  """What is wrong with ``--config.a.b=value``: a field the config lacks, or a bad value."""
  from depthbench_jax import sweep  # Loads config files the way config_flags does.
  path, _, arg = config_arg.partition(":")
  try:
    module = sweep.load_config_module(path)
    node = sweep.config_of(module, arg)
  except Exception:  # pylint: disable=broad-except
    return None
  keys = name.split(".")[1:]
  for depth, key in enumerate(keys):
    where = ".".join(["config"] + keys[:depth])
    if not hasattr(node, "keys") or key not in node:
      allowed = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "none (a leaf)"
      return f"{where} has no field {key!r}; allowed: {allowed}"
    if depth == len(keys) - 1:
      if f"--{name}=" not in text and f"-{name}=" not in text:
        return None
      detail = re.sub(r"^flag [^:]*: ", "", text.strip().splitlines()[-1])
      if "before a value for --config was specified" in detail:  # the order, not the value
        return (f"given before --config={config_arg}; allowed: --config=FILE first, then its "
                f"--config.FIELD overrides")
      kind = node.get_type(key).__name__ if hasattr(node, "get_type") else "any"
      return f"{detail}; allowed: a value of type {kind}"
    node = node[key]
  return None


# What JAX's SLURM detection needs (jax/_src/clusters/slurm_cluster.py, ``is_env_present``):
# set inside an ``srun`` job step, not in an ``salloc`` shell or a batch script outside srun.
SLURM_STEP_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                        "SLURM_LOCALID")


def in_slurm_step() -> bool:
  return all(name in os.environ for name in SLURM_STEP_VARIABLES)


def slurm_tasks() -> int:
  """Tasks of the SLURM job step this process runs in (1 outside one): with more than one,
  ``jax.distributed.initialize()`` reads the cluster from SLURM's variables. An ``salloc -n8``
  shell has ``SLURM_JOB_ID`` and ``SLURM_NTASKS=8`` but is one process, which JAX cannot place
  in a cluster (it raised "coordinator_address should be defined" at every run of a sweep)."""
  if not in_slurm_step():
    return 1
  return int(os.environ.get("SLURM_NTASKS") or 1)


def local_device_ids() -> list[int] | None:
  """``local_device_ids`` for ``jax.distributed.initialize``: ``[]`` for one process per node
  under SLURM (an ``srun`` step) or Open MPI (``mpirun``), else None (JAX's own choice).

  JAX's cluster detection runs whenever an argument is None, and under SLURM or Open MPI it
  assumes one process per GPU: given None it shows each process only GPU ``SLURM_LOCALID`` /
  ``OMPI_COMM_WORLD_LOCAL_RANK`` (jax/_src/clusters/cluster.py,
  ``auto_detect_unset_distributed_params``). At README's ``--ntasks-per-node=1
  --gpus-per-node=8`` every host trained on GPU 0 alone (4 of 32), and so did one ``mpirun``
  rank per node with the three ``JAX_*`` variables set. Given ``[]`` JAX keeps ``[]`` and
  restricts nothing, so the one process per node drives every GPU it has. Several processes on a
  node keep JAX's one GPU each; ``JAX_LOCAL_DEVICE_IDS``, JAX's own override, is left to JAX."""
  if os.environ.get("JAX_LOCAL_DEVICE_IDS"):
    return None
  if in_slurm_step():
    nodes = os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES")
    return [] if nodes and int(nodes) == slurm_tasks() else None
  if "OMPI_MCA_orte_hnp_uri" in os.environ:   # JAX's test for an Open MPI launch
    return [] if os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") == "1" else None
  return None


def hosts_expected() -> int:
  """How many processes this run's cluster will have, from the environment alone (before
  ``jax.distributed`` starts): ``JAX_NUM_PROCESSES``, else the SLURM job's tasks, else 1. The
  sweep reads it too, to tell a pod (stop every host on trouble) from one machine."""
  return max(_env_int("JAX_NUM_PROCESSES", "an integer >= 1") or 1, slurm_tasks())


def distributed_settings(coordinator: str | None = None, num_processes: int | None = None,
                         process_id: int | None = None) -> tuple:
  """``(coordinator, num_processes, process_id)``: the flags, else ``JAX_COORDINATOR_ADDRESS`` /
  ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``.

  A set that cannot start is a ConfigError naming the variable: a non-integer, an id outside
  0..N-1, an address without its port (JAX's own errors are tracebacks), or some of the three
  without the others outside a SLURM job of several tasks (that host would train alone, into
  the run dirs the other hosts write)."""
  # Each value is named as it was given: the flag, else the variable.
  coord_name = "--coordinator_address" if coordinator else "JAX_COORDINATOR_ADDRESS"
  nproc_name = "--num_processes" if num_processes is not None else "JAX_NUM_PROCESSES"
  pid_name = "--process_id" if process_id is not None else "JAX_PROCESS_ID"
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = (num_processes if num_processes is not None else
                   _env_int("JAX_NUM_PROCESSES", "an integer >= 1"))
  process_id = (process_id if process_id is not None else
                _env_int("JAX_PROCESS_ID", "an integer in 0..JAX_NUM_PROCESSES-1"))
  if num_processes is not None and num_processes < 1:
    raise ConfigError(f"{nproc_name}={num_processes}; allowed: an integer >= 1")
  if num_processes is None and (coordinator or process_id is not None):
    if slurm_tasks() > 1:
      return coordinator, num_processes, process_id  # jax reads the rest from SLURM.
    raise ConfigError(f"{coord_name} or {pid_name} is set without {nproc_name}; allowed: all "
                      f"three on every host, or none")
  if (num_processes or 0) > 1:
    host, _, port = (coordinator or "").rpartition(":")
    if not (host and port.isdigit()):
      given = f"{coord_name}={coordinator!r}" if coordinator else f"{coord_name} is unset"
      raise ConfigError(f"{given} with {nproc_name}={num_processes}; "
                        f"allowed: host:port of process 0, e.g. node0:12345")
  if num_processes and process_id is not None and not 0 <= process_id < num_processes:
    raise ConfigError(f"{pid_name}={process_id} with {nproc_name}={num_processes}; "
                      f"allowed: an integer in 0..{num_processes - 1}")
  if (num_processes or 0) > 1 and process_id is None:
    raise ConfigError(f"{pid_name} is unset with {nproc_name}={num_processes}; "
                      f"allowed: this host's id, an integer in 0..{num_processes - 1}")
  return coordinator, num_processes, process_id


def initialize_distributed(coordinator: str | None, num_processes: int | None,
                           process_id: int | None) -> None:
  """Starts JAX's multi-host runtime when more than one process is asked for or detected."""
  import jax
  coordinator, num_processes, process_id = distributed_settings(coordinator, num_processes,
                                                                process_id)
  # Under SLURM jax reads from the step what the flags or variables leave out.
  if (coordinator and num_processes and num_processes > 1) or slurm_tasks() > 1:
    # CPU collectives over gloo (the GPU backend ignores this and uses NCCL). Must be set
    # before the backend starts, so it cannot depend on jax.default_backend().
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids(),
                               **distributed_timeouts())


def check_even_hosts(devices_by_process: dict[int, int]) -> None:
  """Every process drives as many devices, else one ``HostsDiffer`` on each (checked first:
  every gather, ``gather_text`` included, reshapes ``jax.devices()`` to processes x local
  devices and failed with a traceback). The mesh is that reshape too: with 2 devices on one
  host and 6 on another a batch shard (a data x fsdp cell) would span both, and
  ``validate_batch_split`` counts shards per process, which holds only for even hosts."""
  if len(set(devices_by_process.values())) > 1:
    counts = ", ".join(f"process {p}: {n}" for p, n in sorted(devices_by_process.items()))
    raise HostsDiffer(f"the processes drive different numbers of devices ({counts}); allowed: "
                      f"the same number on every host (CUDA_VISIBLE_DEVICES, or one process per "
                      f"device)")


def check_same_run(config, workdir: str) -> None:
  """Every process trains the same config in the same workdir, else a HostsDiffer on each.

  Hosts started with other suite files or ``--results_dir``s, or a host restarted mid-sweep
  while the others had gone on to the next run, join one cluster all the same: they trained
  two recipes as one run, or crashed at its first checkpoint. Each process gathers every
  process's run (``gather_text``) and compares it with its own, before anything is written.
  The workdir is compared as given (normalised), not made absolute: a shared checkout mounted at
  other paths on other hosts spells one relative workdir as other absolute paths, and whether
  the hosts see one folder is ``check_results_shared``'s test."""
  import jax
  if jax.process_count() == 1:
    return
  from depthbench_jax.train import config_check
  me = jax.process_index()
  text = json.dumps({"workdir": os.path.normpath(workdir), **config.to_dict()}, sort_keys=True)
  mine = json.loads(text)
  for other, theirs in enumerate(map(json.loads, gather_text(text))):
    if theirs == mine:
      continue
    fields = []
    if theirs["workdir"] != mine["workdir"]:
      differ = f"--workdir={mine['workdir']}, process {other} --workdir={theirs['workdir']}"
    else:
      a, b = config_check.flatten_fields(mine), config_check.flatten_fields(theirs)
      fields = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
      differ = ", ".join(f"config.{f}={a.get(f)!r} (process {other}: {b.get(f)!r})"
                         for f in fields[:3])
      differ += f" and {len(fields) - 3} more fields" if len(fields) > 3 else ""
    allowed = ("the same suite file, run and --results_dir on every host (a host restarted "
               "mid-sweep: restart run_sweep.sh on every host)")
    if fields == ["data.path"]:
      # One spelling: config.json and every resume compare it (the fingerprint, the content).
      allowed = ("the same config.data.path on every host (FINEWEB_EDU_PATH alike: one shared "
                 "folder, or an identical copy at that path on each host)")
    raise HostsDiffer(f"process {me} of {jax.process_count()} runs {differ}; allowed: {allowed}")


def check_results_shared(workdir: str) -> None:
  """Every process sees the folder of the run's workdir (the results dir) as one: process 0
  writes a file there, every process looks for it (after an all-gather, so after the write),
  and all refuse alike with one ``HostsDiffer`` when some did not see it.

  A node-local results dir (a per-host clone's ``results/<suite>``) trained every run to its
  end, then process 0's summary was on host 0's disk alone: the other hosts' sweeps read "saved
  and stopped without a summary" as a preemption elsewhere and stopped, host 0's went on alone
  and waited JAX_INIT_TIMEOUT_S for them at its next run."""
  import jax
  if jax.process_count() == 1:
    return
  # Each host looks in its own spelling of the folder: a shared checkout mounted at other
  # paths on other hosts gives a relative workdir other absolute paths.
  folder = os.path.dirname(os.path.abspath(workdir))
  name = ""
  if jax.process_index() == 0:
    try:   # A results dir process 0 cannot write: its reason, posted as the name ('!...'), is
      os.makedirs(folder, exist_ok=True)   # every process's refusal (it was process 0's alone,
      name = f".hosts-see-this-{uuid.uuid4().hex}"   # the others waiting for it in the gather).
      open(os.path.join(folder, name), "w").close()
    except OSError as err:
      name = (f"!--workdir={workdir}: process 0 cannot write in {folder} ({err.strerror}); "
              f"allowed: a results dir every host can write")
  try:
    name = gather_text(name)[0]
    if name.startswith("!"):
      raise ConfigError(name[1:])
    seen = gather_text("1" if os.path.exists(os.path.join(folder, name)) else "0")
  finally:  # process 0 removes it once every process has looked (the second gather)
    if jax.process_index() == 0 and name and not name.startswith("!"):
      os.remove(os.path.join(folder, name))
  blind = [i for i, s in enumerate(seen) if s != "1"]
  if blind:
    raise HostsDiffer(
        f"--workdir={workdir}: process {blind[0]} of {len(seen)} does not see the file process 0 "
        f"wrote in {folder} ({len(blind)} process"
        f"{'es' if len(blind) > 1 else ''} in all); "
        f"allowed: a results dir on a filesystem every host sees (README: Multi-host GPU pods)")


def warn_if_gpus_idle(backend: str, gpu_nodes: str = "/dev/nvidia[0-9]*") -> None:
  """One stderr line when the host has NVIDIA GPUs and JAX chose the CPU unasked.

  A CUDA plugin that does not match jaxlib is skipped with a Python warning only, and the run
  then trains on the host's CPU; ``JAX_PLATFORMS`` set says the CPU is meant."""
  if backend == "cpu" and not os.environ.get("JAX_PLATFORMS") and glob.glob(gpu_nodes):
    print("warning: this host has NVIDIA GPUs but JAX runs on the CPU (no CUDA build of JAX, or "
          "one jaxlib skipped: see the warnings above); README 'On GPUs' installs it, "
          "JAX_PLATFORMS=cpu silences this", file=sys.stderr, flush=True)


def distributed_timeouts() -> dict:
  """Seconds to wait for all processes to join, and without a peer's heartbeat before the
  coordination service stops every process (a process that died, or hangs)."""
  def seconds(name: str, default: int) -> int:
    value = _env_int(name, "a whole number of seconds >= 1")
    if value is not None and value < 1:
      raise ConfigError(f"{name}={value}; allowed: a whole number of seconds >= 1")
    return default if value is None else value
  return {"initialization_timeout": seconds("JAX_INIT_TIMEOUT_S", 300),
          "heartbeat_timeout_seconds": seconds("JAX_HEARTBEAT_TIMEOUT_S", 100)}


def _env_int(name: str, allowed: str) -> int | None:
  value = os.environ.get(name)
  try:
    return int(value) if value else None
  except ValueError:
    raise ConfigError(f"{name}={value!r}; allowed: {allowed}") from None


def main(argv):
  del argv
  quiet_logs()  # Orbax and grain log every save at INFO; TF its oneDNN notice.
  config = _CONFIG.value
  from depthbench_jax.train.summary import check_folder, check_run_folder
  try:
    check_folder(_WORKDIR.value, f"--workdir={_WORKDIR.value}")
    for folder in ("checkpoints", "tensorboard"):   # a file there failed at the first save
      check_folder(os.path.join(_WORKDIR.value, folder), f"--workdir={_WORKDIR.value}")
    check_run_folder(_WORKDIR.value)
  except ConfigError as err:
    fail(str(err))
  try:
    initialize_distributed(_COORD.value, _NPROC.value, _PID.value)
  except ConfigError as err:
    fail(str(err))
  import jax
  from depthbench_jax.train import config_check
  warn_if_gpus_idle(jax.default_backend())
  try:
    # In the try whose last clause exits at once: a peer dying during these gathers left this
    # process in JAX's shutdown barrier after a traceback.
    check_even_hosts(collections.Counter(d.process_index for d in jax.devices()))
    check_same_run(config, _WORKDIR.value)
    # Before the trainer is imported (it pulls in TensorFlow via clu): bad input fails fast,
    # on every process alike, and before check_results_shared makes the workdir's parent folder
    # (a bad config left it behind on a pod). One config (check_same_run), but validate reads
    # this host's copy of the data (config.data.path): its refusal is agreed.
    with refusals_agreed(jax.process_count()):
      config_check.validate(config, jax.device_count())
    check_results_shared(_WORKDIR.value)
    from depthbench_jax.train.loop import train_and_evaluate
    result = train_and_evaluate(config, _WORKDIR.value)
  except HostsDiffer as err:  # runs, results dir, train data (config_check.check_same_data)
    fail(str(err), HOSTS_DIFFER)
  except ConfigError as err:
    fail(str(err))
  except Exception as err:  # pylint: disable=broad-except
    if jax.process_count() == 1:
      raise
    traceback.print_exc()
    first = (str(err).strip().splitlines() or [""])[0]
    print(f"error: process {jax.process_index()} of {jax.process_count()} failed: "
          f"{type(err).__name__}: {first} (if a collective failed, another process probably "
          f"died; see its log)", file=sys.stderr, flush=True)
    os._exit(1)  # The shutdown barrier would wait for the dead peer, then abort.
  logging.info("Finished %s: status=%s val_loss=%s", result["name"], result["status"],
               result["final_val_loss"])


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
