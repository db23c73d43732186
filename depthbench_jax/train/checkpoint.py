"""Orbax checkpoints of the train state and the data iterator, and loading for post-hoc tools.

Layout: ``WORKDIR/checkpoints/<step>/{state,data,progress}`` (``progress``: JSON of the
run's wall time so far, the divergence guard's state and the train data's fingerprint,
``pipeline.train_fingerprint``; absent, or without the fingerprint, in older checkpoints). Orbax
writes each step to a temporary directory and renames it only once complete, so a run killed
mid-save restores the previous complete step; a partial checkpoint is never visible to
``latest_step``.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from etils import epath
import grain
import jax
import ml_collections
import orbax.checkpoint as ocp

from depthbench_jax.errors import ConfigError
from depthbench_jax.train import summary


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), summary.CHECKPOINTS)


def make_manager(workdir: str, keep: int, async_save: bool = True) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
      # The data iterator of every process is saved, each under its own name.
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=ITEMS)


ITEMS = ("state", "data", "progress")


def has_checkpoint(workdir: str) -> bool:
  """Whether ``workdir`` holds a complete checkpoint, without opening a manager."""
  return bool(summary.checkpoint_steps(workdir))


COMMIT_MARKER = "commit_success.txt"  # Orbax writes it into a step's directory last.


def check_committed(workdir: str, step: int) -> None:
  """A step directory without orbax's commit marker (a copy or a filesystem cut short) is one
  ``ConfigError`` naming it and the step before it, not an orbax error mid-restore."""
  path = os.path.join(checkpoint_dir(workdir), str(step))
  if os.path.exists(os.path.join(path, COMMIT_MARKER)):
    return
  earlier = [s for s in summary.checkpoint_steps(workdir) if s < step]
  instead = f"the run then uses step {earlier[-1]}" if earlier else "no earlier step is there"
  raise ConfigError(f"checkpoint {path} has no {COMMIT_MARKER} (an incomplete save or copy); "
                    f"allowed: move it out of {checkpoint_dir(workdir)} ({instead})")


def save(manager: ocp.CheckpointManager, step: int, state: Any, data_iter: Any,
         force: bool = False, progress: dict | None = None) -> bool:
  args = {"state": ocp.args.StandardSave(state)}
  if data_iter is not None:
    args["data"] = grain.checkpoint.CheckpointSave(data_iter)
  if progress is not None:
    args["progress"] = ocp.args.JsonSave(progress)
  return manager.save(step, args=ocp.args.Composite(**args), force=force)


def restore_progress(manager: ocp.CheckpointManager, step: int) -> dict:
  """The ``progress`` item of ``step`` ({} for a checkpoint written before it existed)."""
  try:
    return dict(manager.restore(step, args=ocp.args.Composite(
        progress=ocp.args.JsonRestore()))["progress"] or {})
  except (FileNotFoundError, KeyError, ValueError):
    return {}


def read_progress(workdir: str, step: int) -> dict:
  """``restore_progress`` of ``workdir``'s checkpoint ``step``, before the trainer opens its
  manager (a resume checks it before anything is compiled or written; this writes nothing)."""
  manager = ocp.CheckpointManager(checkpoint_dir(workdir), item_names=ITEMS,
                                  options=ocp.CheckpointManagerOptions(create=False))
  try:
    return restore_progress(manager, step)
  finally:
    manager.close()


def _unreadable(workdir: str, step: int, error: Exception, allowed: str) -> ConfigError:
  """The one error line for a committed checkpoint orbax cannot read (its files lost after the
  commit marker, e.g. in a copy cut short): the step, the reader's first line, the way out."""
  first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
  return ConfigError(f"--workdir={workdir}: checkpoint {step} cannot be read ({first}); "
                     f"allowed: {allowed}")


