"""A run's events, told to whoever subscribes: the runner emits each one once (run started, engine
started, a stage's state changed, run finished, the display closed) and calls no subscriber itself.
The run's records (records.py), its report, their copy in object storage, the caller's listener and
the notifications (ops/notify.py, added by the API) subscribe, in that order: each sees what those
before it did (the report reads the final record; a notification links the report)."""

from __future__ import annotations

from typing import Iterable

from ..results import Listener, RunResult, StageResult


class RunEvents(Listener):
    def __init__(self, subscribers: Iterable[Listener]) -> None:
        self.subscribers = tuple(subscribers)

    def resuming(self, run_id: str, status: str) -> None:
        for subscriber in self.subscribers:
            subscriber.resuming(run_id, status)

    def nothing_to_resume(self, reason: str) -> None:
        for subscriber in self.subscribers:
            subscriber.nothing_to_resume(reason)

    def notified(self, delivery) -> None:
        for subscriber in self.subscribers:
            subscriber.notified(delivery)

    def close(self) -> None:
        for subscriber in self.subscribers:
            subscriber.close()

    def run_started(self, run_id: str, stages: list[StageResult]) -> None:
        for subscriber in self.subscribers:
            subscriber.run_started(run_id, stages)

    def engine_started(self, backend: str, seconds: float) -> None:
        for subscriber in self.subscribers:
            subscriber.engine_started(backend, seconds)

    def stage_changed(self, stage: StageResult) -> None:
        for subscriber in self.subscribers:
            subscriber.stage_changed(stage)

    def run_finished(self, result: RunResult) -> None:
        for subscriber in self.subscribers:
            subscriber.run_finished(result)
