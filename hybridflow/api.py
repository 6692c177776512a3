"""hybridflow from Python: everything the CLI does, as functions that return results and raise typed
errors (each HybridflowError carries the exit code the CLI would use). The CLI calls these and only
prints. Engines are imported only when a stage runs on them.

    import hybridflow

    result = hybridflow.run("configs/weekly_retrain.yaml", force=["train"])
    result.raise_for_status()
    features = hybridflow.read("configs/weekly_retrain.yaml", "features")   # a pandas DataFrame
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from .errors import ConfigError, HybridflowError, LockedError, UsageError
from .results import Listener, RunOptions, RunResult, Selection, new_run_id

# Each function imports what it needs when called: `hybridflow validate` must not pay for the runner,
# the catalog or pyarrow, nor `--help` for anything (tests/unit/test_imports.py).
if TYPE_CHECKING:
    from .definition.pipeline import Pipeline
    from .execution.planning import Plan
    from .execution.runner import Runner

    PipelineLike = str | os.PathLike | Pipeline
Params = Mapping[str, Any] | Sequence[str] | None
Names = str | Iterable[str]

_LAZY = {"Plan": "execution.planning", "WORKDIR_VARIABLE": "definition.config"}  # WORKDIR_VARIABLE: what --workdir sets


def __getattr__(name: str):
    """The names this module offers from heavier ones (api.Plan, api.WORKDIR_VARIABLE), on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(f"{__package__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def load(path: str | os.PathLike, params: Params = None) -> Pipeline:
    """Load and check a pipeline file. `params` override its params: a mapping ({"lr": 0.1,
    "train.depth": 6}) or the CLI's "key=value" strings. Raises ConfigError naming file:line."""
    from .definition.config import load_pipeline

    return load_pipeline(Path(path), _param_strings(params))


def _pipeline(pipeline: PipelineLike, params: Params = None) -> Pipeline:
    from .definition.pipeline import Pipeline

    if isinstance(pipeline, Pipeline):
        if params:  # a loaded pipeline's params are fixed: load its file again with the overrides
            return load(pipeline.file, _param_strings(params))
        return pipeline
    return load(pipeline, params)


def _param_strings(params: Params) -> list[str]:
    if not params:
        return []
    if isinstance(params, Mapping):
        import json

        # a value in YAML flow syntax, as --param reads it: numbers, booleans, lists keep their type
        return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in params.items()]
    if isinstance(params, str):
        raise UsageError("params must be a mapping or a list of 'key=value' strings, not one string")
    return list(params)


