"""Runs a pipeline: plans the stages, starts engines on first use, calls each stage,
publishes its outputs, and always stops what it started.

The runner never prints. It reports progress to a listener (the CLI renders it)
and returns a RunResult; errors come back as hybridflow errors with exit codes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from . import backends, childprocess, gpu, processes, signature
from .backends.base import EngineOutput
from .catalog import Catalog, Version
from .context import StageContext
from .contract import declared_schema, schema_differences
from .errors import (
    ConfigError,
    DataError,
    HybridflowError,
    InterruptedRun,
    StageError,
    StageTimeout,
    UnavailableError,
    counted,
    first_line,
    is_out_of_space,
    out_of_space,
)
from .errorsite import describe_user_error
from .footers import Footers, read_footers
from .incremental import carry_over, partition_key, schema_types
from .lock import RunLock
from .pipeline import Pipeline
from .planner import INCREMENTAL, SKIP, Decision, Planner
from .readerrors import input_read_failure
from .stagecode import import_function, module_file
from .stagelog import private_dir, stage_log
from .state import RunStore
from .tables import TableSource, ensure_schema_file, parquet_files, read_arrow, write_arrow


@dataclass
class Selection:
    only: Sequence[str] = ()
    start: Sequence[str] = ()  # --from
    end: Sequence[str] = ()  # --to


@dataclass
class StageResult:
    name: str
    backend: str
    status: str = "waiting"  # waiting | running | done | failed | skipped (up to date) | not run
    started_at: float | None = None
    duration: float | None = None
    engine_start: float | None = None  # seconds, when this stage was the one that started its engine
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
        """Called once the run's record is final, also when a stage stuck in native code forced the
        process to end (it exits right after this returns)."""


@dataclass(frozen=True)
class Written:
    """A table output written to its staging directory, not yet checked or committed."""

    directory: Path
    schema: pa.Schema


@dataclass(frozen=True)
class PlannedInput:
    dataset: str
    state: str  # "external" | "published" | "produced in this run" | "missing"
    detail: str


# Failures worth another try: the stage's own code (a flaky source), a timeout, an engine that
# could not start or be reached. Config and data-contract errors would fail the same way again.
RETRYABLE = (StageError, StageTimeout, UnavailableError)
MAX_RETRY_DELAY = 600.0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class Runner:
    def __init__(self, pipeline: Pipeline, selection: Selection | None = None, *, keep_going: bool = False,
                 listener: Listener | None = None, wait_for_lock: bool = False, trigger: str = "manual",
                 engines: dict[str, Any] | None = None, force: bool | set[str] = False,
                 arguments: dict[str, Any] | None = None) -> None:
        self.pipeline = pipeline
        self.selection = selection or Selection()
        self.keep_going = keep_going
        self.listener = listener or Listener()
        self.wait_for_lock = wait_for_lock
        self.trigger = trigger
        self.home = pipeline.workdir / pipeline.name
        self.catalog = Catalog(self.home)
        self.store = RunStore(pipeline.workdir / "runs.db")
        self.stages = pipeline.dag.select(self.selection.only, self.selection.start, self.selection.end)
        self.planner = Planner(pipeline, self.catalog, force, runs=self.store)
        self.arguments = arguments or {}  # how the run was asked for, so --resume can ask again
        self._given = dict(engines or {})  # started by the caller: used, never stopped here
        self._engines: dict[str, Any] = {}
        self._engine_seconds: dict[str, float] = {}
        self._engine_output: EngineOutput | None = None  # the run's engines.log, redacted
        self._footers: dict[str, Footers] = {}  # external Parquet inputs' footers, read once per run
        self._signals = _SignalState()
        self._run_id: str | None = None
        self._gpu: gpu.GpuPlan | None = None  # each stage's device, decided in _preflight
        self._live: _LiveRun | None = None  # the run in progress, for a forced end
        self._ending = threading.Lock()  # held by whichever ends the run: the main thread or a forced end
        self._signals.on_stuck = self._end_stuck_run

    @property
    def run_id(self) -> str | None:
        """The id of the run started by run(), even when it failed before returning a result."""
        return self._run_id

    # -- planning -------------------------------------------------------------------------------

    def plan(self) -> dict[str, list[PlannedInput]]:
        """For each selected stage, where each of its inputs will come from."""
        produced_here = {ds for s in self.stages for ds in self.pipeline.stages[s].outputs}
        plan = {}
        for stage in self.stages:
            plan[stage] = [self._plan_input(ds, produced_here) for ds in self.pipeline.stages[stage].inputs]
        return plan

    def decisions(self) -> dict[str, Decision]:
        """What each selected stage would do now: an input an earlier stage will rebuild makes the
        stage run (the runner decides again, on the real inputs, when it gets there)."""
        rebuilt: dict[str, str] = {}
        decisions = {}
        for stage in self.stages:
            decision = self.planner.decide(stage, rebuilt)
            decisions[stage] = decision
            if decision.action != SKIP:
                for ds in self.pipeline.stages[stage].outputs:
                    rebuilt.setdefault(ds, stage)
        return decisions

    def _plan_input(self, dataset: str, produced_here: set[str]) -> PlannedInput:
        if dataset in produced_here:
            return PlannedInput(dataset, "produced in this run", f"by stage {self.pipeline.dag.producer[dataset]}")
        if self.pipeline.is_external(dataset):
            path = self.pipeline.external_path(dataset)
            return PlannedInput(dataset, "external" if path.exists() else "missing", str(path))
        version = self.catalog.current(dataset)
        if version:
            return PlannedInput(dataset, "published", f"version {version.id}")
        return PlannedInput(dataset, "missing", f"never published by stage {self.pipeline.dag.producer[dataset]}")

    def _preflight(self) -> None:
        """Everything that can fail before a stage starts: engines available, inputs present."""
        backends.require_all(self.pipeline.stages[stage].backend for stage in self.stages)
        self._gpu = gpu.plan(self.pipeline, self.stages)  # gpu: true that cannot be met fails here
        for stage, inputs in self.plan().items():
            for item in inputs:
                if item.state != "missing":
                    continue
                if self.pipeline.is_external(item.dataset):
                    raise DataError(f"external input '{item.dataset}' of stage '{stage}' does not exist at "
                                    f"{item.detail}", hint="create it, or fix its path under datasets")
                producer = self.pipeline.dag.producer[item.dataset]
                raise DataError(f"input '{item.dataset}' of stage '{stage}' is not published yet",
                                hint=f"run stage '{producer}' first: hybridflow run {self._file_arg()} "
                                     f"--to {producer}")

    # -- running --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        run_id = self._run_id = new_run_id()
        run_dir = self.home / "runs" / run_id
        results = {s: StageResult(s, self.pipeline.stages[s].backend) for s in self.stages}
        lock = RunLock(self.home / "run.lock")
        try:
            lock.acquire(run_id, wait=self.wait_for_lock)
            try:  # the lock is held until the run's record is final: the next run trusts what it finds
                return self._run_locked(run_id, run_dir, results)
            finally:
                lock.release()
        except Exception as exc:  # the run's record or log could not be written: the disk is full
            if isinstance(exc, HybridflowError) or not is_out_of_space(exc, self.pipeline.workdir):
                raise
            raise out_of_space(self.pipeline.workdir) from exc

    def _run_locked(self, run_id: str, run_dir: Path, results: dict[str, StageResult]) -> RunResult:
        started, clock = datetime.now(timezone.utc), time.monotonic()  # a waiting run starts when it gets the lock
        status, error = "failed", None
        self.store.mark_abandoned(self.pipeline.name, _now())  # we hold the lock: any "running" run is dead
        record = {"run_id": run_id, "pipeline": self.pipeline.name, "pipeline_file": str(self.pipeline.file),
                  "trigger": self.trigger, "started_at": started.isoformat(timespec="milliseconds"),
                  "run_dir": str(run_dir), "arguments": json.dumps(self.arguments)}
        self.store.save_run(**record, status="running")
        self._engine_output = EngineOutput(run_dir / "logs" / "engines.log", self.pipeline.secrets)
        try:
            # Under the lock no other run is writing: whatever is in staging is a dead run's leftovers,
            # and a stage commit a crash interrupted is finished before anything reads the outputs.
            self.catalog.discard_staging()
            self.catalog.recover()
            try:
                self._preflight()
            except HybridflowError as exc:  # paths and addresses may hold a value from ${env:...}
                exc.message, exc.hint = self.pipeline.redact(exc.message), exc.hint and self.pipeline.redact(exc.hint)
                self.store.save_run(**record, status="failed", error=exc.one_line(), ended_at=_now())
                raise
            private_dir(run_dir / "logs")  # 0700: logs may quote data
            self.listener.run_started(run_id, list(results.values()))
            self._live = _LiveRun(run_dir, results, record, started, clock)
            with _signals_as_exceptions(self._signals):
                try:
                    status, error = self._run_stages(run_id, run_dir, results)
                    self._signals.check()
                finally:
                    self._ending.acquire()  # a forced end under way finishes the run; this thread waits
            if status == "success":
                self._collect_garbage()
        except (KeyboardInterrupt, _Terminated) as exc:
            status = "interrupted"
            error = InterruptedRun(getattr(exc, "signum", signal.SIGINT))
            for result in results.values():
                if result.status == "running":
                    self._finish(result, "failed", error="interrupted")
                elif result.status == "waiting":
                    self._finish(result, "not run", reason="run interrupted")
        except BaseException as exc:  # a bug, or an engine's own exit: the record must not stay "running"
            with contextlib.suppress(Exception):  # where it cannot be written, the next run marks it
                self.store.save_run(**record, status="failed", ended_at=_now(),
                                    error=self.pipeline.redact(f"{type(exc).__name__}: {first_line(exc)}"))
            raise
        finally:
            self._stop_engines()
            self.catalog.discard_staging(run_id)
            self._live = None
            if self._ending.locked():
                self._ending.release()
        result = RunResult(run_id, self.pipeline.name, status, results, dict(self._engine_seconds),
                           started.isoformat(timespec="seconds"), time.monotonic() - clock, run_dir,
                           error=error)
        if status != "success" and result.failed or status == "interrupted":
            result.resume_command = f"hybridflow run {self._file_arg()} --resume"
        self.store.save_run(**record, status=status, ended_at=_now(),
                            error=self.pipeline.redact(error.one_line()) if error else None)
        self.listener.run_finished(result)
        return result

    def _end_stuck_run(self, error: HybridflowError) -> None:
        """The last resort when a stop request or a timeout could not get the main thread back: the
        stage is busy in native code in this process (a numpy call in a Spark stage's driver code),
        which no cancel and no Python signal handler can interrupt. Called from a helper thread:
        ends every process the run started, drops its staging, records the run, reports it, and
        exits this process with the error's code. Published data is safe: no commit is under way
        (a commit defers stop requests), and staging is never read."""
        live = self._live
        if live is None or not self._ending.acquire(blocking=False):
            return  # the main thread is already ending the run
        try:
            for engine in list(self._engines.values()):
                with contextlib.suppress(Exception):
                    engine.abandon()
            processes.end_all()
            sys.stdout, sys.stderr = live.streams  # the stuck stage's own prints went to its log
            for result in live.results.values():
                if result.status == "running":
                    self._finish(result, "failed", error=self.pipeline.redact(error.one_line()))
                elif result.status == "waiting":
                    self._finish(result, "not run", reason="the run was ended")
            self.catalog.discard_staging(self._run_id)
            status = "interrupted" if isinstance(error, InterruptedRun) else "failed"
            run = RunResult(self._run_id, self.pipeline.name, status, live.results, dict(self._engine_seconds),
                            live.started.isoformat(timespec="seconds"), time.monotonic() - live.clock,
                            live.run_dir, resume_command=f"hybridflow run {self._file_arg()} --resume", error=error)
            self.store.save_run(**live.record, status=status, ended_at=_now(),
                                error=self.pipeline.redact(error.one_line()))
            if self._engine_output is not None:
                self._engine_output.close()
            self.listener.run_finished(run)
        finally:
            for stream in live.streams:
                with contextlib.suppress(Exception):
                    stream.flush()  # os._exit skips it: a summary sent to a file or a pipe would be lost
            processes.end_all()  # again: an engine still running in a thread here replaces what died
            os._exit(int(error.exit_code))

    def _collect_garbage(self) -> None:
        """Old versions go after a successful run; failing to remove them never fails the run."""
        try:
            removed = self.catalog.collect_garbage(self.pipeline.spec.keep_versions)
        except (OSError, HybridflowError) as exc:
            logging.getLogger("hybridflow").warning("garbage collection failed: %s", first_line(exc))
            return
        if removed:
            logging.getLogger("hybridflow").info("removed %d old dataset versions", len(removed))

    def _run_stages(self, run_id: str, run_dir: Path, results: dict[str, StageResult]):
        first_error: HybridflowError | None = None
        for stage in self.stages:
            self._signals.check()
            result = results[stage]
            blocked = [p for p in self.pipeline.dag.upstream[stage]
                       if p in results and results[p].status in ("failed", "not run")]
            if blocked:
                self._finish(result, "not run", reason=f"upstream stage '{blocked[0]}' did not finish")
                continue
            if first_error and not self.keep_going:
                self._finish(result, "not run", reason="an earlier stage failed")
                continue
            try:
                try:
                    decision = self.planner.decide(stage)
                except OSError as exc:  # an input changed while it was being hashed
                    raise DataError(f"cannot fingerprint the inputs of stage '{stage}': {exc}",
                                    hint="run again once the input is complete") from exc
                result.reason = decision.reason
                result.fingerprint = decision.fingerprint.digest if decision.fingerprint else None
                if decision.action == SKIP:
                    self._finish(result, "skipped", reason=decision.reason)
                    continue
                self._run_stage(run_id, run_dir, result, decision)
            except HybridflowError as exc:
                first_error = first_error or exc
                self._finish(result, "failed", error=self.pipeline.redact(exc.one_line()))
        return ("failed", first_error) if first_error else ("success", None)

    def _run_stage(self, run_id: str, run_dir: Path, result: StageResult, decision: Decision) -> None:
        spec = self.pipeline.stages[result.name]
        log_path = run_dir / "logs" / f"{result.name}.log"
        result.log_path = str(log_path)
        result.status, result.started_at = "running", time.monotonic()
        self.listener.stage_changed(result)
        self._save_stage(result)
        with stage_log(self.pipeline, result.name, log_path) as (log, log_stream):
            log.info("running: %s", decision.reason)
            attempts = spec.retries + 1
            for attempt in range(1, attempts + 1):
                result.attempts = attempt
                try:
                    self._attempt(run_id, run_dir, result, decision, log, log_stream)
                    break
                except HybridflowError as exc:
                    message = self.pipeline.redact(exc.one_line())
                    if not isinstance(exc, RETRYABLE) or attempt == attempts:
                        log.error("stage failed: %s", message, exc_info=exc)
                        raise
                    delay = min(spec.retry_delay * 2 ** (attempt - 1), MAX_RETRY_DELAY)
                    log.warning("attempt %d of %d failed: %s; retrying in %.1fs", attempt, attempts, message, delay)
                    result.reason = f"attempt {attempt + 1} of {attempts} (after: {message})"
                    self.listener.stage_changed(result)
                    self._save_stage(result)
                    self._wait(delay)
        self._finish(result, "done", reason=decision.reason if result.attempts == 1 else
                     f"{decision.reason}; succeeded on attempt {result.attempts}")

    def _attempt(self, run_id: str, run_dir: Path, result: StageResult, decision: Decision, log: logging.Logger,
                 log_stream) -> None:
        """One try of a stage: engine, call, publish, all within its timeout. A failed try leaves no
        staging behind (on a full disk, that is the space the run needs to record itself)."""
        try:
            self._try_stage(run_id, run_dir, result, decision, log, log_stream)
        except Exception as exc:
            self.catalog.discard_staging(run_id)
            if isinstance(exc, HybridflowError) or not is_out_of_space(exc, self.home):
                raise
            raise out_of_space(self.home) from exc

    def _try_stage(self, run_id: str, run_dir: Path, result: StageResult, decision: Decision,
                   log: logging.Logger, log_stream) -> None:
        spec = self.pipeline.stages[result.name]
        started_engines = set(self._engine_seconds)
        backend = self._engine(spec.backend, run_dir)
        if spec.backend not in started_engines:
            result.engine_start = self._engine_seconds.get(spec.backend)
        result.gpu, result.gpu_reason = self._gpu.start_stage(result.name, backend, self._engines.values(), log)
        result.rows_in, result.bytes_in = self._input_size(spec.inputs)
        self._signals.check()
        self._signals.running = backend
        try:
            with _time_limit(spec.timeout, backend, result.name, self._end_stuck_run):
                if decision.action == INCREMENTAL and not decision.changes.changed:
                    produced = {}  # partitions were only removed: nothing to compute
                else:
                    produced = self._produce(run_id, result, backend, log, log_stream, decision)
                self._signals.check()
                prepared = self._prepare_outputs(run_id, result, backend, produced, log, decision)
        except StageTimeout:
            # The engine may still hold the stage's work (a Ray task, a Spark job that ignored the
            # cancel): a fresh engine for whatever comes next is the one sure way to be rid of it.
            self._drop_engine(spec.backend)
            raise
        finally:
            self._signals.running = None
        self._commit_outputs(result, prepared)

    def _wait(self, seconds: float) -> None:
        """Sleep before a retry, still answering SIGINT/SIGTERM at once."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._signals.check()
            time.sleep(min(left, 0.2))

    def _produce(self, run_id: str, result: StageResult, backend, log: logging.Logger, log_stream,
                 decision: Decision) -> dict[str, Any]:
        """The stage's outputs: frames from the engine or, for a stage with a timeout on an engine whose
        stages can run in a child process (python, off the GPU), the outputs that child already wrote
        (see childprocess). Only with a timeout: a child forked from a process that has run engines
        in it is not free of risk, and without a timeout a stop request that cannot interrupt the
        stage ends the run around it instead (_end_stuck_run)."""
        timeout = self.pipeline.stages[result.name].timeout
        if not (timeout and backend.isolated_calls and not backend.stage_on_gpu and childprocess.available()):
            return self._call(run_id, result, backend, log, log_stream, decision)

        def call_and_write() -> dict[str, Written]:
            frames = self._call(run_id, result, backend, log, log_stream, decision)
            return {ds: self._write(run_id, result.name, ds, backend, frame, log) for ds, frame in frames.items()}

        return childprocess.call_in_child(call_and_write, streams=[log_stream])

    def _call(self, run_id: str, result: StageResult, backend, log: logging.Logger, log_stream,
              decision: Decision) -> dict[str, Any]:
        spec = self.pipeline.stages[result.name]
        params = self.pipeline.params_for(result.name)
        try:
            fn = import_function(self.pipeline.root, spec.run)
        except HybridflowError:
            raise
        except Exception as exc:  # the user's module raised while being imported
            raise self._user_error(exc, log) from exc
        parameters = signature.from_callable(fn)
        problems = signature.call_problems(parameters, spec.inputs, params)
        if problems:
            raise ConfigError(f"cannot call {spec.run}: {problems[0]}")
        only = {}
        if decision.action == INCREMENTAL:  # the partitioned input: its new or changed partitions only
            only[self.planner.partitioned_input(result.name)] = set(decision.changes.changed)
        inputs = {ds: self._read(run_id, ds, backend, only.get(ds)) for ds in spec.inputs}
        files_dirs = {ds: self.catalog.new_staging(run_id, ds)
                      for ds in spec.outputs if self.pipeline.dataset(ds).kind == "files"}
        previous = {ds: getattr(self.catalog.current(ds), "directory", None) for ds in files_dirs}
        ctx = StageContext(self.pipeline.name, result.name, run_id, spec.backend, params, log,
                           files_dirs, backend.handles(), previous)
        kwargs = signature.call_arguments(parameters, inputs, params, ctx)
        log.info("calling %s with %s", spec.run, ", ".join(kwargs) or "no arguments")
        try:
            # What a stage prints goes to its log file, so it cannot garble the progress display.
            with contextlib.redirect_stdout(log_stream), contextlib.redirect_stderr(log_stream):
                returned = fn(**kwargs)
        except (KeyboardInterrupt, _Terminated):
            raise
        except Exception as exc:
            raise self._user_error(exc, log, result.name) from exc
        return self._outputs_of(result.name, returned, backend)

    def _read(self, run_id: str, dataset: str, backend, partitions: set[str] | None = None) -> Any:
        """An input as the engine's frame; `partitions`: read only these (incremental stages)."""
        ds = self.pipeline.dataset(dataset)
        if self.pipeline.is_external(dataset):
            path = self.pipeline.external_path(dataset)
            if ds.kind == "files":
                return path
            if ds.format == "parquet":  # one clear error for a bad file, whichever engine reads it
                self._external_footers(dataset)
            source = self._external_source(run_id, dataset, path, backend, partitions)
        else:
            version = self.catalog.current(dataset)
            if ds.kind == "files":
                return version.directory
            source = version.source()
            if partitions is not None:
                source = _only_partitions(source, partitions)
        try:
            return backend.read(source)
        except (KeyboardInterrupt, _Terminated, HybridflowError):
            raise
        except Exception as exc:
            raise DataError(f"{backend.name} cannot read input '{dataset}': {first_line(exc)}") from exc

    def _external_source(self, run_id: str, dataset: str, path: Path, backend,
                         partitions: set[str] | None = None) -> TableSource:
        """An external table as the engine will read it. Text formats, and any external input with a
        declared schema, are read, checked and typed once by pyarrow and handed to the engines as
        staged Parquet, so every engine sees the same columns and types (the python backend reads
        the checked table directly)."""
        ds = self.pipeline.dataset(dataset)
        declared = declared_schema(ds.schema_)
        schema = pa.schema(list(declared.items())) if declared else None
        source = TableSource(dataset, (path,), ds.format, schema, tuple(ds.partition_by), path)
        if partitions is not None:
            source = _only_partitions(source, partitions, sorted(path.rglob("*.parquet")))
        if not backends.engine(backend.name).starts or (ds.format == "parquet" and schema is None):
            return source
        table = read_arrow(source)
        staged = self.catalog.new_staging(run_id, f"input-{dataset}")
        write_arrow(table, staged, source.partition_by)
        return TableSource(dataset, tuple(sorted(staged.rglob("*.parquet"))), "parquet", table.schema,
                           source.partition_by, staged)

    def _outputs_of(self, stage: str, returned: Any, backend) -> dict[str, Any]:
        """The stage's table outputs by name, checked against what it declared."""
        spec = self.pipeline.stages[stage]
        tables = [ds for ds in spec.outputs if self.pipeline.dataset(ds).kind == "table"]
        if isinstance(returned, dict):
            unknown = [k for k in returned if k not in spec.outputs]
            if unknown:
                raise StageError(f"stage '{stage}' returned '{unknown[0]}', which is not one of its outputs "
                                 f"({', '.join(spec.outputs) or 'none'})")
            frames = {k: v for k, v in returned.items() if k in tables}
        elif returned is None:
            frames = {}
        elif len(tables) == 1:
            frames = {tables[0]: returned}
        else:
            raise StageError(f"stage '{stage}' returned a {type(returned).__name__}; with "
                             f"{len(tables)} table outputs it must return a dict keyed by output name")
        missing = [ds for ds in tables if ds not in frames]
        if missing:
            raise StageError(f"stage '{stage}' did not return its output '{missing[0]}'",
                             hint="return the frame, or a dict keyed by output name")
        for name, frame in frames.items():
            if not backend.is_frame(frame):
                raise StageError(f"stage '{stage}' returned a {type(frame).__name__} for output '{name}'; "
                                 f"the {backend.name} backend writes {backend.frame_types}")
        return frames

    def _prepare_outputs(self, run_id: str, result: StageResult, backend, frames: dict[str, Any],
                         log: logging.Logger, decision: Decision) -> list[Version]:
        """Write and check every output first (committing comes after): an output that breaks its
        contract leaves every dataset of the stage as it was."""
        spec = self.pipeline.stages[result.name]
        inputs = {ds: self._input_version(ds) for ds in spec.inputs}
        prepared: list[Version] = []
        try:
            for dataset in spec.outputs:
                prepared.append(self._prepare(run_id, result.name, dataset, backend, frames, inputs, log, decision))
        except BaseException:
            for version in prepared:  # never to be committed: nothing of the try stays in versions/
                self.catalog.discard(version)
            raise
        return prepared

    def _commit_outputs(self, result: StageResult, prepared: list[Version]) -> None:
        """Point every output at its new version, all together. A stop request before this leaves
        everything as it was; one that arrives during it waits until all the outputs are committed."""
        self._signals.check()
        with self._signals.deferred():
            self.catalog.commit_together(prepared)
        result.outputs.update({version.dataset: version.id for version in prepared})
        tables = [v.rows for v in prepared if v.rows is not None]
        result.rows_out = sum(tables) if tables else None
        result.bytes_out = sum(v.bytes for v in prepared)

    def _prepare(self, run_id: str, stage: str, dataset: str, backend, frames: dict[str, Any],
                 inputs: dict[str, str], log: logging.Logger, decision: Decision) -> Version:
        ds = self.pipeline.dataset(dataset)
        partition_by = tuple(ds.partition_by)
        written = None
        if ds.kind == "files":
            staging = self.catalog.staging_root() / run_id / dataset
        elif dataset in frames:
            output = frames[dataset]
            if not isinstance(output, Written):
                output = self._write(run_id, stage, dataset, backend, output, log)
            staging, written = output.directory, output.schema
        else:
            staging = self.catalog.new_staging(run_id, dataset)
        if decision.action == INCREMENTAL:
            previous = decision.previous[dataset]
            if written is not None and previous.schema is not None:
                drift = schema_differences(dict(zip(previous.schema.names, previous.schema.types)), written)
                if drift:  # new partitions cannot sit beside the kept ones
                    raise DataError(f"incremental output '{dataset}' changed schema against its kept partitions: "
                                    f"{'; '.join(drift)}", hint=f"reprocess every partition: hybridflow run "
                                                                 f"{self._file_arg()} --force {stage}")
            written = written or previous.schema
            carry_over(dataset, staging, previous.directory, previous.manifest, decision.changes, partition_by,
                       schema_types(written))
            ensure_schema_file(staging, written, partition_by)  # every partition removed: still a schema
            log.info("output %s: %s written, %d carried over, %d removed", dataset,
                     counted(len(decision.changes.changed), "partition"), len(decision.changes.unchanged),
                     len(decision.changes.removed))
        return self.catalog.prepare(dataset, staging, kind=ds.kind, stage=stage, run_id=run_id, inputs=inputs,
                                    declared=declared_schema(ds.schema_), partition_by=partition_by,
                                    written=written,
                                    fingerprint=decision.fingerprint.record() if decision.fingerprint else None)

    def _write(self, run_id: str, stage: str, dataset: str, backend, frame: Any, log: logging.Logger) -> Written:
        staging = self.catalog.new_staging(run_id, dataset)
        try:
            return Written(staging, backend.write(frame, staging, tuple(self.pipeline.dataset(dataset).partition_by)))
        except (KeyboardInterrupt, _Terminated, HybridflowError):
            raise
        except Exception as exc:  # engines compute lazily: the stage's own code fails here
            raise self._user_error(exc, log, stage) from exc

    def _input_size(self, datasets: list[str]) -> tuple[int | None, int | None]:
        """Rows and bytes a stage reads: from manifests; an external input counts its bytes only."""
        rows, size = 0, 0
        for dataset in datasets:
            if self.pipeline.is_external(dataset):
                size += sum(f.stat().st_size for f in external_files(self.pipeline.external_path(dataset)))
                ds = self.pipeline.dataset(dataset)
                countable = ds.kind == "table" and ds.format == "parquet"
                rows = None if rows is None or not countable else rows + self._external_footers(dataset).rows
            else:
                version = self.catalog.current(dataset)
                size += version.bytes
                rows = None if rows is None or version.rows is None else rows + version.rows
        return rows, size

    def _external_footers(self, dataset: str) -> Footers:
        """An external Parquet input's footers, checked; read once per run (a stage counts its rows
        from them before it reads the input, and several stages may read one input)."""
        if dataset not in self._footers:
            path = self.pipeline.external_path(dataset)
            self._footers[dataset] = read_footers(dataset, parquet_files(TableSource(dataset, (path,))))
        return self._footers[dataset]

    def _input_version(self, dataset: str) -> str:
        if self.pipeline.is_external(dataset):  # the content digest the stage's fingerprint used
            return f"external:{self.planner.input_digest(dataset)[:16]}"
        version: Version | None = self.catalog.current(dataset)
        return version.id if version else "unknown"

    def _user_error(self, exc: BaseException, log: logging.Logger, stage: str | None = None) -> HybridflowError:
        """The user's exception as one line located in the user's own file, not an engine's wrapper;
        an input the engine could not decode while the stage ran is a data error instead."""
        log.error("the stage raised:\n%s", "".join(traceback.format_exception(exc)))
        if is_out_of_space(exc):
            return out_of_space(self.home)
        if stage is not None:
            inputs = {ds: self._input_paths(ds) for ds in self.pipeline.stages[stage].inputs}
            unreadable = input_read_failure(exc, inputs)
            if unreadable is not None:
                return unreadable
        return StageError(self.pipeline.redact(describe_user_error(exc, self.pipeline.root)))

    def _input_paths(self, dataset: str) -> list[Path]:
        if self.pipeline.is_external(dataset):
            return [self.pipeline.external_path(dataset)]
        version = self.catalog.current(dataset)
        return [version.directory] if version else []

    # -- engines --------------------------------------------------------------------------------

    def _engine(self, name: str, run_dir: Path):
        """Start an engine the first time a stage needs it; reuse it for the rest of the run."""
        if name in self._given:
            return self._given[name]
        if name not in self._engines:
            engine = backends.create(name, getattr(self.pipeline.spec.backends, name, None), run_dir / "logs",
                                     gpu=self._gpu.engine(name) if self._gpu else None,
                                     secrets=self.pipeline.secrets)
            clock = time.monotonic()
            self._engines[name] = engine  # stopped at the end even if it only half started
            try:
                with self._engine_output.redirected():
                    engine.start(self._stage_code())
                self._signals.reclaim()
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    engine.stop()
                del self._engines[name]  # a later stage (--keep-going) tries again rather than reuse it
                if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
                    # SIGTERM while ray.init's own handler was in place: it exits; we stop cleanly
                    self._signals.signum = signal.SIGTERM
                    raise _Terminated(signal.SIGTERM) from None
                raise
            if backends.engine(name).starts:  # an in-process engine starts nothing
                self._engine_seconds[name] = time.monotonic() - clock
                self.listener.engine_started(name, self._engine_seconds[name])
        return self._engines[name]

    def _stage_code(self) -> list[Path]:
        """The top-level packages (or module files) under root that hold the stages' functions."""
        tops = {self.pipeline.stages[s].run.split(":")[0].split(".")[0] for s in self.stages}
        found = [module_file(self.pipeline.root, top) for top in sorted(tops)]
        return [f.parent if f.name == "__init__.py" else f for f in found if f is not None]

    def _drop_engine(self, name: str) -> None:
        engine = self._engines.pop(name, None)
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.stop()

    def _stop_engines(self) -> None:
        # An engine whose stop hangs (a cluster client waiting on workers that died under it) must not
        # hold the run: past STOP_WAIT seconds, every process the run started is killed, which ends
        # the wait.
        watchdog = threading.Timer(STOP_WAIT, processes.end_all)
        watchdog.daemon = True
        watchdog.start()
        try:
            for engine in self._engines.values():
                with contextlib.suppress(Exception):
                    engine.stop()
        finally:
            watchdog.cancel()
        self._engines.clear()
        if self._engine_output is not None:  # after the engines: their last words are copied too
            self._engine_output.close()

    # -- helpers --------------------------------------------------------------------------------

    def _finish(self, result: StageResult, status: str, *, error: str | None = None,
                reason: str | None = None) -> None:
        result.status, result.error, result.reason = status, error, reason
        if result.started_at is not None:
            result.duration = time.monotonic() - result.started_at
        self.listener.stage_changed(result)
        self._save_stage(result)

    def _save_stage(self, result: StageResult) -> None:
        if self._run_id is None:
            return
        self.store.save_stage(
            run_id=self._run_id, stage=result.name, backend=result.backend, status=result.status,
            duration=result.duration, engine_start=result.engine_start, rows_in=result.rows_in,
            bytes_in=result.bytes_in, rows_out=result.rows_out, bytes_out=result.bytes_out,
            skip_reason=result.reason, error=result.error, log_path=result.log_path, fingerprint=result.fingerprint,
            outputs=json.dumps(result.outputs) if result.outputs else None, position=self.stages.index(result.name),
            gpu=result.gpu, gpu_reason=result.gpu_reason, attempts=result.attempts)

    def _file_arg(self) -> str:
        try:
            return str(self.pipeline.file.relative_to(Path.cwd()))
        except ValueError:
            return str(self.pipeline.file)


def _only_partitions(source: TableSource, partitions: set[str], files: list[Path] | None = None) -> TableSource:
    """The same dataset restricted to some of its partitions (by partition key, e.g. 'week=2026-11-16')."""
    base = source.base or source.files[0]
    types = schema_types(source.schema)
    chosen = tuple(f for f in (files if files is not None else source.files)
                   if partition_key(f.relative_to(base), source.partition_by, types) in partitions)
    return TableSource(source.name, chosen, source.format, source.schema, source.partition_by, base)


def external_files(path: Path) -> list[Path]:
    """The files of an external input given as a file or a directory."""
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


class _TimedOut(BaseException):
    """Raised in the main thread when a stage's timeout fires (BaseException: user code that catches
    Exception cannot swallow it)."""


@contextlib.contextmanager
def _time_limit(seconds: float | None, backend, stage: str, end_run=None):
    """Run the body for at most `seconds`. When time is up, a timer thread asks the engine to cancel
    its work (which unblocks a main thread waiting on it) and interrupts the main thread with
    SIGALRM; any way the body then ends becomes a StageTimeout. A body that still has not ended
    STUCK_AFTER seconds later is busy in native code: `end_run(error)` ends the whole run."""
    if not seconds:
        yield
        return
    fired, finished = threading.Event(), threading.Event()
    main = threading.main_thread()
    in_main = threading.current_thread() is main

    def on_alarm(signum, frame):
        if not finished.is_set():
            raise _TimedOut()

    def expire():
        fired.set()
        with contextlib.suppress(Exception):
            backend.cancel()
        if in_main and not finished.is_set():
            signal.pthread_kill(main.ident, signal.SIGALRM)
        stuck = StageTimeout(f"stage '{stage}' timed out after {_seconds(seconds)} and did not stop within "
                             f"{STUCK_AFTER:g}s more (busy in native code outside its engine), so the run was ended",
                             hint="raise its timeout, or make it faster")
        _keep_cancelling(backend, finished.is_set, pause=finished.wait,
                         stuck=(lambda: end_run(stuck)) if end_run and in_main else None)

    previous = signal.signal(signal.SIGALRM, on_alarm) if in_main else None
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    timed_out = StageTimeout(f"stage '{stage}' timed out after {_seconds(seconds)}; its engine work was "
                             "cancelled", hint="raise its timeout, or make it faster")
    try:
        yield
        finished.set()
    except BaseException as exc:
        finished.set()
        if fired.is_set() and not isinstance(exc, _Terminated):
            raise timed_out from exc
        raise
    finally:
        timer.cancel()
        timer.join()  # a late expire() must not cancel or signal anything after this point
        if in_main:
            signal.signal(signal.SIGALRM, previous)
    if fired.is_set() and not in_main:
        raise timed_out  # no signal could interrupt the body: it ran to the end, but too long


STOP_WAIT = 90.0  # seconds the engines of a run may take to stop before their processes are killed

# Seconds a stage may take to end after its engine work was cancelled (a timeout, a stop request)
# before the run is ended around it: on a loaded machine a cancel and its engine's reply take a few.
STUCK_AFTER = 6.0


def _keep_cancelling(engine, done, pause=time.sleep, seconds: float = 60, stuck=None) -> None:
    """After a first cancel: cancel the engine's work again each second until `done()` (the stage
    has ended) or `seconds` pass, since work the stage starts after a cancel (an actor still being
    created, a task submitted late) must not keep it waiting. `pause(1)` waits a second. A stage
    still not done STUCK_AFTER seconds after the first cancel is handed to `stuck()`."""
    started = time.monotonic()
    while not done() and time.monotonic() - started < seconds:
        pause(1)
        if done():
            return
        if stuck is not None and time.monotonic() - started >= STUCK_AFTER:
            stuck()
            return
        with contextlib.suppress(Exception):
            engine.cancel()


@dataclass
class _LiveRun:
    """What a forced end needs of the run in progress."""

    run_dir: Path
    results: dict[str, StageResult]
    record: dict[str, Any]
    started: datetime
    clock: float
    streams: tuple = field(default_factory=lambda: (sys.stdout, sys.stderr))  # as the run began


def _seconds(value: float) -> str:
    return f"{value:g}s" if value < 120 else f"{value / 60:g}m"


class _Terminated(BaseException):
    """SIGINT or SIGTERM, raised in the main thread so cleanup runs the same way for both."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _SignalState:
    """The signal a run received. Engine code may swallow the exception the handler raises (a
    KeyboardInterrupt caught inside a library), so the runner also checks this between steps: a run
    that was asked to stop never goes on to publish."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.installed = False
        self._deferred = False
        self.running = None  # the engine of the stage being called, which a stop request cancels
        self.on_stuck = None  # called with an InterruptedRun when the stage does not end after a cancel

    def on_wakeup(self, signum: int) -> None:
        """Called from the watcher thread the moment SIGINT or SIGTERM arrives, even while the main
        thread is blocked in an engine's native wait (ray.get, a Spark action) where Python's own
        handler cannot run: cancelling the engine's work unblocks it, and the handler then runs."""
        engine = self.running
        if engine is None or self._deferred:
            return

        def cancel_until_the_stage_ends() -> None:
            with contextlib.suppress(Exception):
                engine.cancel()
            stuck = (lambda: self.on_stuck(InterruptedRun(signum))) if self.on_stuck else None
            _keep_cancelling(engine, lambda: self.running is not engine, stuck=stuck)

        threading.Thread(target=cancel_until_the_stage_ends, name="hybridflow-cancel", daemon=True).start()

    def on_signal(self, signum, frame) -> None:
        self.signum = signum
        if not self._deferred:
            raise _Terminated(signum)

    @contextlib.contextmanager
    def deferred(self):
        """Hold a stop request until the block ends (it is then raised by the next check())."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    def reclaim(self) -> None:
        """Take SIGINT/SIGTERM back after an engine started: ray.init installs its own SIGTERM handler,
        which would exit at once, skipping cleanup and the run record."""
        if self.installed:
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, self.on_signal)

    def check(self) -> None:
        if self.signum is not None:
            raise _Terminated(self.signum)


@contextlib.contextmanager
def _signals_as_exceptions(state: _SignalState):
    try:
        previous = {s: signal.signal(s, state.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    state.installed = True
    watcher = _SignalWatcher(state)
    try:
        yield
    finally:
        watcher.close()
        state.installed = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _SignalWatcher:
    """Python runs signal handlers only when the main thread gets back to the interpreter; the C-level
    handler also writes each signal's number to a wake-up socket at once, which this thread reads."""

    def __init__(self, state: _SignalState) -> None:
        import socket

        self.state = state
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        self.previous_fd = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="hybridflow-signals", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while True:
            try:
                data = self.reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    self.state.on_wakeup(signum)

    def close(self) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        self.writer.close()  # the reader sees the end and the thread returns
        self.thread.join(timeout=5)
        self.reader.close()
