"""The `hybridflow` command. The only module that prints, and the one place errors become exit codes.

Engines are never imported here: `hybridflow --help` and `validate` stay fast.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import List, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from .errors import ConfigError, ExitCode, HybridflowError, UnavailableError, UsageError, counted, storage_error
from .ops.completion import LAST_RUN, run_ids, stage_lists, stage_names
from .registry import BUILT_IN

# what a --force value looks like: stage names (identifiers), comma-separated
STAGE_LIST = re.compile(r"\s*[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s*,?\s*", re.ASCII)


def _bare_force(argv: list[str]) -> list[str]:
    """`--force` alone means every stage: give it the value '*'. A typer option cannot take an optional
    value, so the parser would swallow the next word (`plan --force x.yaml` -> "Missing argument
    'PIPELINE.yaml'"). The next word is --force's value only if it reads as stage names and is not a file."""
    fixed = list(argv)
    for i, arg in enumerate(fixed):
        if arg == "--":
            break
        if arg == "--force":
            value = fixed[i + 1] if i + 1 < len(fixed) else None
            if value is None or not STAGE_LIST.fullmatch(value) or Path(value).is_file():
                fixed[i] = "--force=*"
    return fixed


class _Commands(TyperGroup):
    """The root command group. Rewrites a bare --force before any parsing, so that every way in (the
    console script, `python -m hybridflow.cli`, tests through CliRunner) gets the same meaning."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _bare_force(args))


app = typer.Typer(
    name="hybridflow",
    cls=_Commands,
    help="Run each stage of a pipeline on the engine that suits it: Spark, Dask, Ray or plain Python.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion: commands, options, stages, run ids
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)
for _console in (out, err):
    if not _console.is_terminal and "COLUMNS" not in os.environ:
        _console.width = 160  # logs and pipes: Rich's 80 columns would fold run ids and paths

VerboseOption = typer.Option(False, "--verbose", "-v", help="Show full tracebacks.")
ParamOption = typer.Option(None, "--param", "-p", metavar="KEY=VALUE",
                           help="Override a param: key=value (pipeline-wide) or stage.key=value.")

EXIT_CODES_HELP = "Exit codes: " + ", ".join(f"{c.value} {c.name.lower().replace('_', ' ')}" for c in ExitCode)


def _guarded(command):
    """Turn hybridflow errors into one line on stderr plus their exit code."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        verbose = kwargs.get("verbose", False)
        try:
            return command(*args, **kwargs)
        except typer.Exit:
            raise
        except HybridflowError as exc:
            if verbose:
                err.print_exception()
            if isinstance(exc, ConfigError) and exc.located:  # file:line:col: error: ..., labelled already
                err.print(escape(exc.one_line()), soft_wrap=True)
            else:
                err.print(f"[bold red]error:[/] {escape(exc.one_line())}", soft_wrap=True)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except Exception as exc:  # a bug in hybridflow: say so plainly
            raise typer.Exit(_unexpected(exc, verbose)) from None

    return wrapper


def _unexpected(exc: Exception, verbose: bool) -> int:
    """An error no hybridflow code raised: a full, read-only or not writable disk is not a bug (where,
    and how to fix it); anything else is one. Printed as one line; the exit code returned."""
    if verbose:
        err.print_exception()
    storage = storage_error(exc, getattr(exc, "filename", None) or Path.cwd())
    if storage is not None:
        err.print(f"[bold red]error:[/] {escape(storage.one_line())}", soft_wrap=True)
        return int(storage.exit_code)
    err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
              "(rerun with --verbose for the traceback, and please report it)", soft_wrap=True)
    return int(ExitCode.INTERNAL)


