"""Where the processes an engine launches write: this process's stdout and stderr file descriptors
pointed at the run's engines.log while an engine starts (through a pipe whose reader removes every
secret), the terminal kept for this process's own output meanwhile, and a stream on that log for an
engine's own loggers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import threading
from pathlib import Path
from typing import Iterable

from ..definition.pipeline import REDACTED


@contextlib.contextmanager
def process_output_to(path: Path):
    """Point this process's stdout and stderr file descriptors at `path` while an engine starts, so
    the processes it launches (a JVM, Ray's daemons, Dask's workers) write their chatter there for
    good instead of over the progress display. Python-level streams are left alone. Nothing is
    redacted: a run uses EngineOutput, which is."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with _standard_fds_to(target):
            yield
    finally:
        os.close(target)


@contextlib.contextmanager
def _standard_fds_to(target: int):
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


class EngineOutput:
    """A run's engines.log, fed through a pipe. The processes an engine launches while `redirected()`
    inherit the pipe as their stdout and stderr for good (a Spark JVM, Dask workers: a UDF's or a
    task's exception text lands there), and a thread of this process removes every secret before the
    bytes reach the file, so a value from ${env:...} is never on disk in clear. The file is the
    owner's only (0600) and is created on the first redirect. The thread drains the pipe as fast as
    engines write (a writer never blocks for long), and close() ends it once every writer is gone."""

    PIPE_BYTES = 2**20  # a larger pipe: a burst of output never waits for the thread

    def __init__(self, path: Path, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self.secrets = tuple(secrets)
        self._write_end: int | None = None
        self._pump: threading.Thread | None = None

    @contextlib.contextmanager
    def redirected(self):
        """This process's fds 1 and 2 point at the pipe while the block runs (an engine starts)."""
        if self._write_end is None:
            self._open()
        _start_lasting_helpers()
        with _standard_fds_to(self._write_end):
            yield

    def close(self, timeout: float = 10.0) -> bool:
        """Called once the engines are stopped: waits up to `timeout` seconds for the processes that
        still hold the pipe to exit, having written all they wrote. Returns whether the thread ended;
        when a process outlives that (a straggler still shutting down), the thread keeps copying
        until it exits rather than block or break it, and ends by itself. Safe to call twice."""
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None
        pump, self._pump = self._pump, None
        if pump is None:
            return True
        pump.join(timeout)
        return not pump.is_alive()

    def _open(self) -> None:
        log = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(log, 0o600)  # a file left by an earlier version, or made under a lax umask
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # Linux only; the default pipe still works
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, self.PIPE_BYTES)
        self._write_end = write_end
        self._pump = threading.Thread(target=_copy_redacted, args=(read_end, log, StreamRedactor(self.secrets)),
                                      name=f"hybridflow-engine-output-{self.path.parent.parent.name}", daemon=True)
        self._pump.start()


class TerminalStreams:
    """sys.stdout and sys.stderr on copies of fds 1 and 2, until restore(): while engines start in
    the background, fds 1 and 2 point at engines.log (for the processes they launch), and this
    process's own output must still reach the terminal. Output already buffered is flushed first."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _copy_of(sys.stdout, 1)
        sys.stderr = _copy_of(sys.stderr, 2)

    def restore(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = self._saved


def engine_output_stream():
    """A text stream on a copy of this process's stderr as it is now: called during an engine's
    start, while the runner points fd 2 at engines.log, it is where the engine's own chatter from
    this process (its loggers) goes for good. Line buffered; the caller closes it at stop."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")


def _copy_of(stream, fd: int):
    """A text stream like `stream` writing to a duplicate of `fd` (line buffered, as a terminal is)."""
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                     errors=getattr(stream, "errors", None) or "strict")


def _start_lasting_helpers() -> None:
    """Start now, with this process's own stdout and stderr, the helpers that outlive every engine:
    started during a redirect they would hold the pipe until the interpreter exits and close() could
    never see its end. multiprocessing's resource tracker is one (Dask's worker processes start it)."""
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):
        resource_tracker.ensure_running()


def _copy_redacted(read_end: int, log: int, redactor: StreamRedactor) -> None:
    """The pipe to the file until every writer has closed it. Never raises: whatever goes wrong, it
    keeps reading, so a writer can never block on a full pipe (this thread's own stderr may be the
    pipe, so it cannot report either)."""
    try:
        while data := os.read(read_end, 2**16):
            _write_all(log, redactor.feed(data))
        _write_all(log, redactor.flush())
    except BaseException:  # nothing can be reported: read on, discarding
        with contextlib.suppress(BaseException):
            while os.read(read_end, 2**16):
                pass
    finally:
        for fd in (read_end, log):
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a full disk loses log text, never blocks the engines
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


class StreamRedactor:
    """Replaces secrets in a byte stream that arrives in arbitrary pieces: what it returns, joined, is
    the whole stream with every secret replaced (at each position the longest secret that matches
    wins). A tail that could be the start of a secret is held back until the next piece decides."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(s) for s in self.secrets)) if self.secrets else None
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be written now, redacted."""
        text = self._held + data
        if self._pattern is None:
            return text
        partial = self._partial_starts(text)  # where a secret may begin that the next piece completes
        out, pos = [], 0
        for match in self._pattern.finditer(text):
            stop = next((p for p in partial if pos <= p <= match.start()), None)
            if stop is not None:  # a longer secret may start there: decide when more has come
                break
            out += [text[pos:match.start()], REDACTED.encode()]
            pos = match.end()
        stop = next((p for p in partial if p >= pos), len(text))
        self._held = text[stop:]
        return b"".join([*out, text[pos:stop]])

    def flush(self) -> bytes:
        """The held-back tail, at the end of the stream."""
        held, self._held = self._held, b""
        return self._pattern.sub(REDACTED.encode(), held) if self._pattern else held

    def _partial_starts(self, text: bytes) -> list[int]:
        """Positions, in order, from which the rest of `text` is a proper prefix of some secret."""
        first = max(len(text) - len(self.secrets[0]) + 1, 0)
        return [i for i in range(first, len(text))
                if any(len(s) > len(text) - i and s.startswith(text[i:]) for s in self.secrets)]
