"""Runs a python stage in a forked child process that can be killed.

A Python signal handler runs only when the interpreter gets control back, so a stage busy in native
code (a numpy product, a C extension, a sleep inside a library) would hold its timeout and a stop
request until that call returns. Forked, the stage's process can be killed at once, and the runner's
own process stays responsive. The child inherits the frames already read (copy-on-write: nothing is
pickled on the way in) and sends back only a small result (where it wrote its outputs, and their
schemas) or the error it raised.

Linux only (fork is not safe on macOS); elsewhere the stage runs in the runner's process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from typing import Any, Callable, Iterable

from ..errors import HybridflowError, StageError, first_line

CHUNK = 1 << 16


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def call_in_child(work: Callable[[], Any], streams: Iterable[Any] = ()) -> Any:
    """`work()` run in a forked child: its return value, or the HybridflowError it raised, re-raised
    here. Any exception in this process while it waits (a timeout's alarm, SIGINT, SIGTERM) kills
    the child and its whole process group first. `streams` are flushed before the fork (so buffered
    text is not written twice) and by the child before it exits."""
    streams = [sys.stdout, sys.stderr, *streams]
    _flush(streams)
    reader, writer = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _be_the_child(work, reader, writer, streams, parent)  # never returns
    os.close(writer)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also done by the child: whichever runs first, the group exists
    try:
        payload = _read_all(reader)  # signal handlers run here, and may raise
        _, status = os.waitpid(pid, 0)
    except BaseException:
        _kill(pid)
        raise
    finally:
        os.close(reader)
    if not payload:
        raise StageError(f"the stage's process ended without a result ({_describe(status)})",
                         hint="it was killed, or ran out of memory; its log may say more")
    kind, value = pickle.loads(payload)
    if kind == "error":
        raise _rebuild(value)
    return value


def _be_the_child(work, reader: int, writer: int, streams, parent: int) -> None:
    code = 0
    try:
        os.close(reader)
        os.setpgid(0, 0)  # its own process group, so that killing it takes what it started along
        _die_with_parent(parent)
        with contextlib.suppress(ValueError):  # forked from a thread other than the main one
            signal.set_wakeup_fd(-1)  # the parent's signal watcher must not hear the child's signals
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
                signal.signal(signum, signal.SIG_DFL)  # the parent decides when the child stops
        try:
            payload = pickle.dumps(("ok", work()))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            payload = pickle.dumps(("error", _portable(exc)))
        _write_all(writer, payload)
    except BaseException:  # noqa: BLE001 - the parent reports a child that sent nothing
        code = 1
    finally:
        _flush(streams)
        os._exit(code)  # no atexit handlers, no engine shutdown: those belong to the parent


def _portable(exc: BaseException) -> tuple[type, str, str | None]:
    """An exception as (class, message, hint): exceptions with keyword arguments do not pickle whole."""
    if isinstance(exc, HybridflowError):
        return type(exc), exc.message, exc.hint
    return StageError, f"{type(exc).__name__}: {first_line(exc)}", None


def _rebuild(value: tuple[type, str, str | None]) -> HybridflowError:
    cls, message, hint = value
    try:
        return cls(message, hint=hint)
    except TypeError:  # an error class whose constructor takes other arguments
        return StageError(message, hint=hint)


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when the runner dies (kill -9 included)."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)


def _kill(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(OSError):
            kill()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _flush(streams) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