@app.command()
@_guarded
def validate(
    paths: List[Path] = typer.Argument(..., help="Pipeline files, or directories to search for *.yaml/*.yml."),
    format: str = typer.Option("text", "--format", help="text or json"),
    params: Optional[List[str]] = ParamOption,
    verbose: bool = VerboseOption,
) -> None:
    """Check pipeline files and report every problem as file:line:col."""
    from . import api
    from .diagnostics import errors_in

    if format not in ("text", "json"):
        raise ConfigError(f"--format must be text or json, not '{format}'")
    files, problems = api.validate(paths, params)
    errors = errors_in(problems)
    if format == "json":
        out.print_json(json.dumps({"valid": not errors, "files": [str(f) for f in files],
                                   "problems": [p.as_dict() for p in problems]}))
    else:
        for problem in problems:
            style = "red" if problem.severity == "error" else "yellow"
            out.print(f"{escape(problem.file)}:{problem.line}:{problem.col}: [{style}]{problem.severity}[/]: "
                      f"{escape(problem.message)}", soft_wrap=True)
        warnings = len(problems) - len(errors)
        verdict = "[green]valid[/]" if not errors else "[red]invalid[/]"
        out.print(f"{counted(len(files), 'file')} checked: {verdict} "
                  f"({counted(len(errors), 'error')}, {counted(warnings, 'warning')})")
    if errors:
        raise typer.Exit(int(ExitCode.CONFIG))


OnlyOption = typer.Option(None, "--only", help="Run only this stage (repeatable).", autocompletion=stage_names)
FromOption = typer.Option(None, "--from", help="Run this stage and everything after it.", autocompletion=stage_names)
ToOption = typer.Option(None, "--to", help="Run this stage and everything before it.", autocompletion=stage_names)
ForceOption = typer.Option(None, "--force", metavar="[STAGE,...]", autocompletion=stage_lists,
                           help="Run stages even if they are up to date: all of them (a bare --force, anywhere "
                                "on the line), or the stages named (comma-separated).")
RunWorkdirOption = typer.Option(None, "--workdir", "-w", envvar="HYBRIDFLOW_WORKDIR", show_envvar=True,
                                help="Use this workdir instead of the pipeline file's workdir: (relative to the "
                                     "current directory).")


def _use_workdir(workdir: str | None) -> None:
    """--workdir (or HYBRIDFLOW_WORKDIR) for every load of the pipeline in this command, its run's
    process included: the pipeline loader reads it from the environment."""
    if workdir is not None:
        from . import api

        os.environ[api.WORKDIR_VARIABLE] = workdir


KeepGoingOption = typer.Option(False, "--keep-going", "-k", help="After a failure, still run stages that do not "
                               "depend on it.")


