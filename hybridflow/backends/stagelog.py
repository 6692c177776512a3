"""Each stage's own log file: its logger and whatever it prints go there, with secrets redacted.
A run's directory and its logs are the owner's only (0700 directories, 0600 files): a log can hold
what a stage printed about its data even when no secret is in it."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ..definition.pipeline import Pipeline


@contextlib.contextmanager
def stage_log(pipeline: Pipeline, stage: str, path: Path):
    """A logger writing to the stage's own log file (never the terminal), and a stream for what the
    stage prints. Both redact secrets: a stage may log a value that came from ${env:...}."""
    logger = logging.getLogger(f"hybridflow.stage.{pipeline.name}.{stage}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    private_file(path)
    handler = _QuietFileHandler(path, encoding="utf-8")
    handler.setFormatter(_RedactingFormatter(pipeline))
    logger.addHandler(handler)
    try:
        yield logger, _RedactingStream(handler.stream, pipeline)
    finally:
        logger.removeHandler(handler)
        handler.close()


def private_dir(path: Path) -> Path:
    """`path` and every missing directory above it, made with mode 0700 (an existing one is left as
    it is). Returns `path`."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            directory.mkdir(mode=0o700)
            os.chmod(directory, 0o700)  # mkdir's mode is narrowed by the umask; 0700 is meant
    return path


def private_file(path: Path) -> Path:
    """`path`, created empty if missing, readable and writable by its owner only."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(path, 0o600)
    return path


class _QuietFileHandler(logging.FileHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        """A line that cannot be written (a full disk) is lost, never a traceback on the terminal: the
        run reports the full disk itself."""


class _RedactingFormatter(logging.Formatter):
    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")
        self.pipeline = pipeline

    def format(self, record: logging.LogRecord) -> str:
        return self.pipeline.redact(super().format(record))


class _RedactingStream:
    """Stands in for stdout/stderr while a stage runs."""

    def __init__(self, stream, pipeline: Pipeline) -> None:
        self.stream, self.pipeline = stream, pipeline

    def write(self, text: str) -> int:
        self.stream.write(self.pipeline.redact(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str):
        return getattr(self.stream, name)  # encoding, fileno, ...: what libraries ask of sys.stdout
