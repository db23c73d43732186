"""The run's metric writer: clu's default one (logging + TensorBoard) whose event file opens with
a ``SessionLog.START`` event at the first step this session logs; or, where nothing is written to
TensorBoard (processes > 0, ``config.tensorboard=False``), one that writes nothing.

A session killed after its checkpoint at step c logged steps c+1..k that the resumed session
logs again. The Rust data server (``tensorboard --load_fast=auto``, the default where it is
installed) keeps the later point of a repeated step. The Python loader (``--load_fast=false``,
``EventMultiplexer``) keeps both unless a run's second or later ``SessionLog.START`` (the first
one is the run's start, not a restart) drops every point with ``step >= event.step``. Each
session writes one at ``start_step + 1``: a resume from c drops the killed session's c+1..k and
keeps its 1..c.

clu's writers, its logging one too, import TensorFlow (``clu.metric_writers`` imports its
TensorBoard writer): about 5 s of a training process's start on 2 CPU cores, more than a tiny
run's compile. So only a writer that writes TensorBoard imports them.
"""

from __future__ import annotations

import time


class Discard:
  """A metric writer (clu's ``MetricWriter`` methods the loop calls) that writes nothing: the
  run's record is then its progress lines and ``metrics.jsonl`` (process 0)."""

  def write_scalars(self, step, scalars):
    del step, scalars

  def write_images(self, step, images):
    del step, images

  def write_hparams(self, hparams):
    del hparams

  def flush(self):
    pass

  def close(self):
    pass


def create(logdir: str, start_step: int, tensorboard: bool = True):
  """clu's ``create_default_writer(logdir)`` for a session that starts at ``start_step`` (0, or the
  restored checkpoint's step), its event file opening with a ``SessionLog.START`` at
  ``start_step + 1``; ``Discard()`` when not ``tensorboard``."""
  if not tensorboard:
    return Discard()
  from clu import metric_writers  # pylint: disable=g-import-not-at-top
  tensorboard_writer = _summary_writer_class()(logdir)
  tensorboard_writer.write_session_start(start_step + 1)
  return metric_writers.AsyncMultiWriter([metric_writers.LoggingWriter(), tensorboard_writer])


def _summary_writer_class():
  """clu's TensorBoard writer that can also write a ``SessionLog.START`` event (defined here:
  its base class imports TensorFlow)."""
  # pylint: disable=g-import-not-at-top
  from clu.metric_writers.tf import summary_writer
  import tensorflow as tf
  from tensorboard.compat.proto import event_pb2
  from tensorflow.python.ops import summary_ops_v2

  class SummaryWriter(summary_writer.SummaryWriter):

    def write_session_start(self, step: int) -> None:
      event = event_pb2.Event(
          wall_time=time.time(), step=step,
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
      with self._summary_writer.as_default():
        summary_ops_v2.import_event(tf.constant(event.SerializeToString()))

  return SummaryWriter
