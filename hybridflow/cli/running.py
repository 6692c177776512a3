"""The commands that run a pipeline's stages, or say which they would run: plan, run, resume,
backfill and dev (run --watch)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import ConfigError, UsageError
from .console import err, out
from .guard import guarded
from .options import (
    ForceOption,
    FromOption,
    KeepGoingOption,
    OnlyOption,
    ParamOption,
    RunWorkdirOption,
    ToOption,
    VerboseOption,
    WaitOption,
    use_workdir,
)
from .reports import RunReport, WatchReport, print_plan, terminal_run_report
from .root import app
from .supervision import supervised


@app.command()
@guarded
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
    from .. import api

    use_workdir(workdir)

    print_plan(api.plan(pipeline_file, only=only, from_=start, to=end, force=force, params=params))


@app.command()
@guarded
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
    wait: bool = WaitOption,
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
    from .. import api

    use_workdir(workdir)

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
                             listener=terminal_run_report(), exit_when_stuck=True, scheduled_for=moment,
                             calendar=notes)
            if isinstance(result, api.Plan):
                print_plan(result)
            elif result is not None and result.error is not None:
                raise typer.Exit(result.exit_code)

    if dry_run:
        run_it()  # runs no stage
    else:
        supervised(run_it, pipeline_file, verbose)


@app.command("resume")
@guarded
def resume_run(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    keep_going: bool = KeepGoingOption,
    wait: bool = WaitOption,
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Continue the last run if it failed or was interrupted (run --resume); its success lifts a held schedule."""
    run(pipeline_file, only=None, start=None, end=None, params=None, force=None, resume=True, dry_run=False,
        keep_going=keep_going, wait=wait, trigger="manual", if_due=False, for_=None, watch=False, workdir=workdir,
        verbose=verbose)


@app.command()
@guarded
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
    wait: bool = WaitOption,
    only: Optional[List[str]] = OnlyOption,
    end: Optional[List[str]] = ToOption,
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Reprocess chosen partitions of the incremental stages (every other one kept), and what depends on them."""
    from .. import api
    from ..reporting.progress import backfill_lines

    use_workdir(workdir)
    if dry_run:
        for line in backfill_lines(api.backfill(pipeline_file, partitions, chunk=chunk, reprocess=reprocess,
                                                dry_run=True, only=only, to=end)):
            out.print(line, soft_wrap=True, markup=False)
        return

    def run_it() -> None:
        outcome = api.backfill(pipeline_file, partitions, chunk=chunk, reprocess=reprocess, resume=resume,
                               wait=wait, only=only, to=end, listener=terminal_run_report, exit_when_stuck=True)
        done = f"; chunks {', '.join(map(str, outcome.skipped))} were done already" if outcome.skipped else ""
        out.print(f"backfill {outcome.backfill.id}: {len(outcome.results)} of {len(outcome.backfill.chunks)} "
                  f"chunk(s) run{done}", soft_wrap=True, markup=False)
        if outcome.failed is not None:
            err.print(f"resume with: hybridflow backfill {pipeline_file} --resume", soft_wrap=True, markup=False)
            raise typer.Exit(outcome.failed.exit_code)

    supervised(run_it, pipeline_file, verbose, "backfill")


def _scheduled_ticks(pipeline_file: Path, params, if_due: bool) -> list:
    """(tick, calendar notes) for each run a scheduled invocation makes now: none when nothing is due
    or the schedule is held (the hold recorded, notified and said in one line)."""
    from .. import api

    invocation = api.scheduled_invocation(pipeline_file, if_due=if_due, params=params)
    if invocation is None:  # no schedule: a --trigger cron run runs now; --if-due says what is missing
        if if_due and not api.is_due(pipeline_file):
            return []
        return [(None, None)]
    if invocation.held:
        api.hold(pipeline_file, invocation, RunReport(None))
        err.print(f"{invocation.held}; resume with: hybridflow run {pipeline_file} --resume, or let the next "
                  f"tick run: hybridflow schedule release {pipeline_file}", soft_wrap=True, markup=False)
    elif not invocation.ticks and not if_due:  # an every-minute --if-due line stays quiet when nothing is due
        err.print(f"nothing to run: a run has served the schedule's latest tick already; to run now: "
                  f"hybridflow run {pipeline_file}", soft_wrap=True, markup=False)
    return list(zip(invocation.ticks, invocation.notes))


@app.command()
@guarded
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
    use_workdir(workdir)
    _watch(pipeline_file, only=only, start=start, end=end, params=params, force=force, keep_going=keep_going,
           verbose=verbose)


def _watch(pipeline_file: Path, *, only, start, end, params, force, keep_going: bool, verbose: bool) -> None:
    from .. import api

    supervised(lambda: api.watch(pipeline_file, only=only, from_=start, to=end, params=params, force=force,
                                 keep_going=keep_going, report=WatchReport(), exit_when_stuck=True),
               pipeline_file, verbose)
