"""``train_and_evaluate(config, workdir)``: the one training driver every run goes through.

Builds the mesh, the sharded state and the data iterator; resumes from the latest complete
checkpoint; runs jitted train steps with periodic eval, metrics (TensorBoard via clu, plus
``metrics.jsonl``), a progress line with steps/s and ETA, checkpoints and ``summary.json``.
SIGTERM (or a first Ctrl-C) saves a checkpoint and exits cleanly (status 'interrupted').

Divergence. Every step's metrics stay on the device until the next step that logs, evaluates,
runs diagnostics or checkpoints; there they are fetched in one transfer and the
``DivergenceGuard`` checks each step in order (no host sync per step). On the first bad step
(non-finite loss or gradient, or a loss spike) the run stops before anything else uses the
state: no checkpoint after the last good step is written, earlier ones are kept (the latest is
``summary.json``'s ``last_checkpoint_step``), and ``summary.json`` has status 'diverged' with
``diverged_step`` and ``diverged_reason``. A checkpoint at step s thus always holds a state
reached through finite, spike-free steps 1..s.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import time

import jax
import numpy as np
from absl import logging

from depthbench_jax import recipe, revision, shapes
from depthbench_jax.data import pipeline
from depthbench_jax.hosts import refusals_agreed
from depthbench_jax.model.transformer import count_params
from depthbench_jax.sweep import format_duration
from depthbench_jax.systems.flops import train_flops_per_token
from depthbench_jax.train import checkpoint, config_check, sharding, summary, workdir_lock
from depthbench_jax.train import writer as writer_lib
from depthbench_jax.train.jitted import jitted_steps
from depthbench_jax.train.step import init_state
from depthbench_jax.train.throughput import StepClock

# Dense bf16 matmul peak per device, FLOP/s, for MFU. ``config.peak_flops_per_device`` wins.
# Matched in order against ``device_kind``: "TPU v5 lite" (v5e) before "TPU v5" (v5p), the H100
# PCIe and NVL cards (NVIDIA's datasheet, dense) before the SXM's "NVIDIA H100 80GB HBM3".
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12,
              "A100": 312e12, "B200": 2250e12,
              "TPU v5 lite": 197e12, "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v4": 275e12}


def peak_flops_per_device(config) -> float | None:
  if config.peak_flops_per_device:
    return float(config.peak_flops_per_device)
  kind = jax.devices()[0].device_kind
  for name, flops in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return flops
  return None  # CPU: no meaningful peak; the bench measures one.


def total_steps_of(config, params_total: int) -> int:
  """``config.steps``, or the Chinchilla budget ``tokens_per_param * N`` / tokens per step, N =
  ``params_total`` (the run's own), or ``shapes.budget_params`` with ``config.budget_design``."""
  if config.steps > 0:
    return int(config.steps)
  if config.budget_design:
    params_total = shapes.budget_params(config)
  tokens_per_step = config.data.global_batch_size * config.data.seq_len
  return max(1, math.ceil(config.tokens_per_param * params_total / tokens_per_step))


class _Preemption:
  """SIGTERM -> save and stop, at a step every process agrees on.

  One process: a Python handler sets a flag the loop reads between steps; Ctrl-C (SIGINT) does
  the same the first time (it was a KeyboardInterrupt traceback that lost the steps since the
  last checkpoint), and a second Ctrl-C interrupts at once. A SIGINT ignored from the start (a
  background job of ``run_sweep.sh``) stays ignored. Several processes (JAX's multi-host
  runtime): JAX's preemption service (``multihost_utils.reached_preemption_sync_point``) hears
  the SIGTERM of any process, and all processes reach the same sync step, so none is left
  waiting in the next step's collective while the others save; no Python SIGTERM handler then
  (it would replace the service's), and a first Ctrl-C sends the process a SIGTERM for the
  service to hear (it was a KeyboardInterrupt traceback on every process, and no save).
  """

  def __init__(self):
    self.requested, self._previous = False, {}
    # JAX starts the service in jax.distributed.initialize unless its config turns it off.
    self._multihost = (jax.process_count() > 1 and jax.distributed.is_initialized()
                       and jax.config.jax_enable_preemption_service)
    try:
      if self._multihost:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
          self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._to_sigterm)
        return
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
      if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
    except ValueError:  # Not the main thread (tests): no handler.
      pass

  def restore(self) -> None:
    """The handlers from before, once the steps are over: a caller training in-process (tests,
    a notebook) gets its own Ctrl-C back."""
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def __enter__(self) -> "_Preemption":
    return self

  def __exit__(self, *exc) -> None:
    self.restore()   # Also when a step raises: the caller's first Ctrl-C only set a flag.

  def _to_sigterm(self, signum, frame):
    """A first Ctrl-C under several processes: a SIGTERM to this process, which JAX's
    preemption service hears; a second interrupts at once."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.warning("Ctrl-C: every process saves a checkpoint and exits (Ctrl-C again to stop "
                    "at once).")
    os.kill(os.getpid(), signal.SIGTERM)

  def _handle(self, signum, frame):
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.default_int_handler)  # A second Ctrl-C: stop now.
      logging.warning("Ctrl-C: saving a checkpoint and exiting (Ctrl-C again to stop at once).")
    else:
      logging.warning("SIGTERM: saving a checkpoint and exiting.")
    self.requested = True

  def reached(self, step: int) -> bool:
    """Whether to save and stop after ``step`` (call once per step, every process)."""
    if self._multihost and not self.requested:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      self.requested = multihost_utils.reached_preemption_sync_point(step)
      if self.requested:
        logging.warning("Preemption: every process saves at step %d and exits.", step)
    return self.requested


def _global_batch(local: dict, batch_sharding) -> dict:
  return {k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v))
          for k, v in local.items()}


def _poison(local: dict, vocab_size: int) -> dict:
  """``config.debug.nan_at_step``: one out-of-vocabulary input token makes the step's loss NaN."""
  tokens = np.array(local["tokens"])
  tokens[0, 0] = vocab_size
  return {**local, "tokens": tokens}