def restore(manager: ocp.CheckpointManager, abstract_state: Any, data_iter: Any,
            step: int | None = None) -> tuple[Any, int]:
  """Restores ``state`` (shaped and sharded like ``abstract_state``) and the iterator in place.

  grain names each process's iterator file by the process count that saved it; a resume on
  another count reads the state any process saved: all are the same, the index of the run's
  next batch (``data/pipeline.py``), so the data goes on with no batch repeated or skipped.
  """
  step = manager.latest_step() if step is None else step
  args = {"state": ocp.args.StandardRestore(abstract_state)}
  data_dir = os.path.join(str(manager.directory), str(step), "data")
  own_file = os.path.join(data_dir, _iterator_file(jax.process_index(), jax.process_count()))
  if data_iter is not None and os.path.exists(own_file):
    args["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  try:
    restored = manager.restore(step, args=ocp.args.Composite(**args))
  except (ValueError, OSError, KeyError) as e:  # committed, then damaged: a tensorstore traceback
    earlier = [s for s in manager.all_steps() if s < step]
    folder = os.path.join(str(manager.directory), str(step))
    raise _unreadable(os.path.dirname(str(manager.directory)), step, e,
                     f"{folder} moved aside, to resume from step {earlier[-1]}, or a new "
                     f"--workdir" if earlier else "a new --workdir") from None
  if data_iter is not None and "data" not in args:
    data_iter.set_state(_iterator_state_of_another_process_count(data_dir, step))
  return restored["state"], step


def _iterator_file(process_index: int, process_count: int) -> str:
  return f"process_{process_index}-of-{process_count}.json"  # grain's checkpoint handler's name


def _iterator_state_of_another_process_count(data_dir: str, step: int) -> dict:
  saved = sorted(glob.glob(os.path.join(data_dir, _iterator_file("*", "*"))))
  if not saved:
    raise ConfigError(f"checkpoint step {step} has no data iterator state in {data_dir}; "
                      f"allowed: a checkpoint written by python -m depthbench_jax.main")
  with open(saved[0]) as f:
    return json.load(f)


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's ``config.json``, with the fields added to the schema since it was written
  (``config_check.with_schema_defaults``)."""
  from depthbench_jax.train import config_check  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, "config.json")) as f:
    return config_check.with_schema_defaults(json.load(f))


def restore_run(workdir: str, step: int | None = None
                ) -> tuple[ml_collections.ConfigDict, Any, int]:
  """``(config, params, step)`` of a run's latest (or given) checkpoint, on the default device.

  For post-hoc tools (diagnose, evaluate, export): only the params are read, onto one device
  whatever the mesh that trained them; the optimizer state is not materialised;
  ``step`` is the checkpoint step that was restored (the latest when ``step`` is None).
  A directory that is not a run, one without a complete checkpoint, or a ``step`` it did not
  save is one ``ConfigError`` naming the flag and what is there, before orbax opens anything.
  """
  if not os.path.exists(os.path.join(workdir, summary.CONFIG)):
    raise ConfigError(f"--workdir={workdir}: no {summary.CONFIG}; allowed: a run directory "
                      "written by python -m depthbench_jax.main")
  saved = summary.checkpoint_steps(workdir)
  if not saved:
    raise ConfigError(f"--workdir={workdir}: no complete checkpoint under "
                      f"{checkpoint_dir(workdir)}; allowed: a run that saved one")
  step = saved[-1] if step is None else step
  if step not in saved:
    raise ConfigError(f"--step={step}; allowed: {', '.join(map(str, saved))} (the checkpoints "
                      f"of {workdir})")
  check_committed(workdir, step)
  config = load_run_config(workdir)
  manager = ocp.CheckpointManager(checkpoint_dir(workdir), item_names=ITEMS)
  # The params only, onto this process's first device whatever mesh wrote them (a pod's
  # checkpoint on one GPU): without a target orbax asks for the saving topology.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  # The item's handler reads the tree metadata alone (the Checkpointer looks for a step-level
  # metadata file inside the item too, and warns on every restore that it does not exist).
  try:
    tree = ocp.StandardCheckpointHandler().metadata(
        epath.Path(checkpoint_dir(workdir)) / str(step) / "state")
    target = {"params": jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), dict(tree)["params"])}
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=target, restore_args=jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=device),
                                               target), partial_restore=True)))
  except (ValueError, OSError, KeyError) as e:  # Committed, then damaged (files lost in a copy):
    earlier = [s for s in saved if s < step]     # a tensorstore traceback 'NOT_FOUND' before.
    raise _unreadable(workdir, step, e, f"--step={earlier[-1]} (an earlier checkpoint)" if earlier
                     else "a run whose checkpoint is whole") from None
  params = jax.tree.map(jax.numpy.asarray, restored["state"]["params"])
  return config, params, step


def restore_params(workdir: str, step: int | None = None) -> tuple[ml_collections.ConfigDict, Any]:
  """``(config, params)`` of ``restore_run``."""
  config, params, _ = restore_run(workdir, step)
  return config, params
