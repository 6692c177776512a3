"""`hybridflow clusters`: the clusters runs brought up (backends.<engine>.cluster), listed, and taken
down when the run that brought them up died."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import UnavailableError, counted
from .console import err, out
from .guard import guarded
from .options import RunWorkdirOption, VerboseOption, use_workdir
from .root import app

clusters_app = typer.Typer(help="Clusters brought up for runs (backends.<engine>.cluster): list them, and take "
                                "down those that runs which died left up.", no_args_is_help=True)
app.add_typer(clusters_app, name="clusters")


@clusters_app.command("list")
@guarded
def clusters_list(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """The clusters the pipeline's runs brought up that are not down yet: engine, run, state, address, age."""
    from rich.table import Table

    from .. import api

    use_workdir(workdir)
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
@guarded
def clusters_reap(
    pipeline_file: Path = typer.Argument(..., metavar="PIPELINE.yaml"),
    workdir: Optional[str] = RunWorkdirOption,
    verbose: bool = VerboseOption,
) -> None:
    """Take down the clusters left up by runs that died (a kill -9, an OOM kill), with the pipeline's
    `down` commands. Every run does this first; exits 75 while a run of the pipeline lives."""
    from .. import api

    use_workdir(workdir)
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
