"""The run's metric writer: clu's default one (logging + TensorBoard) whose event file opens with
a ``SessionLog.START`` event at the first step this session logs.

A session killed after its checkpoint at step c logged steps c+1..k that the resumed session
logs again. The Rust data server (``tensorboard --load_fast=auto``, the default where it is
installed) keeps the later point of a repeated step. The Python loader (``--load_fast=false``,
``EventMultiplexer``) keeps both unless a run's second or later ``SessionLog.START`` (the first
one is the run's start, not a restart) drops every point with ``step >= event.step``. Each
session writes one at ``start_step + 1``: a resume from c drops the killed session's c+1..k and
keeps its 1..c.
"""

from __future__ import annotations

import time

from clu import metric_writers
from clu.metric_writers.tf import summary_writer
import tensorflow as tf
from tensorboard.compat.proto import event_pb2
from tensorflow.python.ops import summary_ops_v2


class _SummaryWriter(summary_writer.SummaryWriter):
  """clu's TensorBoard writer that can also write a ``SessionLog.START`` event."""

  def write_session_start(self, step: int) -> None:
    event = event_pb2.Event(wall_time=time.time(), step=step,
                            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
    with self._summary_writer.as_default():
      summary_ops_v2.import_event(tf.constant(event.SerializeToString()))


def create(logdir: str, start_step: int, just_logging: bool = False):
  """``metric_writers.create_default_writer(logdir, just_logging=...)`` for a session that starts
  at ``start_step`` (0, or the restored checkpoint's step); its event file opens with a
  ``SessionLog.START`` at ``start_step + 1``."""
  if just_logging:
    return metric_writers.create_default_writer(just_logging=True)
  tensorboard = _SummaryWriter(logdir)
  tensorboard.write_session_start(start_step + 1)
  return metric_writers.AsyncMultiWriter([metric_writers.LoggingWriter(), tensorboard])
