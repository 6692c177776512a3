"""The run's records as subscribers of its events (events.py): its row in the run store from
"running" to its end and each stage's row as it changes (RunRecords), its HTML report once the record
is final (RunReport), and in a workdir in object storage, both copied there (RunPush)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from ..definition.pipeline import Pipeline
from ..errors import HybridflowError, first_line
from ..results import Listener, RunResult, StageResult, now


class _HeldOpen:
    """The run store's connection that a run keeps open (RunStore.held_open), closed around every
    fork of this process: SQLite's locks are per process, and a child forked with a connection open
    would believe it holds its parent's locks (the child of a python stage with a timeout records
    its steps in runs.db too)."""

    everywhere: set[_HeldOpen] = set()

    def __init__(self, store) -> None:
        self.store = store
        self.connection = store.held_open()
        _HeldOpen.everywhere.add(self)

    def close(self) -> None:
        _HeldOpen.everywhere.discard(self)
        self._let_go()

    def _let_go(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def _take_again(self) -> None:
        with contextlib.suppress(Exception):  # a store that cannot be opened now only costs checkpoints
            self.connection = self.store.held_open()

    @classmethod
    def before_fork(cls) -> None:
        for held in list(cls.everywhere):
            held._let_go()

    @classmethod
    def after_fork_in_parent(cls) -> None:
        for held in list(cls.everywhere):
            held._take_again()

    @classmethod
    def after_fork_in_child(cls) -> None:
        cls.everywhere.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_HeldOpen.before_fork, after_in_parent=_HeldOpen.after_fork_in_parent,
                        after_in_child=_HeldOpen.after_fork_in_child)


class RunRecords(Listener):
    def __init__(self, pipeline: Pipeline, store, stages: list[str], workspace) -> None:
        self.pipeline, self.store, self.stages, self.workspace = pipeline, store, stages, workspace
        self.record: dict[str, Any] | None = None  # the run's row, once open() made it
        self._held: _HeldOpen | None = None  # the store kept open from open() to the run's end

    def open(self, run_id: str, run_dir: Path, started: datetime, trigger: str, arguments: dict) -> dict[str, Any]:
        """The run recorded as running. The pipeline's lock is held: any other "running" run of it is
        dead (in a workdir in object storage, its record says so there too)."""
        self._held = _HeldOpen(self.store)
        for abandoned in self.store.mark_abandoned(self.pipeline.name, now()):
            self.push(abandoned)
        self.record = {"run_id": run_id, "pipeline": self.pipeline.name, "pipeline_file": str(self.pipeline.file),
                       "trigger": trigger, "started_at": started.isoformat(timespec="milliseconds"),
                       "run_dir": str(run_dir), "arguments": json.dumps(arguments),
                       "scheduled_for": self.pipeline.run_moment().isoformat(timespec="seconds"),
                       "calendar": json.dumps(self.pipeline.calendar) if self.pipeline.calendar else None}
        self.store.save_run(**self.record, status="running")
        self.push(run_id)  # seen from other machines as running, and marked killed if it dies
        return self.record

    def end(self, status: str, error: str | None) -> None:
        """The run's row final: `error` already redacted (a run that failed before or outside its stages)."""
        try:
            self.store.save_run(**self.record, status=status, ended_at=now(), error=error)
        finally:
            if self._held is not None:
                self._held.close()  # the one checkpoint of the run's writes
                self._held = None

    def stage_changed(self, result: StageResult) -> None:
        if self.record is None:
            return
        self.store.save_stage(
            run_id=self.record["run_id"], stage=result.name, backend=result.backend, status=result.status,
            duration=result.duration, engine_start=result.engine_start, rows_in=result.rows_in,
            bytes_in=result.bytes_in, rows_out=result.rows_out, bytes_out=result.bytes_out,
            skip_reason=result.reason, error=result.error, log_path=result.log_path, fingerprint=result.fingerprint,
            outputs=json.dumps(result.outputs) if result.outputs else None, position=self.stages.index(result.name),
            gpu=result.gpu, gpu_reason=result.gpu_reason, attempts=result.attempts,
            engine_work=json.dumps(result.engine_work) if result.engine_work is not None else None,
            checks=json.dumps(result.checks, default=str) if result.checks else None)

    def run_finished(self, result: RunResult) -> None:
        self.end(result.status, self.pipeline.redact(result.error.one_line()) if result.error else None)

    def push(self, run_id: str, run_dir: Path | None = None) -> None:
        """A workdir in object storage holds the run's record (and, at its end, its logs and report):
        a store that does not take them costs other machines the record, never the run."""
        if self.workspace.remote is None:
            return
        try:
            self.workspace.push(self.store, run_id, run_dir)
        except HybridflowError as exc:
            logging.getLogger("hybridflow").warning("the run's record was not saved to %s: %s",
                                                    self.workspace.remote.uri, exc.one_line())


class RunReport(Listener):
    """The run's report.html, written once its record is final; one that cannot be written never
    fails the run."""

    def __init__(self, pipeline: Pipeline, store, workspace) -> None:
        self.pipeline, self.store, self.workspace = pipeline, store, workspace

    def run_finished(self, result: RunResult) -> None:
        if not self.pipeline.spec.report:
            return
        from ..reporting import htmlreport

        try:
            run = self.store.run(result.run_id)
            htmlreport.write(self.store, run, pipeline=self.pipeline, catalog=self.workspace.published_by(run))
        except Exception as exc:  # noqa: BLE001
            logging.getLogger("hybridflow").warning("the run's report was not written: %s", first_line(exc))


class RunPush(Listener):
    """In a workdir in object storage: the final record, logs and report copied there."""

    def __init__(self, records: RunRecords) -> None:
        self.records = records

    def run_finished(self, result: RunResult) -> None:
        self.records.push(result.run_id, result.run_dir)