@app.command()
@_guarded
def plan(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    only: Optional[List[str]] = OnlyOption,
    start: Optional[List[str]] = FromOption,
    end: Optional[List[str]] = ToOption,
    params: Optional[List[str]] = ParamOption,
    force: Optional[str] = ForceOption,
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Show which stages a run would execute or skip, and why. Starts no engine."""
    from . import api

    _use_workdir(workdir)

    _print_plan(api.plan(pipeline_file, only=only, from_=start, to=end, force=force, params=params))


@app.command()
@_guarded
def run(  # noqa: PLR0913 - a typer command takes one parameter per option
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    only: Optional[List[str]] = OnlyOption,
    start: Optional[List[str]] = FromOption,
    end: Optional[List[str]] = ToOption,
    params: Optional[List[str]] = ParamOption,
    force: Optional[str] = ForceOption,
    resume: bool = typer.Option(False, "--resume", help="Continue the last run if it failed or was interrupted: "
                                "same stages and --param values; finished stages are skipped."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and run nothing."),
    keep_going: bool = KeepGoingOption,
    wait: bool = typer.Option(False, "--wait", help="Wait for another run of this pipeline to finish."),
    trigger: str = typer.Option("manual", "--trigger", help="Recorded with the run: manual or cron."),
    if_due: bool = typer.Option(False, "--if-due", help="Exit 0 without running unless schedule.cron is due "
                                "this minute in schedule.timezone, or a tick was missed (the cron lines use it)."),
    for_: Optional[str] = typer.Option(None, "--for", help="The time the run is for, e.g. 2026-11-22T03:00 (in "
                                       "schedule.timezone): ${run.scheduled_for} and ctx.scheduled_for. "
                                       "Default: now; a scheduled run: the tick it serves."),
    watch: bool = typer.Option(False, "--watch", help="Keep the engines running and run again on each save of "
                               "the pipeline file, of the stage code it reaches or of an external input; "
                               "Ctrl-C stops."),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Validate a pipeline, then run its stages in dependency order."""
    from . import api
    from .reporting.progress import listener_for

    _use_workdir(workdir)

    if watch:
        clashing = [flag for flag, given in (("--resume", resume), ("--dry-run", dry_run), ("--if-due", if_due),
                                             ("--wait", wait), ("--trigger cron", trigger != "manual"),
                                             ("--for", for_)) if given]
        if clashing:
            raise UsageError(f"--watch cannot be combined with {clashing[0]}",
                             hint="--watch runs on each save; run without it for a one-off run")
        _watch(pipeline_file, only=only, start=start, end=end, params=params, force=force, keep_going=keep_going,
               verbose=verbose)
        return

    if trigger not in ("manual", "cron"):
        raise ConfigError(f"--trigger must be manual or cron, not '{trigger}'")
    ticks = [(for_, None)]
    if (if_due or trigger == "cron") and not (resume or dry_run or for_):
        ticks = _scheduled_ticks(pipeline_file, params, if_due)
        trigger = "cron"

    def run_it() -> None:
        for moment, notes in ticks:  # a catch-up of every missed tick runs them in order, stopping at a failure
            result = api.run(pipeline_file, only=only, from_=start, to=end, params=params, force=force,
                             resume=resume, keep_going=keep_going, dry_run=dry_run, wait=wait, trigger=trigger,
                             listener=_RunReport(listener_for(err)), exit_when_stuck=True, scheduled_for=moment,
                             calendar=notes)
            if isinstance(result, api.Plan):
                _print_plan(result)
            elif result is not None and result.error is not None:
                raise typer.Exit(result.exit_code)

    if dry_run:
        run_it()  # runs no stage
    else:
        _supervised(run_it, pipeline_file, verbose)


@app.command("resume")
@_guarded
def resume_run(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    keep_going: bool = KeepGoingOption,
    wait: bool = typer.Option(False, "--wait", help="Wait for another run of this pipeline to finish."),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Continue the last run if it failed or was interrupted (run --resume); its success lifts a held schedule."""
    run(pipeline_file, only=None, start=None, end=None, params=None, force=None, resume=True, dry_run=False,
        keep_going=keep_going, wait=wait, trigger="manual", if_due=False, for_=None, watch=False, workdir=workdir,
        verbose=verbose)


@app.command()
@_guarded
def backfill(  # noqa: PLR0913 - a typer command takes one parameter per option
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    partitions: Optional[str] = typer.Option(None, "--partitions", help="Partitions of an incremental stage's "
                                             "input to process again: column=low..high or column=a,b,c."),
    chunk: int = typer.Option(0, "--chunk", help="Partitions per run; each chunk commits on its own (0: one run)."),
    resume: bool = typer.Option(False, "--resume", help="Run the chunks the last backfill did not finish."),
    reprocess: str = typer.Option("all", "--reprocess", help="Which partitions of the range: missing (never "
                                  "processed), failed (in the last backfill's failed chunks) or all."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the partitions (with their rows) and stages; "
                                 "run nothing."),
    wait: bool = typer.Option(False, "--wait", help="Wait for another run of this pipeline to finish."),
    only: Optional[List[str]] = OnlyOption,
    end: Optional[List[str]] = ToOption,
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Reprocess chosen partitions of the incremental stages (every other one kept), and what depends on them."""
    from . import api
    from .reporting.progress import backfill_lines, listener_for

    _use_workdir(workdir)
    if dry_run:
        for line in backfill_lines(api.backfill(pipeline_file, partitions, chunk=chunk, reprocess=reprocess,
                                                dry_run=True, only=only, to=end)):
            out.print(line, soft_wrap=True, markup=False)
        return

    def run_it() -> None:
        outcome = api.backfill(pipeline_file, partitions, chunk=chunk, reprocess=reprocess, resume=resume,
                               wait=wait, only=only, to=end, listener=lambda: _RunReport(listener_for(err)))
        done = f"; chunks {', '.join(map(str, outcome.skipped))} were done already" if outcome.skipped else ""
        out.print(f"backfill {outcome.backfill.id}: {len(outcome.results)} of {len(outcome.backfill.chunks)} "
                  f"chunk(s) run{done}", soft_wrap=True, markup=False)
        if outcome.failed is not None:
            err.print(f"resume with: hybridflow backfill {pipeline_file} --resume", soft_wrap=True, markup=False)
            raise typer.Exit(outcome.failed.exit_code)

    _supervised(run_it, pipeline_file, verbose, "backfill")


def _scheduled_ticks(pipeline_file: Path, params, if_due: bool) -> list:
    """(tick, calendar notes) for each run a scheduled invocation makes now: none when nothing is due
    or the schedule is held (the hold recorded, notified and said in one line)."""
    from . import api

    invocation = api.scheduled_invocation(pipeline_file, if_due=if_due, params=params)
    if invocation is None:  # no schedule: a --trigger cron run runs now; --if-due says what is missing
        if if_due and not api.is_due(pipeline_file):
            return []
        return [(None, None)]
    if invocation.held:
        api.hold(pipeline_file, invocation, _RunReport(None))
        err.print(f"{invocation.held}; resume with: hybridflow run {pipeline_file} --resume, or let the next "
                  f"tick run: hybridflow schedule release {pipeline_file}", soft_wrap=True, markup=False)
    elif not invocation.ticks and not if_due:  # an every-minute --if-due line stays quiet when nothing is due
        err.print(f"nothing to run: a run has served the schedule's latest tick already; to run now: "
                  f"hybridflow run {pipeline_file}", soft_wrap=True, markup=False)
    return list(zip(invocation.ticks, invocation.notes))


@app.command()
@_guarded
def dev(  # noqa: PLR0913 - a typer command takes one parameter per option
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    only: Optional[List[str]] = OnlyOption,
    start: Optional[List[str]] = FromOption,
    end: Optional[List[str]] = ToOption,
    params: Optional[List[str]] = ParamOption,
    force: Optional[str] = ForceOption,
    keep_going: bool = KeepGoingOption,
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Warm iteration (the same as run --watch): run, then again on each save of the pipeline file, of
    the stage code it reaches or of an external input, on engines kept running; Ctrl-C stops them."""
    _use_workdir(workdir)
    _watch(pipeline_file, only=only, start=start, end=end, params=params, force=force, keep_going=keep_going,
           verbose=verbose)


def _watch(pipeline_file: Path, *, only, start, end, params, force, keep_going: bool, verbose: bool) -> None:
    from . import api

    _supervised(lambda: api.watch(pipeline_file, only=only, from_=start, to=end, params=params, force=force,
                                  keep_going=keep_going, report=_WatchReport(), exit_when_stuck=True),
                pipeline_file, verbose)


_supervising = False  # set by main(): the command's own process (tests calling `app` in-process never fork)


def _supervised(work, pipeline_file: Path, verbose: bool, command: str = "run") -> None:
    """`work()` (runs of `pipeline_file`) in a child process that this one supervises (supervisor.py):
    a run whose process ends without recording its end is recorded here, and named in one line."""
    from .execution import supervisor

    if not (_supervising and supervisor.available()):
        work()
        return
    outcome = supervisor.supervise(lambda: _exit_code_of(work, verbose))
    if outcome.unfinished is None:
        raise typer.Exit(outcome.exit_code)
    from . import api

    raise api.record_crash(pipeline_file, outcome.unfinished, outcome.death, command)


def _exit_code_of(work, verbose: bool) -> int:
    """In the run's process: `work()` with its errors printed as the command prints them, then the
    command's own end (threads joined, exit handlers run, output flushed); its exit code."""
    try:
        _guarded(lambda verbose: work())(verbose=verbose)
        code = 0
    except SystemExit as done:  # typer.Exit is not one: it is click's
        code = _code_of(done.code)
    except typer.Exit as done:
        code = done.exit_code
    _end_the_process_lightly()
    return code


class _RunReport:
    """Progress while a run goes; its summary once its record is final (also when a stuck stage forces
    the run to end, and the process exits right after); what the API reports besides."""

    def __init__(self, progress) -> None:
        self.progress = progress

    def __getattr__(self, name: str):
        return getattr(self.progress, name)  # run_started, engine_started, stage_changed, close

    def resuming(self, run_id: str, status: str) -> None:
        err.print(f"resuming run {run_id} ({status})", markup=False)

    def nothing_to_resume(self, reason: str) -> None:
        out.print(f"nothing to resume: {reason}")

    def notified(self, delivery) -> None:
        if delivery.ok:
            err.print(f"[dim]notified by {delivery.channel}: {escape(delivery.detail)}[/]", soft_wrap=True)
        else:
            err.print(f"[yellow]warning:[/] notification by {delivery.channel} failed: {escape(delivery.detail)}",
                      soft_wrap=True)

    def run_started(self, run_id, stages) -> None:
        from .execution import supervisor

        supervisor.run_began(run_id)
        self.progress.run_started(run_id, stages)

    def run_finished(self, result) -> None:
        from .execution import supervisor
        from .reporting.progress import summary_line, summary_table

        supervisor.run_ended(result.run_id)
        self.progress.close()
        out.print(summary_table(result))
        out.print(summary_line(result))
        report = _report_line(result)
        if report:
            out.print(report, soft_wrap=True, markup=False)
        for stage in result.failed:
            err.print(f"[bold red]{stage.name} failed:[/] {escape(stage.error or '')}", soft_wrap=True)
            err.print(f"  log: {stage.log_path}", soft_wrap=True, markup=False)
        if result.resume_command:
            err.print(f"resume with: {result.resume_command}", soft_wrap=True, markup=False)
        for warning in result.warnings:
            err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def _report_line(result) -> str | None:
    """Where the run wrote its report.html, and the command that opens it; None where it wrote none
    (report: false, or writing it failed)."""
    import shlex

    from .reporting.htmlreport import REPORT_FILE

    path = Path(result.run_dir) / REPORT_FILE
    if not path.is_file():
        return None
    workdir = Path(result.run_dir).parents[2]  # <workdir>/<pipeline>/runs/<run>
    option = "" if workdir == Path(".hybridflow").resolve() else f" -w {shlex.quote(str(workdir))}"
    return f"report: {path} (hybridflow report{option} --open opens it)"


class _WatchReport:
    """A watch session in the terminal: each run's progress and summary as `run` prints them, and
    what the session waits for between runs."""

    def listener(self):
        from .reporting.progress import listener_for

        return _RunReport(listener_for(err))

    def waiting(self, files) -> None:
        err.print(f"[dim]watching {len(files)} files for changes (Ctrl-C stops)[/]")

    def changed(self, files) -> None:
        names = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        err.print(f"changed: {escape(names)}", soft_wrap=True)

    def invalid(self, error) -> None:
        if isinstance(error, ConfigError) and error.located:  # file:line:col: error: ..., labelled already
            err.print(escape(error.one_line()), soft_wrap=True)
        else:
            err.print(f"[bold red]error:[/] {escape(error.one_line())}", soft_wrap=True)

    def notice(self, text: str) -> None:
        err.print(f"[dim]{escape(text)}[/]", soft_wrap=True)


def _print_plan(plan) -> None:
    from .reporting.progress import plan_table

    out.print(plan_table(plan.pipeline, plan.decisions))
    for stage, item in plan.missing:
        out.print(f"[red]missing input[/] {item.dataset} of stage {stage}: {escape(item.detail)}", soft_wrap=True)
    runs = len(plan.to_run)
    out.print(f"{runs} of {counted(len(plan.decisions), 'stage')} to run, {len(plan.decisions) - runs} up to date")
    for engine, cluster in plan.clusters.items():
        out.print(f"would bring up a {engine} cluster ({cluster})", soft_wrap=True, markup=False)


@app.command()
@_guarded
def init(
    directory: Path = typer.Argument(..., metavar="DIR", help="A new (or empty) directory for the project."),
    engines: str = typer.Option("", "--engines", help="Engines to give a stage each, comma-separated: "
                                f"{', '.join(BUILT_IN)} or a plugin's (python always cleans the sample first)."),
    verbose: bool = VerboseOption,
) -> None:
    """Create a project that validates and runs at once: pipeline.yaml, a stage module per engine,
    a sample dataset, a test that runs the pipeline, and a README."""
    from . import api

    written = api.init(directory, [e.strip() for e in engines.split(",") if e.strip()])
    for path in written:
        out.print(f"created {path}", markup=False, soft_wrap=True)
    out.print(f"next: cd {directory} && hybridflow run pipeline.yaml", markup=False, soft_wrap=True)


@app.command()
@_guarded
def check(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    datasets: Optional[list[str]] = typer.Argument(None, metavar="[DATASET]...",
                                                   help="Datasets to check (default: every one that declares checks)."),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Run the declared data checks against what is published now (and external inputs), without
    running a stage: exit 0 when no error-level check fails, 65 when one does."""
    from . import api

    _use_workdir(workdir)
    outcomes = api.check(pipeline_file, datasets or None)
    for o in outcomes:
        shown = o["line"] if o["status"] != "passed" else f"dataset '{o['dataset']}': check '{o['check']}' passed"
        out.print(f"{o['status']:>7}  {shown}", markup=False, soft_wrap=True)
    failed = [o for o in outcomes if o["status"] == "failed"]
    out.print(f"{counted(len(outcomes), 'check')}, {len(failed)} failed", markup=False)
    if failed:
        raise typer.Exit(int(ExitCode.DATA))


@app.command()
@_guarded
def gc(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    keep: Optional[int] = typer.Option(None, "--keep", min=1, help="Versions to keep per dataset "
                                       "(default: the pipeline's keep_versions)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed."),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Remove old dataset versions, never a current one or one the current versions were made from."""
    from . import api

    _use_workdir(workdir)

    pipeline = api.load(pipeline_file)
    keep = keep or pipeline.spec.keep_versions
    removed = api.collect_garbage(pipeline, keep, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for dataset, version in removed:
        out.print(f"{verb} {dataset}@{version}", markup=False)
    out.print(f"{verb} {counted(len(removed), 'version')} (keeping {keep} per dataset and every version in use)")


@app.command()
@_guarded
def graph(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    format: str = typer.Option("mermaid", "--format", help="mermaid or dot (text on stdout), or svg or png "
                               "(a picture drawn by Graphviz into --out)"),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="The picture's file (svg and png)."),
    verbose: bool = VerboseOption,
) -> None:
    """Print the pipeline's graph as Mermaid (default) or Graphviz DOT, or draw it as SVG or PNG."""
    from . import api

    drawn = api.graph(pipeline_file, format, out_file)
    if isinstance(drawn, Path):  # a picture, drawn into --out
        out.print(str(drawn), markup=False, soft_wrap=True)
    else:
        sys.stdout.write(drawn)


@app.command()
@_guarded
def schema(verbose: bool = VerboseOption) -> None:
    """Print the JSON Schema of pipeline files (for editor completion and checks)."""
    from . import api

    sys.stdout.write(json.dumps(api.schema(), indent=2) + "\n")


WorkdirOption = typer.Option(".hybridflow", "--workdir", "-w", envvar="HYBRIDFLOW_WORKDIR", show_envvar=True,
                             help="The workdir holding runs.db (ignored when a pipeline file is given).")
PipelineOption = typer.Option(None, "--pipeline", "-f", help="Find the run records through this pipeline file.")


RunArgument = typer.Argument(..., metavar="RUN", autocompletion=run_ids,
                             help=f"A run id, a unique prefix of one, or '{LAST_RUN}': the newest run (of "
                             "--pipeline's pipeline, or of the workdir).")


@app.command()
@_guarded
def runs(
    pipeline_file: Optional[Path] = typer.Argument(None, metavar="[PIPELINE.yaml]"),
    workdir: str = WorkdirOption,
    limit: int = typer.Option(20, "--limit", "-n"),
    verbose: bool = VerboseOption,
) -> None:
    """List recent runs (of one pipeline, or of every pipeline in the workdir)."""
    from . import api
    from .reporting.progress import runs_table

    out.print(runs_table(api.runs(pipeline_file, workdir=workdir, limit=limit, missing_ok=False)))


@app.command()
@_guarded
def show(
    run_id: str = RunArgument,
    pipeline_file: Optional[Path] = PipelineOption,
    workdir: str = WorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """One run: its stages, their figures, and the lineage of what they published."""
    from . import api
    from .reporting.progress import run_details

    run = api.run_record(run_id, pipeline_file, workdir=workdir)
    for renderable in run_details(run, run.pop("stages"), run.pop("spans")):
        out.print(renderable)


@app.command()
@_guarded
def report(
    run_id: str = typer.Argument(LAST_RUN, metavar="[RUN]", autocompletion=run_ids,
                                 help=f"A run id, a unique prefix of one, or '{LAST_RUN}' (the default): the "
                                 "newest run."),
    pipeline_file: Optional[Path] = PipelineOption,
    workdir: str = WorkdirOption,
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write it (default: report.html "
                                            "in the run's directory)."),
    open_it: bool = typer.Option(False, "--open", help="Open it in the browser."),
    verbose: bool = VerboseOption,
) -> None:
    """Write a run as one self-contained HTML file (timeline, stages, errors) and print its path."""
    from . import api

    path = api.report(run_id, pipeline_file, workdir=workdir, out=out_file)
    out.print(str(path), markup=False, soft_wrap=True)
    if open_it:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


@app.command()
@_guarded
def logs(
    run_id: str = RunArgument,
    stage: Optional[str] = typer.Argument(None, help="Only this stage's log.", autocompletion=stage_names),
    pipeline_file: Optional[Path] = PipelineOption,
    workdir: str = WorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Print a run's stage logs (all of them, or one stage's)."""
    from . import api

    logged = api.stage_logs(run_id, pipeline_file, stage=stage, workdir=workdir)
    for name, path in logged:
        if len(logged) > 1:
            out.print(f"==> {name} ({path}) <==", markup=False)
        sys.stdout.write(path.read_text(encoding="utf-8", errors="replace") if path.exists() else "(log missing)\n")
        sys.stdout.flush()


clusters_app = typer.Typer(help="Clusters brought up for runs (backends.<engine>.cluster): list them, and take "
                                "down those that runs which died left up.", no_args_is_help=True)
app.add_typer(clusters_app, name="clusters")


@clusters_app.command("list")
@_guarded
def clusters_list(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """The clusters the pipeline's runs brought up that are not down yet: engine, run, state, address, age."""
    from rich.table import Table

    from . import api

    _use_workdir(workdir)
    found = api.clusters(pipeline_file)
    if not found:
        out.print("no cluster is up for this pipeline's runs (none is recorded in its workdir)")
        return
    table = Table("engine", "run", "state", "address", "age", "provider")
    for record in found:
        address = str((record.get("cluster") or {}).get("address", ""))
        table.add_row(*map(escape, (record.get("engine", ""), record.get("run_id", ""), record.get("state", ""),
                                    address, _age(record["age"]), record.get("provider", ""))))
    out.print(table)


@clusters_app.command("reap")
@_guarded
def clusters_reap(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Take down the clusters left up by runs that died (a kill -9, an OOM kill), with the pipeline's
    `down` commands. Every run does this first; exits 75 while a run of the pipeline lives."""
    from . import api

    _use_workdir(workdir)
    taken, problems = api.reap_clusters(pipeline_file)
    for record in taken:
        out.print(f"took down the {record['engine']} cluster of run {record['run_id']}", markup=False)
    for problem in problems:
        err.print(f"[yellow]warning:[/] {escape(problem)}", soft_wrap=True)
    if problems:
        raise UnavailableError(f"{counted(len(problems), 'cluster')} could not be taken down",
                               hint="see the warnings above; hybridflow clusters reap tries again")
    if not taken:
        out.print("no cluster to take down")


def _age(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


schedule_app = typer.Typer(help="Run pipelines unattended: their schedule: lines in your crontab.",
                           no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("install")
@_guarded
def schedule_install(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    verbose: bool = VerboseOption,
) -> None:
    """Write the pipeline's schedule into your crontab (replacing its previous line; no other line changes)."""
    from . import api

    entry = api.install_schedule(pipeline_file)
    out.print(f"installed {entry.pipeline}: '{entry.cron}' ({entry.timezone}); output goes to {entry.log}",
              soft_wrap=True, markup=False)
    out.print(f"check what cron will see with: env -i {sys.executable} -m hybridflow.cli doctor {entry.file}",
              soft_wrap=True, markup=False)


@schedule_app.command("list")
@_guarded
def schedule_list(verbose: bool = VerboseOption) -> None:
    """The hybridflow schedules in your crontab, with their next runs."""
    from rich.table import Table

    from . import api

    entries = api.schedules()
    if not entries:
        out.print("no hybridflow schedule is installed (hybridflow schedule install PIPELINE.yaml adds one)")
        return
    table = Table("pipeline", "file", "cron", "timezone", "next runs", "state")
    for entry, upcoming in entries:
        runs = ", ".join(t.strftime("%Y-%m-%d %H:%M %Z") for t in upcoming)
        try:
            state = api.schedule_state(entry.file)
        except HybridflowError as exc:  # a file moved or broken since it was installed
            state = f"unknown: {exc.one_line()}"
        table.add_row(*map(escape, (entry.pipeline, entry.file, entry.cron, entry.timezone, runs, state)))
    out.print(table)


@schedule_app.command("release")
@_guarded
def schedule_release(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    verbose: bool = VerboseOption,
) -> None:
    """Let the next tick of a schedule held after a failed run (on_failure: hold) run."""
    from . import api

    failed = api.release_schedule(pipeline_file)
    out.print(f"released: the next tick of {pipeline_file} runs (run {failed} had failed)",
              soft_wrap=True, markup=False)


@schedule_app.command("remove")
@_guarded
def schedule_remove(
    target: str = typer.Argument(..., metavar="PIPELINE.yaml|NAME"),
    verbose: bool = VerboseOption,
) -> None:
    """Remove a pipeline's line from your crontab."""
    from . import api

    entry = api.remove_schedule(target)
    out.print(f"removed the schedule of {entry.pipeline} ({entry.file})", soft_wrap=True, markup=False)


@app.command()
@_guarded
def doctor(
    pipeline_file: Optional[Path] = typer.Argument(None, metavar="[PIPELINE.yaml]"),
    verbose: bool = VerboseOption,
) -> None:
    """Check that this machine can run a pipeline (every backend without one), unattended too.

    Run it as `env -i /abs/python -m hybridflow.cli doctor PIPELINE.yaml` to see what cron sees."""
    from rich.table import Table

    from . import api

    findings = api.diagnose(pipeline_file)
    styles = {"ok": "green", "warning": "yellow", "error": "red"}
    table = Table("", "check", "detail", "fix")
    for f in findings:
        table.add_row(f"[{styles[f.status]}]{f.status}[/]", escape(f.check), escape(f.detail), escape(f.fix))
    out.print(table)
    errors = sum(f.status == "error" for f in findings)
    warnings = sum(f.status == "warning" for f in findings)
    out.print(f"{counted(errors, 'error')}, {counted(warnings, 'warning')}")
    if errors:
        raise typer.Exit(int(ExitCode.UNAVAILABLE))


def _version() -> str:
    """The installed distribution's version (what pip reports), or the package's own in a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hybridflow")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def _print_version(requested: bool) -> None:
    if requested:
        out.print(f"hybridflow {_version()}", markup=False)
        raise typer.Exit()


@app.callback(epilog=EXIT_CODES_HELP)
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print hybridflow's version and exit."),
) -> None:
    """hybridflow: one YAML pipeline, each stage on the engine that suits it."""


def _log_warnings_to_current_stderr() -> None:
    """Warnings logged by anyone reach the current stderr; nothing below them is shown. Left without
    a handler, the root logger gets one from the first module-level logging call (py4j's garbage
    collection thread calls logging.info once a stopped JVM no longer answers), bound to whatever
    sys.stderr was at that moment: a stage's log, closed later, or the terminal, where every engine's
    INFO records that reach the root (Dask's scheduler's) then printed over the run's display."""
    if not logging.root.handlers:
        logging.root.addHandler(logging.lastResort)  # level WARNING, writes to sys.stderr as it is then


def main() -> None:
    global _supervising
    _log_warnings_to_current_stderr()
    _supervising = True
    try:
        app()
    except SystemExit as done:
        _exit_without_teardown(done.code)
    _exit_without_teardown(0)


def _exit_without_teardown(code: int | str | None) -> NoReturn:
    """Exit as Python would (other threads joined, exit handlers run, output flushed) but without
    tearing down every imported module: after a run that loaded Spark's, Dask's and Ray's Python
    modules that took 0.9 s on 2 cores, added to every run's wall time. What it skips is freeing
    memory, which the OS does anyway."""
    code = _code_of(code)
    _end_the_process_lightly()
    os._exit(code)


def _code_of(code: int | str | None) -> int:
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
        return 1
    return code or 0


def _end_the_process_lightly() -> None:
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (| head) must not change the exit code
            stream.flush()


if __name__ == "__main__":
    main()
