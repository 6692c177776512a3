"""Work sent to a tracker from one background thread through a bounded queue, so that a tracker
that is slow, down or unreachable never fails or slows a run: calls that do not fit are dropped,
each failure is counted, and the run's end waits for what is queued only up to a deadline."""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

QUEUE_SIZE = 1000


class Sender:
    def __init__(self, what: str, redact: Callable[[str], str], size: int = QUEUE_SIZE) -> None:
        self.what = what  # "OpenLineage events", in the warning a failure ends with
        self.redact = redact  # secrets of the pipeline (an API key, a token in a URL) never shown
        self.failed = 0
        self.dropped = 0
        self.first_error: str | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._thread = threading.Thread(target=self._work, name=f"hybridflow-{what}", daemon=True)
        self._thread.start()

    def send(self, call: Callable[[], object]) -> None:
        """Queue `call`; when the queue is full it is dropped (and counted), never waited for."""
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            self.dropped += 1

    def finish(self, seconds: float) -> str | None:
        """Wait up to `seconds` for what is queued to go out, then stop; the one warning line a
        run ends with when anything was not delivered, else None."""
        self.send(None)  # the thread's end
        deadline = time.monotonic() + seconds
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = self._queue.qsize() if self._thread.is_alive() else 0
        lost = self.failed + self.dropped + left
        if not lost:
            return None
        reason = f": {self.first_error}" if self.first_error else " in time"
        return self.redact(f"{lost} {self.what} not delivered{reason}")

    def drained(self, seconds: float) -> bool:
        """Whether the thread has ended, told to end after what is queued and given up to `seconds`."""
        if self._thread.is_alive():
            self.send(None)
        self._thread.join(seconds)
        return not self._thread.is_alive()

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - any failure of a tracker only costs its record
                self.failed += 1
                if self.first_error is None:
                    self.first_error = _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
