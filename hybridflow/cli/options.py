"""The options and arguments several commands share, and what --workdir does."""

from __future__ import annotations

import os

import typer

from ..ops.completion import LAST_RUN, run_ids, stage_lists, stage_names

VerboseOption = typer.Option(False, "--verbose", "-v", help="Show full tracebacks.")
ParamOption = typer.Option(None, "--param", "-p", metavar="KEY=VALUE",
                           help="Override a param: key=value (pipeline-wide) or stage.key=value.")

OnlyOption = typer.Option(None, "--only", help="Run only this stage (repeatable).", autocompletion=stage_names)
FromOption = typer.Option(None, "--from", help="Run this stage and everything after it.", autocompletion=stage_names)
ToOption = typer.Option(None, "--to", help="Run this stage and everything before it.", autocompletion=stage_names)
ForceOption = typer.Option(None, "--force", metavar="[STAGE,...]", autocompletion=stage_lists,
                           help="Run stages even if they are up to date: all of them (a bare --force, anywhere "
                                "on the line), or the stages named (comma-separated).")
KeepGoingOption = typer.Option(False, "--keep-going", "-k", help="After a failure, still run stages that do not "
                               "depend on it.")
WaitOption = typer.Option(False, "--wait", help="Wait for another run of this pipeline to finish.")

RunWorkdirOption = typer.Option(None, "--workdir", "-w", envvar="HYBRIDFLOW_WORKDIR", show_envvar=True,
                                help="Use this workdir instead of the pipeline file's workdir: (relative to the "
                                     "current directory).")
WorkdirOption = typer.Option(".hybridflow", "--workdir", "-w", envvar="HYBRIDFLOW_WORKDIR", show_envvar=True,
                             help="The workdir holding runs.db (ignored when a pipeline file is given).")
PipelineOption = typer.Option(None, "--pipeline", "-f", help="Find the run records through this pipeline file.")
RunArgument = typer.Argument(..., metavar="RUN", autocompletion=run_ids,
                             help=f"A run id, a unique prefix of one, or '{LAST_RUN}': the newest run (of "
                             "--pipeline's pipeline, or of the workdir).")


def use_workdir(workdir: str | None) -> None:
    """--workdir (or HYBRIDFLOW_WORKDIR) for every load of the pipeline in this command, its run's
    process included: the pipeline loader reads it from the environment."""
    if workdir is not None:
        from .. import api

        os.environ[api.WORKDIR_VARIABLE] = workdir