def _names(value: Names | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def forced(pipeline: Pipeline, force: bool | Names | None) -> bool | set[str]:
    """What `force` asks for: True (every stage), or the stages named ("a,b", ["a", "b"]), each
    checked against the pipeline; False or None: none."""
    if force is None or force is False:
        return False
    if force is True or force == "*":
        return True
    from .diagnostics import did_you_mean

    names = {n.strip() for n in (force.split(",") if isinstance(force, str) else force) if n.strip()}
    for name in sorted(names):
        if name not in pipeline.stages:
            raise UsageError(f"--force: no stage named '{name}'{did_you_mean(name, pipeline.stages)}",
                             hint="a bare --force forces every stage; --force a,b the stages named")
    return names


def plan(pipeline: PipelineLike, *, only: Names | None = None, from_: Names | None = None,
         to: Names | None = None, force: bool | Names | None = False, params: Params = None) -> Plan:
    """Which stages a run would execute or skip, and why. Starts no engine, imports no stage code."""
    from .execution import planning

    loaded = _pipeline(pipeline, params)
    return planning.plan(loaded, Selection(_names(only), _names(from_), _names(to)), forced(loaded, force))


def run(pipeline: PipelineLike, *, only: Names | None = None, from_: Names | None = None, to: Names | None = None,  # noqa: PLR0913 - the public run's options, one per CLI flag
        force: bool | Names | None = False, params: Params = None, resume: bool = False, keep_going: bool = False,
        dry_run: bool = False, wait: bool = False, trigger: str = "manual", listener: Listener | None = None,
        notify: bool = True, exit_when_stuck: bool = False, scheduled_for: datetime | str | None = None,
        calendar: dict | None = None) -> RunResult | Plan | None:
    """Run a pipeline (a file, or one from load()) and return its RunResult: the run's status, each
    stage's status, duration, rows, bytes, published versions and error. A stage that fails does
    not raise (result.raise_for_status() does); what stops a run from starting raises the typed
    error the CLI maps to its exit code (ConfigError, DataError, LockedError, UnavailableError).

    resume: repeat the last run if it did not succeed (same selection and params; finished stages
    are skipped); returns None when there is nothing to resume. dry_run: returns the Plan instead.
    notify: send the notifications the pipeline's `notify:` asks for. listener: receives progress.

    A stage that a timeout or a stop request cannot get back from native code (one endless numpy
    call) has its run ended around it: engines stopped, staging dropped, the run recorded and the
    listener told. The error (StageTimeout, InterruptedRun) is then raised here once that call
    returns; exit_when_stuck (the CLI's) instead ends this process at once with the error's code.

    scheduled_for: the time the run is for (a datetime, or ISO text in the schedule's zone; default:
    now, or the resumed run's); calendar: the ticks it catches up (ops/calendar.py)."""
    from .definition.runvalues import parse_moment
    from .execution import planning
    from .execution.runner import new_runner, selection_of

    if trigger not in ("manual", "cron"):
        raise ConfigError(f"--trigger must be manual or cron, not '{trigger}'")
    listener = listener or Listener()
    loaded = _pipeline(pipeline, params)
    arguments = {"only": list(_names(only)), "from": list(_names(from_)), "to": list(_names(to)),
                 "params": _param_strings(params) or list(loaded.param_args), "force": _force_argument(force)}
    if resume:
        if only or from_ or to or params or loaded.param_args:
            raise UsageError("--resume repeats the last run's --only/--from/--to/--param; do not give them again")
        repeated = _resumed(loaded, force, listener, arguments)
        if repeated is None:
            return None
        loaded, arguments, chosen = repeated
    else:
        chosen = forced(loaded, force)
    moment = parse_moment(scheduled_for, loaded.zone) if isinstance(scheduled_for, str) else scheduled_for
    calendar = dict(calendar or {})
    if resume:  # a resumed run is still for the time the failed run was for, and lifts a held schedule
        last = _last_run(loaded)
        calendar["resumed"] = last["run_id"] if last else None
        if moment is None and last and last.get("scheduled_for"):
            moment = parse_moment(last["scheduled_for"], loaded.zone)
    loaded.scheduled_for, loaded.calendar = moment, calendar
    if dry_run:
        return planning.plan(loaded, selection_of(arguments), chosen)
    options = RunOptions(force=chosen, keep_going=keep_going, wait_for_lock=wait, trigger=trigger,
                         exit_when_stuck=exit_when_stuck, scheduled_for=moment, arguments=arguments)
    runner = new_runner(loaded, options, listener=listener,
                        subscribers=_notifications(loaded, trigger, listener) if notify else ())
    return _run_notifying_failed_start(runner, notify)


def record_crash(pipeline: PipelineLike, run_id: str, death: str, command: str = "run") -> HybridflowError:
    """The error of run `run_id`, whose process ended without recording its end (`death`: how, e.g.
    'killed by SIGSEGV: a crash in native code'). Records the run, and the stage that was running, as
    killed, unless the run's end was recorded after all."""
    from .errors import StageError
    from .results import now
    from .store.state import RunStore

    loaded = _pipeline(pipeline)
    records = loaded.workdir / "runs.db"
    running = RunStore(records).running_stages(run_id) if records.is_file() else None  # never made again here
    where = f"during stage '{running[0]['stage']}'" if running else "between stages"
    message = f"run {run_id} ended {where}: its process died ({death})"
    if running is not None:
        RunStore(records).mark_crashed(run_id, message, now())
    logs = f"its log: {running[0]['log_path']}; " if running else ""
    return StageError(message, hint=f"{logs}resume with: hybridflow {command} {loaded.shown_file} --resume")


def watch(pipeline: str | os.PathLike, *, only: Names | None = None, from_: Names | None = None,  # noqa: PLR0913 - the public watch's options, one per CLI flag
          to: Names | None = None, force: bool | Names | None = False, params: Params = None,
          keep_going: bool = False, report=None, runs: int | None = None,
          exit_when_stuck: bool = False) -> RunResult | None:
    """Run a pipeline file, then run it again on every save of the file, of the stage code it
    reaches or of an external input, with its engines kept running between runs; each run executes
    only the stages whose fingerprint changed and those downstream. Ends on SIGINT or SIGTERM
    (raising InterruptedRun) with every engine stopped, or after `runs` runs. report: a
    watching.WatchReport, told each run and each wait. force: for the first run only. Returns the
    last run's result. A run ended around a stuck stage (see run(); exit_when_stuck as there) ends
    the session, raising its error."""
    from .execution.watching import WatchReport, WatchSession

    loaded = load(pipeline, params)  # a file that does not load at the start is an error, as for run
    session = WatchSession(loaded.file, _param_strings(params),
                           subscribers=lambda pipeline, listener: _notifications(pipeline, "manual", listener),
                           report=report or WatchReport(),
                           options=RunOptions(Selection(_names(only), _names(from_), _names(to)), forced(loaded, force),
                                              keep_going=keep_going, exit_when_stuck=exit_when_stuck))
    return session.loop(runs)


def _force_argument(force: bool | Names | None) -> str | None:
    """`force` as the CLI's --force value, which runs.db keeps for --resume."""
    if force is None or force is False:
        return None
    if force is True:
        return "*"
    return force if isinstance(force, str) else ",".join(force)


def _resumed(pipeline: Pipeline, force, listener: Listener, arguments: dict):
    """(pipeline, arguments, forced stages) repeating the last run, or None (listener told why)."""
    import json

    from .store.state import resumed_arguments
    from .store.workspace import Workspace

    store = Workspace.of(pipeline).recorded_runs()
    last = store.last_run(pipeline.name) if store else None
    if last is None or last["status"] == "success":
        listener.nothing_to_resume(f"the last run, {last['run_id']}, succeeded" if last
                                   else "this pipeline has no run yet")
        return None
    arguments = resumed_arguments(json.loads(last["arguments"] or "{}") or arguments, os.environ)
    reloaded = load(pipeline.file, arguments.get("params", []))
    chosen = forced(reloaded, force or arguments.get("force"))
    if chosen and not force:  # the last run's --force: still owed to the stages it did not finish
        finished = {s["stage"] for s in store.stages(last["run_id"]) if s["status"] == "done"}
        chosen = (set(reloaded.stages) if chosen is True else chosen) - finished
    listener.resuming(last["run_id"], last["status"])
    return reloaded, arguments, chosen


def _last_run(pipeline: Pipeline) -> dict | None:
    """The pipeline's last run (that ran: not a held tick), from its workdir, local or in object storage."""
    from .store.workspace import Workspace

    return Workspace.of(pipeline).run_store().last_run(pipeline.name)


def _run_notifying_failed_start(runner: Runner, notify: bool) -> RunResult:
    """runner.run(), except that a run failing before its stages start (a missing input, an engine not
    installed) still sends its failure notification: under cron nobody reads the error line."""
    from .ops.notify import failed_start_summary

    started, clock = datetime.now(timezone.utc), time.monotonic()
    try:
        try:
            return runner.run()
        finally:
            runner.listener.close()
    except LockedError:
        # Deliberately not notified: another run of this pipeline is legitimately in progress and will
        # report its own outcome; notifying here would page someone on every overlapping cron tick.
        raise
    except HybridflowError as exc:
        if notify and not runner.ended_around_stuck_stage:  # that run's end was notified already
            from .ops.notify import Notifications

            trigger = runner.options.trigger
            Notifications(runner.pipeline, trigger, runner.listener).send(failed_start_summary(
                runner.pipeline, exc, run_id=runner.run_id, trigger=trigger, stages=runner.session.stages,
                started_at=started, duration=time.monotonic() - clock))
        raise


def _notifications(pipeline: Pipeline, trigger: str, listener: Listener) -> list[Listener]:
    """What `notify:` asks for, subscribed to a run's events (each delivery told to `listener`)."""
    from .ops.notify import Notifications

    return [Notifications(pipeline, trigger, listener)]


def read(pipeline: PipelineLike, dataset: str, engine: str = "pandas", *, version: str | None = None):
    """The current published version of a dataset (or `version`, an id from `hybridflow show`):
    engine "pandas" (a DataFrame with the dtypes a python stage gets), "arrow" (a pyarrow Table), or
    "path" (its version directory; what a `kind: files` dataset always gives)."""
    from .data.storage import uri_of
    from .diagnostics import did_you_mean
    from .store.workspace import Workspace

    loaded = _pipeline(pipeline)
    known = set(loaded.spec.datasets) | {ds for s in loaded.stages.values() for ds in s.outputs}
    if dataset not in known or loaded.is_external(dataset):
        where = "an external input, read it from its own path" if dataset in known else \
            f"no dataset named '{dataset}'{did_you_mean(dataset, known)}"
        raise UsageError(f"cannot read '{dataset}': {where}", hint="read() gives a published output of a stage")
    if engine not in ("pandas", "arrow", "path"):
        raise UsageError(f"engine must be pandas, arrow or path, not '{engine}'")
    catalog = Workspace.of(loaded).catalog()
    found = catalog.version(dataset, version) if version else catalog.current(dataset)
    if found is None:
        producer = loaded.dag.producer[dataset]
        raise UsageError(f"dataset '{dataset}' has no published version yet",
                         hint=f"run stage '{producer}' first: hybridflow run {loaded.file} --to {producer}")
    if loaded.dataset(dataset).kind == "files":  # a folder, also from object storage (downloaded once)
        return catalog.local_copy(found)
    if engine == "path":  # in object storage: its s3:// URI
        return found.directory if loaded.remote is None else uri_of(found.directory)
    from .data.tables import read_arrow

    table = read_arrow(found.source())
    if engine == "arrow":
        return table
    from .backends.pandas_frames import to_pandas

    return to_pandas(table)


def check(pipeline: PipelineLike, datasets: Names | None = None) -> list[dict[str, Any]]:
    """Run the declared data checks of `datasets` (default: every dataset that declares any) against
    what is published now, or an external input's files, without running a stage. Returns each
    outcome as a record (its "status" is passed, warned, failed or dropped, and "line" says why)."""
    from .execution.checkcommand import check_datasets
    from .execution.inputs import StageInputs
    from .execution.planner import Planner
    from .store.workspace import Workspace

    loaded = _pipeline(pipeline)
    workspace = Workspace.of(loaded)
    catalog = workspace.catalog()
    inputs = StageInputs(workspace, Planner(loaded, workspace, False))
    return [{**o.record(), "dataset": o.dataset, "line": o.line()}
            for o in check_datasets(loaded, catalog, inputs, list(_names(datasets)))]


def runs(pipeline: PipelineLike | None = None, *, workdir: str | os.PathLike = ".hybridflow",
         limit: int = 20, stages: bool = False, missing_ok: bool = True) -> list[dict[str, Any]]:
    """Run records, newest first: of one pipeline (a file or a loaded one), else of every pipeline in
    `workdir`. Each is a dict (run_id, pipeline, status, trigger, started_at, ended_at, error,
    run_dir, ...); with stages=True each also has "stages": its stage records in run order. Where no
    run was ever recorded: [], or UsageError with missing_ok=False."""
    _, store, name, looked = _records(pipeline, workdir, newest=limit)
    if store is None:
        if not missing_ok:
            raise _no_records(looked)
        return []
    found = store.runs(name, limit)
    if stages:
        for record in found:
            record["stages"] = store.stages(record["run_id"])
    return found


def report(run_id: str = "last", pipeline: PipelineLike | None = None, *, workdir: str | os.PathLike = ".hybridflow",
           out: str | os.PathLike | None = None) -> Path:
    """Write one run (an id, a unique prefix of one, or "last": the newest run of `pipeline`, else of
    `workdir`) as a self-contained HTML report with its timeline; returns the file's path (default:
    report.html in the run's directory)."""
    from .reporting import htmlreport

    loaded = _pipeline(pipeline) if pipeline is not None else None
    workspace, store, run = _find_run(run_id, loaded, workdir)
    return htmlreport.write(store, run, Path(out) if out else None, pipeline=loaded,
                            catalog=workspace.published_by(run))


def run_record(run_id: str = "last", pipeline: PipelineLike | None = None, *,
               workdir: str | os.PathLike = ".hybridflow") -> dict[str, Any]:
    """One run's record (an id, a unique prefix of one, or "last", as for report()), with "stages":
    its stage records in run order, and "spans": its timeline (engine starts, attempts, publishes)."""
    _, store, run = _find_run(run_id, pipeline, workdir)
    return {**run, "stages": store.stages(run["run_id"]), "spans": store.spans(run["run_id"])}


def stage_logs(run_id: str = "last", pipeline: PipelineLike | None = None, *, stage: str | None = None,
               workdir: str | os.PathLike = ".hybridflow") -> list[tuple[str, Path]]:
    """(stage, log file) of each stage of a run that wrote a log, or of `stage` only; a run recorded
    by another machine (its workdir in object storage) has its logs fetched first."""
    from .diagnostics import did_you_mean

    workspace, store, run = _find_run(run_id, pipeline, workdir)
    workspace.fetch_run_dir(run)  # a run made on another machine: its logs are in the workdir
    logged = [(row["stage"], Path(row["log_path"])) for row in store.stages(run["run_id"]) if row["log_path"]]
    if stage is None:
        return logged
    chosen = [item for item in logged if item[0] == stage]
    if not chosen:
        raise UsageError(f"run {run['run_id']} has no log for stage '{stage}'"
                         f"{did_you_mean(stage, [name for name, _ in logged])}")
    return chosen


def _find_run(run_id: str, pipeline: PipelineLike | None, workdir: str | os.PathLike):
    """(the workspace, its run store, a run's record) by id or unique prefix; "last" is the newest
    run (of the pipeline, or of the whole workdir)."""
    workspace, store, name, looked = _records(pipeline, workdir)
    if store is None:
        raise _no_records(looked)
    if run_id == "last":
        run = store.last_run(name)
        if run is None:
            of = f"of {name} " if name else ""
            raise UsageError(f"no run {of}is recorded in {store.path}", hint="hybridflow run PIPELINE.yaml starts one")
        return workspace, store, run
    run = store.run(run_id)
    if run is None:
        raise UsageError(f"no single run matches '{run_id}' in {store.path}", hint="hybridflow runs lists them")
    return workspace, store, run


def _no_records(workdir: str | os.PathLike) -> UsageError:
    return UsageError(f"no run records in {workdir}", hint="pass --workdir, or --pipeline PIPELINE.yaml")


def _records(pipeline: PipelineLike | None, workdir: str | os.PathLike, newest: int = 1):
    """(the workspace, its run store, the pipeline's name, the workdir looked in) for a pipeline,
    else (the workdir's workspace and store, None, the workdir); the store is None where no run was
    ever recorded."""
    from .data.storage import scheme_problem
    from .store.workspace import Workspace

    if pipeline is not None:
        loaded = _pipeline(pipeline)
        workspace = Workspace.of(loaded)
        looked = loaded.remote.uri if loaded.remote is not None else loaded.workdir
        return workspace, workspace.recorded_runs(newest), loaded.name, looked
    wrong = scheme_problem(os.fspath(workdir))
    if wrong is not None:
        raise UsageError(f"--workdir {wrong}")
    workspace = Workspace.named(os.fspath(workdir))
    return workspace, workspace.recorded_runs(newest), None, workdir


def clusters(pipeline: PipelineLike) -> list[dict[str, Any]]:
    """The clusters the pipeline's runs brought up (backends.<engine>.cluster) that are not down yet,
    as recorded in its workdir, oldest first: each a dict of engine, run_id, state ("starting", "up",
    "down failed"), cluster (what `up` printed), created_at and age (seconds)."""
    from .execution.provisioning import age
    from .store.workspace import Workspace

    loaded = _pipeline(pipeline)
    records = Workspace.of(loaded).cluster_records()
    found = sorted(records.all().values(), key=lambda record: record.get("created_at", ""))
    return [{**record, "age": age(record)} for record in found]


def reap_clusters(pipeline: PipelineLike) -> tuple[list[dict[str, Any]], list[str]]:
    """Take down the clusters left up by runs that died (a kill -9, an OOM kill): under the run lock,
    so never while a run of the pipeline lives (LockedError then). Returns the records of the clusters
    taken down, and what could not be taken down (their records stay). Every run does this first."""
    from .execution.provisioning import reap
    from .store.workspace import Workspace

    loaded = _pipeline(pipeline)
    workspace = Workspace.of(loaded)
    records = workspace.cluster_records()
    if not records.all():
        return [], []
    home = workspace.home
    home.mkdir(parents=True, exist_ok=True)  # a workdir in object storage: this machine's cache of it
    workspace.require_trusted()
    lock = workspace.lock()
    lock.acquire(f"reap-{new_run_id()}")
    try:
        return reap(loaded, records, home / "cluster-reap.log", lock.confirm)
    finally:
        lock.release()


def collect_garbage(pipeline: PipelineLike, keep: int | None = None, dry_run: bool = False) -> list[tuple[str, str]]:
    """Remove old dataset versions (all but the newest `keep`, default the pipeline's keep_versions),
    never a current one or one the current versions were made from, and the temporary files of
    writers that died; under the run lock, so never while the pipeline runs. Returns the (dataset,
    version) pairs removed (or that would be)."""
    from .store.workdir import claim, remove_leftovers
    from .store.workspace import Workspace

    if keep is not None and keep < 1:
        raise UsageError(f"keep must be 1 or more, not {keep}", hint="the current version is always kept")
    loaded = _pipeline(pipeline)
    home = loaded.workdir / loaded.name
    if loaded.workdir.exists():  # not a file, nor a folder of the user's own files that only looks like one
        claim(loaded.workdir)
    if loaded.remote is not None:
        claim(loaded.workdir)  # this machine's cache of it, made on demand
        home.mkdir(exist_ok=True)
    if not home.is_dir():
        return []  # never run: nothing to remove, and no workdir to make
    workspace = Workspace.of(loaded)
    workspace.require_trusted()
    lock = workspace.lock()
    lock.acquire(f"gc-{new_run_id()}")
    try:
        catalog = workspace.catalog()
        catalog.confirm = lock.confirm  # nothing is deleted once the lease is lost
        removed = catalog.collect_garbage(keep or loaded.spec.keep_versions, dry_run=dry_run)
        if not dry_run:
            remove_leftovers(home)
        return removed
    finally:
        lock.release()


def validate(paths: Iterable[str | os.PathLike], params: Params = None) -> tuple[list[Path], list[Any]]:
    """Check pipeline files (directories: every *.yaml and *.yml below them) without stopping at the
    first problem: (the files checked, every problem found, each a diagnostics.Problem with its
    file:line:col and severity). Raises ConfigError when no file is found."""
    from .definition.config import check_file

    given = [Path(path) for path in paths]
    files: list[Path] = []
    for path in given:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
        else:
            files.append(path)
    if not files:
        raise ConfigError(f"no *.yaml or *.yml files under {', '.join(map(str, given))}")
    problems: list[Any] = []
    for file in files:
        problems += check_file(file, _param_strings(params))[1]
    return files, problems


def graph(pipeline: PipelineLike, format: str = "mermaid", out: str | os.PathLike | None = None) -> str | Path:
    """The pipeline's graph: Mermaid or Graphviz DOT text, or an SVG or PNG picture drawn by Graphviz
    into `out` (its path returned)."""
    from .reporting import diagram

    if format in diagram.PICTURES:
        if out is None:
            raise ConfigError(f"--format {format} draws a picture: say where with --out FILE")
        return diagram.picture(_pipeline(pipeline), format, Path(out))
    render = {"mermaid": diagram.mermaid, "dot": diagram.dot}.get(format)
    if render is None:
        raise ConfigError(f"--format must be mermaid, dot, svg or png, not '{format}'")
    return render(_pipeline(pipeline))


def schema() -> dict[str, Any]:
    """The JSON Schema of pipeline files, every registered engine's settings included."""
    from .definition.model import json_schema

    return json_schema()


def init(directory: str | os.PathLike, engines: Iterable[str] = ()) -> list[Path]:
    """A new project in `directory` (new or empty) that validates and runs at once: pipeline.yaml, a
    stage module per engine (default: python), a sample dataset, a test, a README. Returns the files."""
    from .engines import DEFAULT
    from .ops.scaffold import create

    return create(Path(directory), list(engines) or [DEFAULT])


def diagnose(pipeline: PipelineLike | None = None, environ: Mapping[str, str] | None = None) -> list[Any]:
    """Can this machine run the pipeline (every engine, without one), unattended too? Each check's
    findings (doctor.Finding: check, status ok/warning/error, detail, fix), in `environ` (default:
    this process's; cron gives a run almost nothing)."""
    from .ops.doctor import run_checks

    return run_checks(_pipeline(pipeline) if pipeline is not None else None, environ)


def install_schedule(pipeline: PipelineLike):
    """Write the pipeline's schedule: into the user's crontab, replacing its previous line and no
    other; returns the installed entry (schedule.Entry: pipeline, file, cron, timezone, log)."""
    from .ops import schedule as schedules

    return schedules.install(_pipeline(pipeline))


def is_due(pipeline: PipelineLike) -> bool:
    """Whether the pipeline's schedule: falls on this minute in its time zone (what a cron line asks
    before it runs: cron may call it on minutes the schedule does not fall on)."""
    from .ops.schedule import is_due_now

    return is_due_now(_pipeline(pipeline))


def scheduled_invocation(pipeline: PipelineLike, *, if_due: bool, params: Params = None):
    """What a scheduled invocation does now (ops/calendar.Invocation: the ticks to run for, each with
    its calendar notes, or a hold), from the run records; None for a pipeline without a schedule."""
    from .ops import calendar

    loaded = _pipeline(pipeline, params)
    return calendar.plan(loaded, if_due) if loaded.spec.schedule is not None else None


def hold(pipeline: PipelineLike, invocation, listener: Listener | None = None) -> dict[str, Any]:
    """Record a held tick (invocation.held) and notify it; returns its record."""
    from .ops import calendar
    from .ops.notify import Notifications, held_summary

    loaded = _pipeline(pipeline)
    record = calendar.record_held(loaded, invocation)
    Notifications(loaded, "cron", listener or Listener()).send(held_summary(loaded, record))
    return record


def release_schedule(pipeline: PipelineLike) -> str:
    """Let the next tick of a schedule held after a failure run; returns the failed run's id."""
    from .ops import calendar

    return calendar.release(_pipeline(pipeline))


def backfill(pipeline: PipelineLike, partitions: str | None = None, *, chunk: int = 0, reprocess: str = "all",  # noqa: PLR0913 - the backfill's options, one per CLI flag
             resume: bool = False, dry_run: bool = False, wait: bool = False, only: Names | None = None,
             to: Names | None = None, listener: Callable[[], Listener] | None = None, notify: bool = True,
             exit_when_stuck: bool = False):
    """Reprocess chosen partitions of the incremental stages and rerun what depends on them
    (ops/backfill.py): `partitions` "column=low..high" or "column=a,b,c"; `chunk` partitions per run
    (0: one run); `reprocess` missing, failed or all; `resume` runs the last backfill's unfinished
    chunks; `only`/`to` limit the stages each chunk runs, as for run(), and so does exit_when_stuck.
    Returns backfill.Outcome (each chunk's RunResult), or backfill.DryRun when dry_run."""
    from .ops import backfill as backfills

    loaded = _pipeline(pipeline)
    selection = {"only": list(_names(only)), "to": list(_names(to))}
    if dry_run:
        return backfills.dry_run(loaded, partitions, chunk=chunk, reprocess=reprocess, selection=selection)
    plan, done = backfills.prepare(loaded, partitions, chunk=chunk, reprocess=reprocess, resume=resume,
                                   selection=selection)
    listen = listener or Listener
    return backfills.run(loaded, plan, done, listen, wait=wait, exit_when_stuck=exit_when_stuck,
                         subscribers=lambda p: _notifications(p, backfills.TRIGGER, Listener()) if notify else [])


def schedule_state(pipeline: PipelineLike) -> str:
    """A scheduled pipeline's calendar in a few words: held (and why), ticks missed, or ok."""
    from .ops import calendar

    held, missed = calendar.state(_pipeline(pipeline))
    return held or (f"{len(missed)} tick(s) missed" if missed else "ok")


def schedules() -> list[tuple[Any, list[datetime]]]:
    """Each hybridflow schedule in the user's crontab, with its next two runs."""
    from .ops import schedule as schedules

    return [(entry, schedules.next_runs(entry)) for entry in schedules.installed()]


def remove_schedule(target: str | os.PathLike):
    """Remove a pipeline's line (by its file or its name) from the user's crontab; returns its entry."""
    from .ops import schedule as schedules

    return schedules.remove(os.fspath(target))
