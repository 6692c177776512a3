"""What a run is asked for (its selection and options) and what it reports: each stage's result, the
run's result, and the Listener that hears about progress (the CLI draws it; hybridflow.run takes one)."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from .errors import HybridflowError


@dataclass
class Selection:
    only: Sequence[str] = ()
    start: Sequence[str] = ()  # --from
    end: Sequence[str] = ()  # --to


@dataclass(frozen=True)
class RunOptions:
    """How one run was asked for, beyond its pipeline: made once (by hybridflow.run, or by a watch
    session for each of its runs) and read where the run uses it, never spread over signatures."""

    selection: Selection = field(default_factory=Selection)  # --only/--from/--to
    force: bool | set[str] = False  # stages run though unchanged: every one (True) or these
    keep_going: bool = False  # a failed stage stops only the stages below it
    wait_for_lock: bool = False  # wait for the run holding the pipeline's lock instead of failing
    trigger: str = "manual"  # manual | cron | backfill
    # the CLI's: a run ended around a stage stuck in native code, or one past its stop deadline, ends
    # this process with the error's code; a library caller's gets the error raised instead
    exit_when_stuck: bool = False
    scheduled_for: datetime | None = None  # the time the run is for (its cron tick, --for); None: the minute it starts
    arguments: dict[str, Any] = field(default_factory=dict)  # as recorded for --resume: secrets as ${env:...}


@dataclass
class StageResult:
    name: str
    backend: str
    status: str = "waiting"  # waiting | running | done | failed | skipped (up to date) | not run
    started_at: float | None = None
    duration: float | None = None
    engine_start: float | None = None  # seconds this stage waited for its engine to start, when it took it first
    rows_in: int | None = None
    bytes_in: int | None = None
    rows_out: int | None = None
    bytes_out: int | None = None
    error: str | None = None
    reason: str | None = None  # why it ran, was skipped or was not run
    fingerprint: str | None = None
    attempts: int | None = None  # tries made (retries + 1 at most)
    log_path: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)  # dataset -> published version
    gpu: bool | None = None  # ran on the GPU (gpu: true or auto); None: the stage never asked for one
    gpu_reason: str | None = None  # why it ran where it did
    progress: str | None = None  # while running: what its engine is doing ("job 2 · tasks 120/200")
    # engine work (Spark jobs, Dask task graphs, Ray Data executions) run while reading, calling the
    # function and publishing; None where the engine does not count it
    engine_work: dict[str, int] | None = None
    checks: dict[str, list[dict]] = field(default_factory=dict)  # output -> its data checks' outcomes


@dataclass
class RunResult:
    run_id: str
    pipeline: str
    status: str  # success | failed | interrupted
    stages: dict[str, StageResult]
    engines: dict[str, float]  # backend -> start-up seconds
    started_at: str
    duration: float
    run_dir: Path
    resume_command: str | None = None
    error: HybridflowError | None = None
    warnings: list[str] = field(default_factory=list)  # what went wrong without failing the run
    workdir_uri: str | None = None  # the workdir in object storage (run_dir is its cache here); None: a local one

    @property
    def failed(self) -> list[StageResult]:
        return [s for s in self.stages.values() if s.status == "failed"]

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def exit_code(self) -> int:
        """What `hybridflow run` exits with for this run."""
        return 0 if self.error is None else int(self.error.exit_code)

    def raise_for_status(self) -> RunResult:
        """Raise the run's error (a StageError, StageTimeout, InterruptedRun...) unless it succeeded."""
        if self.error is not None:
            raise self.error
        return self


class Listener:
    """Receives progress; the CLI subclasses it to draw. Every method may be left as is."""

    def resuming(self, run_id: str, status: str) -> None:
        """hybridflow.run(resume=True) is repeating run `run_id`, which ended `status`."""

    def nothing_to_resume(self, reason: str) -> None:
        """hybridflow.run(resume=True) found nothing to resume (and returns None)."""

    def notified(self, delivery) -> None:
        """A notification was sent, or failed (a notify.Delivery); a failure never fails the run."""
        if not delivery.ok:
            logging.getLogger("hybridflow").warning("notification by %s failed: %s", delivery.channel,
                                                    delivery.detail)

    def close(self) -> None:
        """The run is over (whatever happened): stop drawing."""

    def run_started(self, run_id: str, stages: list[StageResult]) -> None: ...

    def engine_started(self, backend: str, seconds: float) -> None: ...

    def stage_changed(self, stage: StageResult) -> None: ...

    def run_finished(self, result: RunResult) -> None:
        """Called once the run's record is final, also when a run was ended around a stage stuck in
        native code (the CLI's process exits right after this returns)."""


@dataclass(frozen=True)
class PlannedInput:
    dataset: str
    state: str  # "external" | "published" | "produced in this run" | "missing"
    detail: str


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
