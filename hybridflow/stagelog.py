"""Each stage's own log file: its logger and whatever it prints go there, with secrets redacted."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from .pipeline import Pipeline


@contextlib.contextmanager
def stage_log(pipeline: Pipeline, stage: str, path: Path):
    """A logger writing to the stage's own log file (never the terminal), and a stream for what the
    stage prints. Both redact secrets: a stage may log a value that came from ${env:...}."""
    logger = logging.getLogger(f"hybridflow.stage.{pipeline.name}.{stage}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_RedactingFormatter(pipeline))
    logger.addHandler(handler)
    try:
        yield logger, _RedactingStream(handler.stream, pipeline)
    finally:
        logger.removeHandler(handler)
        handler.close()


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
