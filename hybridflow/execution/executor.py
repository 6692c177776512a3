"""Runs one stage: opens its log, tries it (retrying what may succeed on another try), and in each
try gets its engine, reads its inputs, calls the user's function within its time limit (in a
killable child process where the engine allows it), and hands what it returned to the publisher."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import processes
from ..backends.context import StageContext
from ..backends.stagelog import stage_log
from ..backends.stagemlflow import record_of
from ..definition import signature
from ..definition.sqlstage import is_sql, sql_function
from ..definition.stagecode import import_function
from ..errors import (
    ConfigError,
    HybridflowError,
    StageError,
    StageTimeout,
    UnavailableError,
    is_out_of_space,
    out_of_space,
)
from ..reporting.timeline import ATTEMPT, CALL, PUBLISH, READ, RETRY_WAIT
from ..results import StageResult
from . import childprocess
from .datachecking import InputChecks
from .enginepool import EnginePool
from .planner import INCREMENTAL, Decision
from .publisher import Publication, Publisher, Written
from .stageerrors import StageErrors
from .stageprogress import watched
from .stopping import SignalState, Terminated, time_limit

if TYPE_CHECKING:  # the session makes the executor
    from .session import RunSession

# Failures worth another try: the stage's own code (a flaky source), a timeout, an engine that
# could not start or be reached. Config and data-contract errors would fail the same way again.
RETRYABLE = (StageError, StageTimeout, UnavailableError)
MAX_RETRY_DELAY = 600.0


class StageExecutor:
    def __init__(self, session: RunSession, engines: EnginePool, publisher: Publisher, errors: StageErrors,
                 signals: SignalState, *, gpu: Any, changed: Callable[[StageResult], None],
                 end_run: Callable[[HybridflowError], None]) -> None:
        """A run's: its session's pipeline, catalog, planner and inputs, the run's engines, its outputs'
        publisher and its stages' errors."""
        self.pipeline, self.catalog, self.planner = session.pipeline, session.catalog, session.planner
        self.engines, self.inputs, self.publisher, self.errors = engines, session.inputs, publisher, errors
        self.signals = signals
        self.gpu = gpu  # the run's gpu.GpuPlan, decided before the first stage
        self.changed = changed  # a stage's result changed: report and record it
        self.end_run = end_run  # a stage stuck past its timeout: the run is ended around it
        self.home = session.catalog.home
        self.timeline = engines.timeline
        self.input_checks = InputChecks(self.pipeline, self.inputs)  # one run's: each run makes its executor

    def run_stage(self, run_id: str, run_dir: Path, result: StageResult, decision: Decision) -> None:
        spec = self.pipeline.stages[result.name]
        log_path = run_dir / "logs" / f"{result.name}.log"
        result.log_path = str(log_path)
        result.status, result.started_at = "running", time.monotonic()
        self.changed(result)
        with stage_log(self.pipeline, result.name, log_path) as (log, log_stream):
            log.info("running: %s", decision.reason)
            attempts = spec.retries + 1
            for attempt in range(1, attempts + 1):
                result.attempts = attempt
                try:
                    self._attempt(StageTry(run_id, result, decision, log, log_stream))
                    break
                except HybridflowError as exc:
                    message = self.pipeline.redact(exc.one_line())
                    if not isinstance(exc, RETRYABLE) or attempt == attempts:
                        log.error("stage failed: %s", message, exc_info=exc)
                        raise
                    delay = min(spec.retry_delay * 2 ** (attempt - 1), MAX_RETRY_DELAY)
                    log.warning("attempt %d of %d failed: %s; retrying in %.1fs", attempt, attempts, message, delay)
                    result.reason = f"attempt {attempt + 1} of {attempts} (after: {message})"
                    self.changed(result)
                    with self.timeline.span(RETRY_WAIT, result.name, attempt=attempt):
                        self._wait(delay)

    def _attempt(self, attempt: StageTry) -> None:
        """One try of a stage: engine, call, publish, all within its timeout. A failed try leaves no
        staging behind (on a full disk, that is the space the run needs to record itself)."""
        children = processes.children()
        result = attempt.result
        try:
            with self.timeline.span(ATTEMPT, result.name, result.backend, attempt=result.attempts):
                self._try_stage(attempt)
        except Exception as exc:
            self.catalog.discard_staging(attempt.run_id)
            if isinstance(exc, HybridflowError) or not is_out_of_space(exc, self.home):
                raise
            raise out_of_space(self.home) from exc
        finally:
            self._end_left_behind(children, attempt.log)

    def _end_left_behind(self, children: set[int], log: logging.Logger) -> None:
        """What the try started on this side and left running (a subprocess, a daemon it detached)
        ends with it: the command's run process adopts such orphans (supervisor.py, processes.adopt_orphans)."""
        left = processes.left_behind(children)
        if left:
            log.warning("ending %d process(es) the stage left running: %s", len(left),
                        ", ".join(str(pid) for pid in sorted(left)))
            processes.end(left)

    def _try_stage(self, attempt: StageTry) -> None:
        result, log = attempt.result, attempt.log
        spec = self.pipeline.stages[result.name]
        self.signals.check()  # a retry after the run was ended around a stuck try must start nothing
        self.input_checks.before_engine(spec.inputs, result.checks, log)  # what footers answer needs no engine
        started_engines = set(self.engines.seconds)
        clock = time.monotonic()
        backend = self.engines.get(spec.backend)
        if spec.backend not in started_engines and spec.backend in self.engines.seconds:
            # what this stage paid: the whole start on first use, or only what was left of a start
            # that began early (0 when it finished while earlier stages computed)
            result.engine_start = time.monotonic() - clock
        result.gpu, result.gpu_reason = self.gpu.start_stage(result.name, backend, self.engines.started(), log)
        result.rows_in, result.bytes_in = self.inputs.size(spec.inputs)
        self.signals.check()
        decision = attempt.decision
        publication = attempt.publication = self.publisher.begin(attempt.run_id, result, backend, log, decision)
        self.signals.running = attempt.backend = backend
        attempt.work = EngineWork(backend, result)
        try:
            self._compute_and_publish(attempt, publication)
        except BaseException:
            publication.discard()  # a version prepared but never made current is not left in versions/
            raise

    def _compute_and_publish(self, attempt: StageTry, publication: Publication) -> None:
        result, log, decision, backend = attempt.result, attempt.log, attempt.decision, attempt.backend
        spec = self.pipeline.stages[result.name]
        try:
            with backend.stage_lineage(attempt.run_id, result.name, log), watched(backend, result), \
                    time_limit(spec.timeout, backend, result.name, self.end_run):
                if decision.action == INCREMENTAL and not decision.changes.changed:
                    produced = {}  # partitions were only removed: nothing to compute
                else:
                    produced = self._produce(attempt)
                self.signals.check()
                with self.timeline.span(PUBLISH, result.name, "write and check", attempt=result.attempts):
                    publication.prepare(produced)
                attempt.work.ended("publish")
        except StageTimeout:
            # The engine may still hold the stage's work (a Ray task, a Spark job that ignored the
            # cancel): a fresh engine for whatever comes next is the one sure way to be rid of it.
            self.engines.drop(spec.backend)
            raise
        finally:
            self.signals.running = None
        with self.timeline.span(PUBLISH, result.name, "commit", attempt=result.attempts):
            publication.commit()

    def _wait(self, seconds: float) -> None:
        """Sleep before a retry, still answering SIGINT/SIGTERM at once."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.signals.check()
            time.sleep(min(left, 0.2))

    def _produce(self, attempt: StageTry) -> dict[str, Any]:
        """The stage's outputs: frames from the engine or, for a stage with a timeout on an engine whose
        stages can run in a child process (python, off the GPU), the outputs that child already wrote
        (see childprocess). Only with a timeout: a child forked from a process that has run engines
        in it is not free of risk, and without a timeout a stop request that cannot interrupt the
        stage ends the run around it instead (the session's end_run)."""
        backend, name = attempt.backend, attempt.result.name
        timeout = self.pipeline.stages[name].timeout
        if not (timeout and backend.isolated_calls and not backend.stage_on_gpu and childprocess.available()):
            return self._call(attempt)

        def call_and_write() -> dict[str, Written]:
            return {ds: attempt.publication.write(ds, frame) for ds, frame in self._call(attempt).items()}

        return childprocess.call_in_child(call_and_write, streams=[attempt.log_stream])

    def _stage_function(self, stage: str, backend, log: logging.Logger) -> Callable[..., Any]:
        """The user's function, or for a SQL stage one that runs its query on the engine."""
        spec = self.pipeline.stages[stage]
        if is_sql(spec.run):
            return sql_function(self.pipeline.root, spec.run, backend, list(spec.inputs),
                                self.pipeline.params_for(stage))
        try:
            return import_function(self.pipeline.root, spec.run)
        except HybridflowError:
            raise
        except (Exception, SystemExit) as exc:  # the user's module raised (or exited) while being imported
            raise self.errors.of(exc, log) from exc

    def _call(self, attempt: StageTry) -> dict[str, Any]:
        run_id, result, backend, log, decision = attempt.run_id, attempt.result, attempt.backend, attempt.log, \
            attempt.decision
        spec = self.pipeline.stages[result.name]
        params = self.pipeline.params_for(result.name)
        fn = self._stage_function(result.name, backend, log)
        parameters = signature.from_callable(fn)
        problems = signature.call_problems(parameters, spec.inputs, params)
        if problems:
            raise ConfigError(f"cannot call {spec.run}: {problems[0]}")
        only = {}
        if decision.action == INCREMENTAL:  # the partitioned input: its new or changed partitions only
            only[self.planner.partitioned_input(result.name)] = set(decision.changes.changed)
        with self.timeline.span(READ, result.name, attempt=result.attempts):
            self.input_checks.before_reading(spec.inputs, backend, result.checks, log)
            inputs = {ds: self.inputs.read(ds, backend, only.get(ds)) for ds in spec.inputs}
        attempt.work.ended("read")
        files_dirs = attempt.publication.files_dirs
        previous = {ds: getattr(self.catalog.current(ds), "directory", None) for ds in files_dirs}
        ctx = StageContext(self.pipeline.name, result.name, run_id, spec.backend, params, log,
                           self.pipeline.run_moment(), files_dirs, backend.handles(), previous,
                           record_of(result.log_path))
        kwargs = signature.call_arguments(parameters, inputs, params, ctx)
        log.info("calling %s with %s", spec.run, ", ".join(kwargs) or "no arguments")
        try:
            # What a stage prints goes to its log file, so it cannot garble the progress display.
            with contextlib.redirect_stdout(attempt.log_stream), contextlib.redirect_stderr(attempt.log_stream), \
                    self.timeline.span(CALL, result.name, spec.run, attempt=result.attempts):
                returned = fn(**kwargs)
            attempt.work.ended("call")
        except (KeyboardInterrupt, Terminated):
            raise
        except (Exception, SystemExit) as exc:  # a stage's sys.exit() is its failure, never the run's end
            raise self.errors.of(exc, log, result.name) from exc
        return attempt.publication.frames_of(returned)


@dataclass
class StageTry:
    """One try of a stage: its run, its result (which carries the attempt number and, once it ends,
    the outcome: status, rows, outputs, error), the decision it carries out, its log; the engine, the
    engine work it ran and the publication of its outputs once it has them."""

    run_id: str
    result: StageResult
    decision: Decision
    log: logging.Logger
    log_stream: Any
    backend: Any = None
    work: EngineWork | None = None
    publication: Publication | None = None


class EngineWork:
    """The engine work (Spark jobs, Dask task graphs, Ray Data executions) each phase of a stage's
    attempt ran: read, call and publish, counted on the stage's result as each phase ends. A lazy
    engine's result is computed while it is published, so publish holds the work of the stage's result
    and hybridflow's own writing; call holds what the function itself made the engine run (a count(),
    a collect)."""

    def __init__(self, backend, result: StageResult) -> None:
        self.backend = backend
        self.result = result
        self._last = backend.engine_work()
        if self._last is not None:
            result.engine_work = {}

    def ended(self, phase: str) -> None:
        if self._last is None:
            return
        now = self.backend.engine_work()
        if now is None:
            return
        counts = self.result.engine_work
        counts[phase] = counts.get(phase, 0) + now - self._last
        self._last = now
