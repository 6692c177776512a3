"""Progress inside a running stage: a thread asks the stage's backend what its engine is doing (about
once a second) and keeps the answer on the stage's result, where the display reads it. A backend that
fails to answer, or answers slowly, never slows or breaks the stage: its phrase is just missing."""

from __future__ import annotations

import contextlib
import logging
import threading

from ..backends.base import Backend
from ..results import StageResult

POLL_SECONDS = 1.0


@contextlib.contextmanager
def watched(backend, result: StageResult, every: float = POLL_SECONDS):
    """While the block runs, result.progress holds the backend's latest progress phrase (or None)."""
    if type(backend).progress is Backend.progress:
        yield  # the engine says nothing (python): no thread
        return
    stop = threading.Event()
    thread = threading.Thread(target=_poll, args=(backend, result, stop, every), daemon=True,
                              name=f"hybridflow-progress-{result.name}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every)  # a poll stuck in the engine is left to end by itself (a daemon)
        result.progress = None


def _poll(backend, result: StageResult, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        phrase = asked(backend)
        if not stop.is_set():
            result.progress = phrase


def asked(backend) -> str | None:
    """The backend's progress phrase; None when it has none or failed to give one."""
    try:
        phrase = backend.progress()
    except BaseException as exc:  # an engine shutting down (Ray's raises SystemExit), a scheduler busy
        logging.getLogger("hybridflow").debug("progress of %s: %s", backend.name, exc)
        return None
    return phrase if isinstance(phrase, str) and phrase else None

