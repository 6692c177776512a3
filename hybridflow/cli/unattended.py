"""Running pipelines unattended: `hybridflow schedule` (their lines in your crontab) and `hybridflow
doctor` (what this machine can run, as cron sees it too)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import ExitCode, HybridflowError, counted
from .console import out
from .guard import guarded
from .options import VerboseOption
from .root import app

schedule_app = typer.Typer(help="Run pipelines unattended: their schedule: lines in your crontab.",
                           no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("install")
@guarded
def schedule_install(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    verbose: bool = VerboseOption,
) -> None:
    """Write the pipeline's schedule into your crontab (replacing its previous line; no other line changes)."""
    from .. import api

    entry = api.install_schedule(pipeline_file)
    out.print(f"installed {entry.pipeline}: '{entry.cron}' ({entry.timezone}); output goes to {entry.log}",
              soft_wrap=True, markup=False)
    out.print(f"check what cron will see with: env -i {sys.executable} -m hybridflow.cli doctor {entry.file}",
              soft_wrap=True, markup=False)


@schedule_app.command("list")
@guarded
def schedule_list(verbose: bool = VerboseOption) -> None:
    """The hybridflow schedules in your crontab, with their next runs."""
    from rich.table import Table

    from .. import api

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
@guarded
def schedule_release(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    verbose: bool = VerboseOption,
) -> None:
    """Let the next tick of a schedule held after a failed run (on_failure: hold) run."""
    from .. import api

    failed = api.release_schedule(pipeline_file)
    out.print(f"released: the next tick of {pipeline_file} runs (run {failed} had failed)",
              soft_wrap=True, markup=False)


@schedule_app.command("remove")
@guarded
def schedule_remove(
    target: str = typer.Argument(..., metavar="PIPELINE.yaml|NAME"),
    verbose: bool = VerboseOption,
) -> None:
    """Remove a pipeline's line from your crontab."""
    from .. import api

    entry = api.remove_schedule(target)
    out.print(f"removed the schedule of {entry.pipeline} ({entry.file})", soft_wrap=True, markup=False)


@app.command()
@guarded
def doctor(
    pipeline_file: Optional[Path] = typer.Argument(None, metavar="[PIPELINE.yaml]"),
    verbose: bool = VerboseOption,
) -> None:
    """Check that this machine can run a pipeline (every backend without one), unattended too.

    Run it as `env -i /abs/python -m hybridflow.cli doctor PIPELINE.yaml` to see what cron sees."""
    from rich.table import Table

    from .. import api

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
