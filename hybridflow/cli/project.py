"""The commands on a project's files and published data that run no stage: init (a new project), check
(the declared data checks), gc (old dataset versions), graph (a picture) and schema (the file format)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..engines import BUILT_IN
from ..errors import ExitCode, counted
from .console import out
from .guard import guarded
from .options import RunWorkdirOption, VerboseOption, use_workdir
from .root import app


@app.command()
@guarded
def init(
    directory: Path = typer.Argument(..., metavar="DIR", help="A new (or empty) directory for the project."),
    engines: str = typer.Option("", "--engines", help="Engines to give a stage each, comma-separated: "
                                f"{', '.join(BUILT_IN)} or a plugin's (python always cleans the sample first)."),
    verbose: bool = VerboseOption,
) -> None:
    """Create a project that validates and runs at once: pipeline.yaml, a stage module per engine,
    a sample dataset, a test that runs the pipeline, and a README."""
    from .. import api

    written = api.init(directory, [e.strip() for e in engines.split(",") if e.strip()])
    for path in written:
        out.print(f"created {path}", markup=False, soft_wrap=True)
    out.print(f"next: cd {directory} && hybridflow run pipeline.yaml", markup=False, soft_wrap=True)


@app.command()
@guarded
def check(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    datasets: Optional[list[str]] = typer.Argument(None, metavar="[DATASET]...",
                                                   help="Datasets to check (default: every one that declares checks)."),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Run the declared data checks against what is published now (and external inputs), without
    running a stage: exit 0 when no error-level check fails, 65 when one does."""
    from .. import api

    use_workdir(workdir)
    outcomes = api.check(pipeline_file, datasets or None)
    for o in outcomes:
        shown = o["line"] if o["status"] != "passed" else f"dataset '{o['dataset']}': check '{o['check']}' passed"
        out.print(f"{o['status']:>7}  {shown}", markup=False, soft_wrap=True)
    failed = [o for o in outcomes if o["status"] == "failed"]
    out.print(f"{counted(len(outcomes), 'check')}, {len(failed)} failed", markup=False)
    if failed:
        raise typer.Exit(int(ExitCode.DATA))


@app.command()
@guarded
def gc(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    keep: Optional[int] = typer.Option(None, "--keep", min=1, help="Versions to keep per dataset "
                                       "(default: the pipeline's keep_versions)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed."),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Remove old dataset versions, never a current one or one the current versions were made from."""
    from .. import api

    use_workdir(workdir)

    pipeline = api.load(pipeline_file)
    keep = keep or pipeline.spec.keep_versions
    removed = api.collect_garbage(pipeline, keep, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for dataset, version in removed:
        out.print(f"{verb} {dataset}@{version}", markup=False)
    out.print(f"{verb} {counted(len(removed), 'version')} (keeping {keep} per dataset and every version in use)")


@app.command()
@guarded
def graph(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    format: str = typer.Option("mermaid", "--format", help="mermaid or dot (text on stdout), or svg or png "
                               "(a picture drawn by Graphviz into --out)"),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="The picture's file (svg and png)."),
    verbose: bool = VerboseOption,
) -> None:
    """Print the pipeline's graph as Mermaid (default) or Graphviz DOT, or draw it as SVG or PNG."""
    from .. import api

    drawn = api.graph(pipeline_file, format, out_file)
    if isinstance(drawn, Path):  # a picture, drawn into --out
        out.print(str(drawn), markup=False, soft_wrap=True)
    else:
        sys.stdout.write(drawn)


@app.command()
@guarded
def schema(verbose: bool = VerboseOption) -> None:
    """Print the JSON Schema of pipeline files (for editor completion and checks)."""
    from .. import api

    sys.stdout.write(json.dumps(api.schema(), indent=2) + "\n")