def evaluate(params, val_batches, eval_fn, batch_sharding) -> float | None:
  """Mean held-out loss per token; None without validation batches (``data.val_batches=0``)."""
  loss_sum, count = 0.0, 0.0
  for local in val_batches:
    out = eval_fn(params, _global_batch(local, batch_sharding))
    loss_sum += float(out["loss_sum"])
    count += float(out["count"])
  return loss_sum / count if count else None


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains (or resumes) the run described by ``config`` in ``workdir``; returns the summary.
  One trainer per workdir (``workdir_lock``): a second one is refused before it writes."""
  lock = workdir_lock.TrainerLock(workdir, jax.process_index())
  try:
    return _train_and_evaluate(config, workdir, lock)
  finally:
    lock.release()


def _train_and_evaluate(config, workdir: str, lock: workdir_lock.TrainerLock) -> dict:
  start_time = time.time()
  model_cfg = config_check.validate(config, jax.device_count())
  process_index, process_count = jax.process_index(), jax.process_count()
  if os.path.isdir(workdir):   # Before its files are read: a diverged summary a live session
    # set aside was put back under it (_diverged_summary). No lock file made here: a run refused
    # for its input leaves the folder as it was.
    lock.acquire_agreed(process_count, create=False)
  saved_config = os.path.join(workdir, summary.CONFIG)
  resumed_step = (summary.checkpoint_steps(workdir) or [None])[-1]
  if resumed_step is not None:
    if os.path.exists(saved_config):
      config_check.check_resume(summary.read_json(saved_config), config, workdir)
    checkpoint.check_committed(workdir, resumed_step)
    if not os.path.exists(saved_config):  # deleted: the resume trained on unchecked
      trained = checkpoint.read_progress(workdir, resumed_step).get("config")
      if trained:  # the recipe each checkpoint records (older checkpoints: none)
        config_check.check_resume(trained, config, workdir)
  # A finished run whose checkpoints were deleted to free disk (config.json and summary kept):
  # its recipe is compared as a resume's would be, whatever the steps, then it is finished.
  pruned = resumed_step is None and os.path.exists(saved_config)
  if pruned and _saved_summary(workdir) is not None:
    config_check.check_resume(summary.read_json(saved_config), config, workdir)
  diverged = _diverged_summary(workdir, config)
  if diverged is not None:  # The same rules would stop it again: its files stay as they are.
    if process_index == 0:
      print(f"{workdir}: diverged at step {diverged.get('diverged_step')} "
            f"({diverged.get('diverged_reason')}); nothing to train: under other divergence.* "
            f"or skip_nonfinite_steps settings it resumes from its last checkpoint", flush=True)
    return diverged
  # A diverged run trained again under other rules: its summary, set aside below, holds its
  # sessions' time through the divergence; the checkpoint it resumes from, only up to its save
  # (and without one, nothing: the first session's time left the run's device-hours).
  retrained = _saved_summary(workdir)
  retrained = retrained if (retrained or {}).get("status") == "diverged" else None
  counts = count_params(model_cfg)
  steps = total_steps_of(config, counts["total"])
  # A pruned finished run trained again from scratch, setting its result aside; it is finished.
  if resumed_step == steps or pruned:
    finished = _finished_summary(workdir, steps)
    if finished is not None:  # Nothing to train: its files stay as they are.
      if process_index == 0:
        print(f"{workdir}: finished at step {steps} ({summary.SUMMARY}"
              + ("; its checkpoints are gone" if pruned else "") + "); nothing to train",
              flush=True)
      return finished
  config_check.check_warmup(config, steps)   # steps=-1 resolved: the first place it is known
  # Before anything is written, and before the iterator starts any data workers: reading the
  # data is where other shards than the checkpoints' or a seq_len it is too short for fail.
  # Each host reads its own copy: one refusing alone (a torn shard) is every host's refusal,
  # else the others waited for it in check_same_data's gather until the heartbeat timeout.
  with refusals_agreed(process_count):
    metas = pipeline.shard_metas(config, process_index, process_count)
    train_data = pipeline.train_fingerprint(config, process_index, process_count, metas)
  config_check.check_same_data(train_data, config)   # then every process holds the same metas
  if resumed_step is not None:  # The same metas everywhere (just checked): all refuse alike.
    config_check.check_resume_data(
        checkpoint.read_progress(workdir, resumed_step).get("train_data"), train_data, config,
        workdir)
  train_iter = pipeline.make_train_iterator(config, process_index, process_count, steps, metas)
  val_batches = pipeline.make_val_batches(config, process_index, process_count, metas)
  # Makes the run folder, before the first write (held already: agreed only).
  lock.acquire_agreed(process_count)
  if process_index == 0:
    summary.write_config(workdir, config)
    summary.set_aside_earlier(workdir)

  mesh = sharding.make_mesh(config.mesh)
  jitted = jitted_steps(config, model_cfg, mesh, steps)
  model, optimizer, seq_len = jitted.model, jitted.optimizer, config.data.seq_len
  abstract_state, state_sharding = jitted.abstract_state, jitted.state_sharding
  batch_sharding, repl = jitted.batch_sharding, sharding.replicated(mesh)
  step_fn, eval_fn = jitted.step_fn, jitted.eval_fn
  # The diagnostics run on one local device of each process, on a whole copy of the params
  # (every process computes the same result; process 0 writes it), as diagnose does post hoc:
  # on the mesh, HC's and mHC's effective-rank SVDs hung XLA:CPU on 2 or more devices, and
  # params sharded across processes gave outputs no process could fetch.
  replicate = jax.jit(lambda params: params, out_shardings=repl)
  diag_params = ((lambda params: jax.tree.map(lambda a: a.addressable_data(0), replicate(params)))
                 if jax.device_count() > 1 else (lambda params: params))

  manager = checkpoint.make_manager(workdir, config.keep_checkpoints,
                                    async_save=config.async_checkpointing)
  abstract_placed = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
      state_sharding)
  guard = summary.DivergenceGuard(config)
  earlier_wall_s = 0.0  # Wall time of the sessions before this one, up to their last save.
  earlier_device_s = 0.0  # And device-seconds: their wall time x their devices (a resume may
  # change the mesh). A checkpoint from before the field: its wall time x this session's.
  code = [revision.code_revision()]  # The commits of the sessions up to this one.
  if manager.latest_step() is not None:
    state, start_step = checkpoint.restore(manager, abstract_placed, train_iter)
    progress_so_far = checkpoint.restore_progress(manager, start_step)
    earlier_wall_s = float(progress_so_far.get("wall_time_s") or 0.0)
    earlier_device_s = float(progress_so_far.get("device_seconds")
                             or earlier_wall_s * jax.device_count())
    code = revision.history(progress_so_far.get("code"), code[0])
    guard.resume(progress_so_far)
    logging.info("Resumed from step %d in %s", start_step, workdir)
  else:
    init_fn = jax.jit(functools.partial(init_state, model, optimizer, seq_len=seq_len),
                      out_shardings=state_sharding)
    state, start_step = init_fn(jax.random.PRNGKey(config.seed)), 0
  if retrained is not None:
    earlier_wall_s = max(earlier_wall_s, float(retrained.get("wall_time_s") or 0.0))
    earlier_device_s = max(earlier_device_s, 3600 * float(retrained.get("device_hours") or 0.0))

  writer = writer_lib.create(os.path.join(workdir, "tensorboard"), start_step,
                             tensorboard=process_index == 0 and config.tensorboard)
  if start_step == 0:
    writer.write_hparams({"design": model_cfg.design, "n_layers": model_cfg.n_layers,
                          "d_model": model_cfg.d_model, "lr": config.lr,
                          "params_total": counts["total"]})
  flops_per_token = train_flops_per_token(model_cfg, seq_len)
  peak = peak_flops_per_device(config)
  tokens_per_step = config.data.global_batch_size * seq_len
  diag_hook = _diagnostics_hook(config, model_cfg, val_batches)
  # Periodic evals read the first ``eval_batches`` (0: all); the final val loss reads all.
  eval_batches = val_batches[:config.eval_batches] if config.eval_batches else val_batches
  wall_s = lambda: earlier_wall_s + time.time() - start_time
  device_s = lambda: earlier_device_s + (time.time() - start_time) * jax.device_count()
  unchecked = []  # (step, metrics on device) not yet seen by the guard.
  nan_at_step = config.debug.nan_at_step
  preempt = _Preemption()
  metrics_log = summary.MetricsLog(workdir, enabled=process_index == 0)
  metrics_log.start_session(start_step)

  status, last_train_loss, val_loss = "ok", None, None
  shown_val = (None, None)   # (val loss, its step) the progress lines show
  if start_step:  # Resumed: the last eval before (metrics.jsonl); not the final val loss.
    earlier = {s: v for s, v in summary.read_metrics(workdir, "val/loss").items()
               if s <= start_step}
    if earlier:
      last = max(earlier)
      shown_val = (earlier[last], last)
  clock = StepClock(start_step)
  logging.info("Training %s: %d params (%d non-embedding), %d steps, %d tokens/step in %d "
               "microbatch(es), mesh %s", model_cfg.design, counts["total"],
               counts["non_embedding"], steps, tokens_per_step,
               config.grad_accum_steps, dict(mesh.shape))
  step = start_step
  with mesh, preempt:
    while step < steps:
      local = next(train_iter)
      if step + 1 == nan_at_step:
        local = _poison(local, model_cfg.vocab_size)
      state, metrics = step_fn(state, _global_batch(local, batch_sharding))
      step += 1
      unchecked.append((step, metrics))
      if clock.first_step_s is None:  # The compile: timed apart, outside steps/s.
        jax.block_until_ready(metrics)
        clock.first_step_done(step)
        if process_index == 0:
          print(f"step {step}/{steps}: {clock.first_step_s:.1f}s with the jit compile (steps/s "
                f"below leave out the compile, evals and checkpoint saves)", flush=True)
      log_now = step % config.log_every == 0 or step == steps
      # The final eval (the val loss the best LR is picked by) is logged even with
      # eval_every=0: it reached summary.json and the report, never metrics.jsonl nor TensorBoard.
      eval_now = bool(val_batches) and (
          step == steps or (config.eval_every > 0 and step % config.eval_every == 0))
      diag_now = diag_hook is not None and step % config.diagnostics.every == 0
      preempted = preempt.reached(step)  # Once: the guard must see every step before a save.
      save_now = step % config.checkpoint_every == 0 or step == steps
      if not (log_now or eval_now or diag_now or save_now or preempted):
        continue
      checked, unchecked = jax.device_get(unchecked), []
      if log_now:
        m = checked[-1][1]
        steps_per_s = clock.read(step)   # None on a line of the compile step alone
        scalars = {"train/loss": float(m["loss"]), "train/grad_norm": float(m["grad_norm"]),
                   "train/lr": float(m["lr"])}
        if steps_per_s is not None:
          scalars.update({"perf/tokens_per_s": steps_per_s * tokens_per_step,
                          "perf/steps_per_s": steps_per_s})
        if peak and steps_per_s is not None:
          scalars["perf/mfu"] = (steps_per_s * tokens_per_step * flops_per_token /
                                 (peak * jax.device_count()))
        writer.write_scalars(step, scalars)
        metrics_log.append(step, scalars)
        last_train_loss = scalars["train/loss"]
      reason = guard.check_steps(checked)
      if not reason:  # A diverged step is neither evaluated nor saved.
        with clock.pause():  # Evals, diagnostics and saves stay out of steps/s.
          if eval_now:
            with clock.first_of("eval"):
              val_loss = evaluate(state.params, val_batches if step == steps else eval_batches,
                                  eval_fn, batch_sharding)
            shown_val = (val_loss, step)
            writer.write_scalars(step, {"val/loss": val_loss})
            metrics_log.append(step, {"val/loss": val_loss})
          if diag_now:  # Into metrics.jsonl too: with tensorboard=False the writer discards.
            from depthbench_jax.diagnostics.periodic import scalars_of  # the hook's own
            with clock.first_of("diagnostics"):
              diag_scalars = scalars_of(diag_hook(step, diag_params(state.params), writer))
            metrics_log.append(step, diag_scalars)
          if save_now or preempted:  # One save per step: a second one of the same step raises.
            checkpoint.save(manager, step, state, train_iter, force=preempted,
                            progress={"wall_time_s": wall_s(), "device_seconds": device_s(),
                                      "code": code,
                                      **guard.progress(),
                                      "train_data": train_data,
                                      "config": config_check.as_json(config)})
      if log_now and process_index == 0:  # After the eval: an eval step shows its own val loss.
        print(_progress_line(step, steps, scalars, shown_val[0], clock.eta_s(step, steps),
                             shown_val[1]), flush=True)
      if reason:
        status = "diverged"
        if process_index == 0:
          summary.write_status(workdir, status, step=guard.step, reason=reason)
        logging.error("Run diverged at step %d: %s", guard.step, reason)
        break
      if preempted and step < steps:
        status = "interrupted"
        break

  manager.wait_until_finished()
  writer.flush()
  if status == "interrupted" and process_index == 0:
    print(f"{workdir}: saved at step {step} of {steps}; the same command resumes it",
          flush=True)
  if step == start_step and start_step > 0:  # Resumed at its last step: no step logged here.
    last_train_loss = summary.read_metrics(workdir).get(step)
  if status == "ok" and val_loss is None:
    val_loss = evaluate(state.params, val_batches, eval_fn, batch_sharding)  # None: no val set
  # A diverged run trained through its first bad step; the loop may have run a few more (up to
  # the next step whose metrics it fetched) on a state that was already lost.
  trained = guard.step if guard.reason else step
  result = summary.build(
      config, model_cfg, counts, steps=trained, tokens=trained * tokens_per_step,
      final_train_loss=last_train_loss, final_val_loss=val_loss,
      wall_time_s=wall_s(), status=status, guard=guard,
      last_checkpoint_step=manager.latest_step(), code=code,
      cost={"device_hours": device_s() / 3600, "devices": jax.device_count(),
            "device_kind": jax.devices()[0].device_kind})
  if process_index == 0 and status != "interrupted":
    summary.write(workdir, result)
  return result


def _diverged_summary(workdir: str, config) -> dict | None:
  """The run's summary when it diverged under this config's recipe and divergence rules (and
  debug faults), else None. Run again, it retrained from its last checkpoint (from step 1
  without one, logging the same steps twice) to the same divergence, adding the time to
  ``wall_time_s`` and device-hours; the sweep counts it as done by the same rule
  (``sweep.run_state``). Without a summary, the one a session under other rules set aside
  (``summary.set_aside_earlier``) and did not replace, stopped midway, counts, and is put back:
  the same command then trained on through the divergence its rules call one, to 'ok'."""
  done = _saved_summary(workdir)
  earlier = done is None
  if earlier:
    done = _saved_summary(workdir, summary.previous_name(summary.SUMMARY))
    if done is None:   # another process of the run put it back between the two reads
      done, earlier = _saved_summary(workdir), False
  if not (done and done.get("status") == "diverged" and isinstance(done.get("config"), dict)):
    return None
  if recipe.guard_changes(done["config"], config_check.as_json(config)):
    return None
  if config_check.recipe_changes(done["config"], config):
    return None
  if earlier and jax.process_index() == 0:
    summary.restore_earlier(workdir)
  return done


def _finished_summary(workdir: str, steps: int) -> dict | None:
  """The run's summary when it finished all ``steps`` (status ok), else None. Run again, it
  would restore its last checkpoint, evaluate again and rewrite summary.json with the restart's
  seconds added to wall_time_s."""
  done = _saved_summary(workdir)
  return done if done and done.get("status") == "ok" and done.get("steps") == steps else None


def _saved_summary(workdir: str, name: str = summary.SUMMARY) -> dict | None:
  """``summary.json`` (or ``name``) as a dict; None when there is none yet, or it is torn (the
  final evaluation writes it again)."""
  try:
    done = summary.read_json(os.path.join(workdir, name))
  except (OSError, ValueError):
    return None
  return done if isinstance(done, dict) else None


def _progress_line(step, steps, scalars, val_loss, eta, val_step=None) -> str:
  """``step 40/200 (20%) | loss 3.1204 | val 3.3012 | gnorm 0.84 | 3.10 steps/s | 6.3k tok/s |
  MFU 41.0% | ETA 52s`` (MFU on devices of known peak); a val loss from an earlier step says
  which (``val 3.3012 (step 30)``); a line of the compile step alone has no rate yet
  (``steps/s from the next line``, ``ETA ?``)."""
  parts = [f"step {step}/{steps} ({100 * step / steps:.0f}%)", f"loss {scalars['train/loss']:.4f}"]
  if val_loss is not None:
    parts.append(f"val {val_loss:.4f}" + (f" (step {val_step})" if val_step != step else ""))
  parts.append(f"gnorm {scalars['train/grad_norm']:.2f}")
  if "perf/steps_per_s" in scalars:
    parts += [f"{scalars['perf/steps_per_s']:.2f} steps/s",
              f"{scalars['perf/tokens_per_s'] / 1e3:.1f}k tok/s"]
  else:
    parts.append("steps/s from the next line")
  if "perf/mfu" in scalars:
    parts.append(f"MFU {scalars['perf/mfu']:.1%}")
  parts.append(f"ETA {format_duration(eta)}")
  return " | ".join(parts)


def _diagnostics_hook(config, model_cfg, val_batches):
  if not config.diagnostics.every:
    return None
  from depthbench_jax.diagnostics.periodic import DiagnosticsHook
  # The first rows of the whole batch, as diagnose reads them: a process holds every P-th row.
  first = (val_batches[0] if jax.process_count() == 1
           else pipeline.make_val_batches(config, process_index=0, process_count=1)[0])
  return DiagnosticsHook(config, model_cfg, first)
