"""The commands that read run records: runs (the list), show (one run), report (one run as HTML) and
logs (its stages' logs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..ops.completion import LAST_RUN, run_ids, stage_names
from .console import out
from .guard import guarded
from .options import PipelineOption, RunArgument, VerboseOption, WorkdirOption
from .root import app


@app.command()
@guarded
def runs(
    pipeline_file: Optional[Path] = typer.Argument(None, metavar="[PIPELINE.yaml]"),
    workdir: str = WorkdirOption,
    limit: int = typer.Option(20, "--limit", "-n"),
    verbose: bool = VerboseOption,
) -> None:
    """List recent runs (of one pipeline, or of every pipeline in the workdir)."""
    from .. import api
    from ..reporting.progress import runs_table

    out.print(runs_table(api.runs(pipeline_file, workdir=workdir, limit=limit, missing_ok=False)))


@app.command()
@guarded
def show(
    run_id: str = RunArgument,
    pipeline_file: Optional[Path] = PipelineOption,
    workdir: str = WorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """One run: its stages, their figures, and the lineage of what they published."""
    from .. import api
    from ..reporting.progress import run_details

    run = api.run_record(run_id, pipeline_file, workdir=workdir)
    for renderable in run_details(run, run.pop("stages"), run.pop("spans")):
        out.print(renderable)


@app.command()
@guarded
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
    from .. import api

    path = api.report(run_id, pipeline_file, workdir=workdir, out=out_file)
    out.print(str(path), markup=False, soft_wrap=True)
    if open_it:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


@app.command()
@guarded
def logs(
    run_id: str = RunArgument,
    stage: Optional[str] = typer.Argument(None, help="Only this stage's log.", autocompletion=stage_names),
    pipeline_file: Optional[Path] = PipelineOption,
    workdir: str = WorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Print a run's stage logs (all of them, or one stage's)."""
    from .. import api

    logged = api.stage_logs(run_id, pipeline_file, stage=stage, workdir=workdir)
    for name, path in logged:
        if len(logged) > 1:
            out.print(f"==> {name} ({path}) <==", markup=False)
        sys.stdout.write(path.read_text(encoding="utf-8", errors="replace") if path.exists() else "(log missing)\n")
        sys.stdout.flush()
