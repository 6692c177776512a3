"""Runs a pipeline: a run holds the pipeline's lock and its run record, installs the stop signals,
plans the stages, has each run by the stage executor (executor.py) on the engines of its engine pool
(enginepool.py), and always ends the same way: engines stopped, staging dropped, the record final,
the listener told. What the runs are made with (catalog, run store, records, events, planner, inputs,
each run's executor and publisher) is built in one place, the run session (session.py).

The runner never prints. It reports progress to a listener (the CLI renders it) and returns a
RunResult; errors come back as hybridflow errors with exit codes. The pieces a stage goes through
each live in their own module: inputs.py reads, publisher.py writes and commits, stopping.py holds
the time limits and signals, forcedend.py ends a run from a helper thread when its main thread cannot
be got back (a stage stuck in native code, a stop past its deadline).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import engines as registry
from .. import processes
from ..backends import gpu
from ..backends.stagelog import private_dir
from ..definition.pipeline import Pipeline
from ..definition.runvalues import this_minute
from ..errors import DataError, HybridflowError, InterruptedRun, first_line, is_out_of_space, out_of_space
from ..results import Listener, PlannedInput, RunOptions, RunResult, Selection, StageResult, new_run_id, now  # noqa: F401 - re-exported
from ..store import faults
from ..store.state import recorded_arguments
from ..store.workspace import Workspace
from . import planning
from .enginepool import EnginePool, stop_deadline
from .executor import StageExecutor
from .footerchecks import engines_worth_starting
from .forcedend import ForcedEnd
from .planner import SKIP, Decision
from .provisioning import RunClusters, reap
from .session import RunSession
from .stopping import RunEnded, SignalState, Terminated, signals_as_exceptions

__all__ = ["Runner", "RunOptions", "Selection", "StageResult", "RunResult", "Listener", "PlannedInput", "new_run_id"]


class Runner:
    """One run of a pipeline's selected stages (see run()); plan() and decisions() say what it would do."""

    def __init__(self, pipeline: Pipeline, options: RunOptions | None = None, *, listener: Listener | None = None,
                 engines: dict[str, Any] | None = None, pool: Callable[..., EnginePool] = EnginePool,
                 subscribers: Sequence[Listener] = (), workspace: Workspace | None = None) -> None:
        """options: how the run was asked for (results.RunOptions). engines: started by the caller,
        used and never stopped here. pool: makes the run's engine pool; a watch session's
        (warmpool.py) keeps its engines between runs. subscribers: told the run's events after the
        listener (the API's notifications). workspace: where the runs read, publish and record (by
        default the pipeline's workdir). What the runs are made with is the session's (session.py)."""
        self.pipeline = pipeline
        self.options = options = options or RunOptions()
        self.listener = listener or Listener()
        self.session = RunSession(pipeline, options, listener=self.listener, subscribers=subscribers,
                                  workspace=workspace, pool=pool)
        self._given = dict(engines or {})  # started by the caller: used, never stopped here
        self._foreseen: dict[str, Decision] = {}  # decisions taken before the run, still valid
        self._signals = SignalState()
        self._engines: EnginePool | None = None  # made for each run: its engines log to the run's directory
        self._executor: StageExecutor | None = None
        self._run_id: str | None = None
        self._lock = None  # the pipeline's lock, held while a run lives
        self._gpu: gpu.GpuPlan | None = None  # each stage's device, decided in _preflight
        self._forced = ForcedEnd(self._signals, self._record_forced_end, lambda: self._lock.release(),
                                 exit_when_stuck=options.exit_when_stuck, deadline=lambda: stop_deadline(pipeline))

    @property
    def ended_around_stuck_stage(self) -> bool:
        """The last run was ended (and recorded) around a stage stuck in native code (forcedend.py)."""
        return self._signals.ended is not None

    @property
    def run_id(self) -> str | None:
        """The id of the run started by run(), even when it failed before returning a result."""
        return self._run_id

    # -- planning -------------------------------------------------------------------------------

    def _engines_ahead(self) -> list[str]:
        """The engines of the stages this run expects to execute, in the order they are first needed
        (a stage whose inputs are rebuilt first counts as executing): those worth starting early."""
        wanted = [self.pipeline.stages[s].backend for s in self.session.stages]
        if not any(registry.engine(name).starts and name not in self._given for name in wanted):
            return []  # nothing to start: no need to fingerprint every stage twice
        try:
            decisions = planning.decide(self.pipeline, self.session.stages, self.session.planner)
        except (HybridflowError, OSError):  # the stage that meets it reports it, as without early starts
            return []
        # the leading stages that skip need not be fingerprinted again (a no-op rerun decides once)
        for stage in self.session.stages:
            if decisions[stage].action != SKIP:
                break
            self._foreseen[stage] = decisions[stage]
        return [self.pipeline.stages[s].backend for s in self.session.stages if decisions[s].action != SKIP]

    def _preflight(self) -> None:
        """Everything that can fail before a stage starts: engines available, inputs present."""
        registry.require_all(self.pipeline.stages[stage].backend for stage in self.session.stages)
        self._gpu = gpu.plan(self.pipeline, self.session.stages)  # gpu: true that cannot be met fails here
        for stage, inputs in planning.planned_inputs(self.pipeline, self.session.stages, self.session.catalog).items():
            for item in inputs:
                if item.state != "missing":
                    continue
                if self.pipeline.is_external(item.dataset):
                    raise DataError(f"external input '{item.dataset}' of stage '{stage}' does not exist at "
                                    f"{item.detail}", hint="create it, or fix its path under datasets")
                producer = self.pipeline.dag.producer[item.dataset]
                raise DataError(f"input '{item.dataset}' of stage '{stage}' is not published yet",
                                hint=f"run stage '{producer}' first: hybridflow run {self.pipeline.shown_file} "
                                     f"--to {producer}")

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> RunResult:
        run_id = self._run_id = new_run_id()
        self.pipeline.scheduled_for = self.options.scheduled_for or this_minute(self.pipeline.zone)  # one time per run
        # a Runner may run again (a watch loop)
        self._signals.reset()
        self._forced.begin()
        self.session.inputs.forget()
        run_dir = self.session.home / "runs" / run_id
        results = {s: StageResult(s, self.pipeline.stages[s].backend) for s in self.session.stages}
        lock = self._lock = self.session.workspace.lock()
        try:
            # a store that ignores conditional writes: the lease would protect nothing
            self.session.workspace.require_trusted()
            lock.acquire(run_id, wait=self.options.wait_for_lock)
            # a run that cannot prove it still holds its lease publishes nothing, and stops
            self.session.catalog.confirm = lock.confirm
            lock.on_lost(self._signals.stop_for)
            try:  # the lock is held until the run's record is final: the next run trusts what it finds
                return self._run_locked(run_id, run_dir, results)
            finally:
                try:
                    lock.release()
                finally:
                    self._forced.run_over()
        except RunEnded as ended:
            raise ended.error from None
        except Exception as exc:  # the run's record or log could not be written: the disk is full
            if isinstance(exc, HybridflowError) or not is_out_of_space(exc, self.session.workspace.local):
                raise
            raise out_of_space(self.session.workspace.local) from exc

    def _reap_clusters(self, clusters: RunClusters, log_file: Path) -> list[str]:
        """Take down the clusters that runs which died left up (we hold the lock: no other run lives)."""
        reaped, problems = reap(self.pipeline, clusters.records, log_file, self._lock.confirm)
        return [f"took down the {r['engine']} cluster that run {r['run_id']} left up" for r in reaped] + problems

    def _run_locked(self, run_id: str, run_dir: Path, results: dict[str, StageResult]) -> RunResult:
        live = self._forced.opened = self._open_record(run_id, run_dir, results)
        status, error, unrecorded, warnings, holding = "failed", None, None, [], False
        clusters = RunClusters(self.pipeline, run_id, run_dir / "logs", self.session.workspace.cluster_records())
        self._engines = self.session.engines(run_id, run_dir, self._signals, given=self._given, clusters=clusters,
                                             gpu=lambda name: self._gpu.engine(name) if self._gpu else None)
        try:
            # a stop request while the run prepares (recovery, preflight, reaping, early starts) stops it
            # as one during a stage does: exit 130 or 143 and the run recorded as interrupted
            with signals_as_exceptions(self._signals):
                warnings = self._prepare(live, clusters)
                self._signals.check()
                self._executor = self._stage_executor()  # once the GPU plan is made (preflight)
                live.streams = (sys.stdout, sys.stderr)  # as the stages begin: what a forced end gives back
                self._forced.live = live
                try:
                    status, error = self._run_stages(run_id, run_dir, results)
                    self._signals.check()
                finally:
                    self._forced.ending.acquire()  # a forced end under way finishes the run; this thread waits
                    holding = True
            if status == "success":
                self._collect_garbage()
        except RunEnded:  # ended, recorded and reported around a stuck stage (forcedend.py)
            raise
        except (KeyboardInterrupt, Terminated) as exc:
            self._raise_if_ended()
            error = self._interrupted(exc, results)
            status = "interrupted" if isinstance(error, InterruptedRun) else "failed"
        except BaseException as exc:  # a bug, or an engine's own exit: the record must not stay "running"
            self._raise_if_ended()
            unrecorded = exc
            raise
        finally:
            self._engines.stop_all()
            self.session.catalog.discard_staging(run_id)
            if unrecorded is not None:  # recorded once the engines and staging gave back their disk space
                self._record_failure(unrecorded, results)
            self._forced.live = None
            if holding:
                self._forced.ending.release()
        return self._close(live, status, error, warnings + clusters.problems)

    def _open_record(self, run_id: str, run_dir: Path, results: dict[str, StageResult]) -> _LiveRun:
        """The run recorded as running: a waiting run starts when it gets the lock."""
        started, clock = datetime.now(timezone.utc), time.monotonic()
        record = self.session.records.open(run_id, run_dir, started, self.options.trigger, self.options.arguments)
        return _LiveRun(run_dir, results, record, started, clock)

    def _prepare(self, live: _LiveRun, clusters: RunClusters) -> list[str]:
        """Everything before the first stage; returns the warnings the run ends with."""
        # Under the lock no other run is writing: whatever is in staging is a dead run's leftovers,
        # and a stage commit a crash interrupted is finished before anything reads the outputs.
        self.session.catalog.discard_staging()
        self.session.catalog.recover()
        try:
            self._preflight()
        except HybridflowError as exc:  # paths and addresses may hold a value from ${env:...}
            exc.message, exc.hint = self.pipeline.redact(exc.message), exc.hint and self.pipeline.redact(exc.hint)
            self.session.records.end("failed", exc.one_line())
            raise
        faults.checkpoint("run:preparing")
        logs = live.run_dir / "logs"
        private_dir(logs)  # 0700: logs may quote data
        warnings = self._reap_clusters(clusters, logs / "cluster-reap.log")
        # none for a stage whose input's footers already fail a check (footerchecks)
        ahead = engines_worth_starting(self.pipeline, self.session.inputs, self.session.stages, self._engines_ahead(),
                                       self.options.keep_going)
        try:
            self._fetch_for_object_storage(ahead)
        except HybridflowError as exc:
            self.session.records.end("failed", exc.one_line())
            raise
        self._engines.start_early(ahead)  # before the display takes the terminal
        self.session.events.run_started(live.record["run_id"], list(live.results.values()))
        return warnings

    def _fetch_for_object_storage(self, engines: list[str]) -> None:
        """What the engines of the stages to run need to reach object storage, fetched on this machine
        the first time (Spark's connector to the store): now, with its progress on the terminal, not inside an engine's
        start, whose output goes to engines.log."""
        if not self.pipeline.uses_object_storage:
            return
        for name in dict.fromkeys(engines):
            fetch, settings = registry.engine(name).object_storage_fetch, self.pipeline.engine_settings(name)
            way = registry.engine(name).way_to(self.pipeline.store.scheme, settings)
            if fetch is not None and way == registry.ITSELF and name not in self._given:
                fetch(settings, self.pipeline.store)

    def _raise_if_ended(self) -> None:
        """The stage's native call returned after the run was ended around it: nothing more happens."""
        if self._signals.ended is not None:
            raise RunEnded(self._signals.ended) from None

    def _interrupted(self, exc: BaseException, results: dict[str, StageResult]) -> HybridflowError:
        """What a stopped run ends with: InterruptedRun for a signal, or what stopped it (its lease lost)."""
        error = self._signals.stopped_by
        for result in results.values():
            if result.status == "running":
                self._finish(result, "failed", error=error.one_line() if error else "interrupted")
            elif result.status == "waiting":
                self._finish(result, "not run", reason="the run stopped" if error else "run interrupted")
        return error or InterruptedRun(getattr(exc, "signum", signal.SIGINT))

    @property
    def _workdir_uri(self) -> str | None:
        return self.session.workspace.remote.uri if self.session.workspace.remote is not None else None

    def _close(self, live: _LiveRun, status: str, error: HybridflowError | None, warnings: list[str]) -> RunResult:
        """The run's result, told as its end: its final record, its report, the listener."""
        self._forced.tell_end()  # released by run()
        result = RunResult(live.record["run_id"], self.pipeline.name, status, live.results, dict(self._engines.seconds),
                           live.started.isoformat(timespec="seconds"), time.monotonic() - live.clock, live.run_dir,
                           error=error, warnings=warnings, workdir_uri=self._workdir_uri)
        if status != "success" and result.failed or status == "interrupted":
            result.resume_command = f"hybridflow run {self.pipeline.shown_file} --resume"
        self.session.events.run_finished(result)
        return result

    def _record_failure(self, exc: BaseException, results: dict[str, StageResult]) -> None:
        """The run, and the stage it was in, recorded as failed by an error that escaped the run (each
        stage saved again); where the record cannot be written (a full disk), the next run marks it."""
        for result in results.values():
            if result.status == "waiting":
                continue  # never reached: nothing to record (a run failing before its stages records none)
            if result.status == "running":
                result.status, result.error = "failed", self.pipeline.redact(first_line(exc))
            with contextlib.suppress(Exception):  # again: a failed stage's own save may have met the full disk
                self.session.records.stage_changed(result)
        with contextlib.suppress(Exception):
            self.session.records.end("failed", self.pipeline.redact(f"{type(exc).__name__}: {first_line(exc)}"))

    def _record_forced_end(self, live: _LiveRun, error: HybridflowError) -> None:
        """The run ended from a helper thread (forcedend.py): its engines and processes ended, its
        stages and record final, its staging dropped, its end told."""
        if self._engines is not None:
            self._engines.abandon()
        processes.end_all()
        sys.stdout, sys.stderr = live.streams  # the stuck stage's own prints went to its log
        for result in live.results.values():
            if result.status == "running":
                self._finish(result, "failed", error=self.pipeline.redact(error.one_line()))
            elif result.status == "waiting":
                self._finish(result, "not run", reason="the run was ended")
        self.session.catalog.discard_staging(self._run_id)
        status = "interrupted" if isinstance(error, InterruptedRun) else "failed"
        run = RunResult(self._run_id, self.pipeline.name, status, live.results,
                        dict(self._engines.seconds) if self._engines is not None else {},
                        live.started.isoformat(timespec="seconds"), time.monotonic() - live.clock,
                        live.run_dir, resume_command=f"hybridflow run {self.pipeline.shown_file} --resume",
                        error=error, workdir_uri=self._workdir_uri)
        if self._engines is not None:
            self._engines.output.close()
        self.session.events.run_finished(run)

    def _collect_garbage(self) -> None:
        """Old versions go after a successful run; failing to remove them never fails the run."""
        try:
            removed = self.session.catalog.collect_garbage(self.pipeline.spec.keep_versions)
        except (OSError, HybridflowError) as exc:
            logging.getLogger("hybridflow").warning("garbage collection failed: %s", first_line(exc))
            return
        if removed:
            logging.getLogger("hybridflow").info("removed %d old dataset versions", len(removed))

    def _run_stages(self, run_id: str, run_dir: Path, results: dict[str, StageResult]):
        first_error: HybridflowError | None = None
        for stage in self.session.stages:
            self._signals.check()
            result = results[stage]
            blocked = [p for p in self.pipeline.dag.upstream[stage]
                       if p in results and results[p].status in ("failed", "not run")]
            if blocked:
                self._finish(result, "not run", reason=f"upstream stage '{blocked[0]}' did not finish")
                continue
            if first_error and not self.options.keep_going:
                self._finish(result, "not run", reason="an earlier stage failed")
                continue
            decision = None
            try:
                try:
                    # decided before the run began (for early starts): still true while no stage has executed
                    decision = self._foreseen.pop(stage, None) or self.session.planner.decide(stage)
                except OSError as exc:  # an input changed while it was being hashed
                    raise DataError(f"cannot fingerprint the inputs of stage '{stage}': {exc}",
                                    hint="run again once the input is complete") from exc
                result.reason = decision.reason
                result.fingerprint = decision.fingerprint.digest if decision.fingerprint else None
                if decision.action == SKIP:
                    self._finish(result, "skipped", reason=decision.reason)
                    continue
                self._foreseen.clear()  # from here on outputs change: decide each stage when it comes
                self._executor.run_stage(run_id, run_dir, result, decision)
                self._finish(result, "done", reason=decision.reason if result.attempts == 1 else
                             f"{decision.reason}; succeeded on attempt {result.attempts}")
            except HybridflowError as exc:
                first_error = first_error or exc
                self._finish(result, "failed", error=self.pipeline.redact(exc.one_line()),
                             reason=decision.reason if decision else None)  # why it ran, kept for the report
            finally:
                # an engine no stage still to come runs on gives its memory back now, not at the end
                self._engines.keep_only(self._engines_still_needed(results, first_error is not None))
        return ("failed", first_error) if first_error else ("success", None)

    def _engines_still_needed(self, results: dict[str, StageResult], failed: bool) -> set[str]:
        """The engines of the stages still to come that can still run: none after a failure (without
        --keep-going), and none for a stage below a failed one."""
        if failed and not self.options.keep_going:
            return set()
        ended = {s for s, r in results.items() if r.status in ("failed", "not run")}
        return {results[s].backend for s in self.session.stages
                if results[s].status == "waiting" and not self.pipeline.dag.ancestors(s) & ended}

    def _stage_executor(self) -> StageExecutor:
        return self.session.executor(self._engines, self._signals, gpu=self._gpu, changed=self._stage_changed,
                                     end_run=self._forced.end_stuck_run)

    # -- helpers --------------------------------------------------------------------------------

    def _finish(self, result: StageResult, status: str, *, error: str | None = None,
                reason: str | None = None) -> None:
        self._forced.changes_allowed()
        result.status, result.error, result.reason = status, error, reason
        if result.started_at is not None:
            result.duration = time.monotonic() - result.started_at
        self.session.events.stage_changed(result)

    def _stage_changed(self, result: StageResult) -> None:
        """A stage's state changed (the executor's word): told to the run's subscribers."""
        self._forced.changes_allowed()
        self.session.events.stage_changed(result)


@dataclass
class _LiveRun:
    """The run in progress: its directory, stage results, record and clock, and the output streams its
    stages began with (what a forced end gives back)."""

    run_dir: Path
    results: dict[str, StageResult]
    record: dict[str, Any]
    started: datetime
    clock: float
    streams: tuple = field(default_factory=lambda: (sys.stdout, sys.stderr))


def new_runner(pipeline: Pipeline, options: RunOptions, **collaborators) -> Runner:
    """The one way a run is made (api.run, a watch session's runs): `options.arguments` (only/from/to/
    params/force, as asked) select its stages and are recorded with every secret replaced by the
    ${env:...} that holds it, never stored. `collaborators`: Runner's listener, pool, subscribers."""
    arguments = options.arguments
    recorded = recorded_arguments(arguments, pipeline.secrets, pipeline.secret_sources(os.environ))
    return Runner(pipeline, replace(options, selection=selection_of(arguments), arguments=recorded), **collaborators)


def selection_of(arguments: dict[str, Any]) -> Selection:
    return Selection(arguments.get("only", ()), arguments.get("from", ()), arguments.get("to", ()))
