"""The command's process as the parent of the process that runs the pipeline (execution/supervisor.py):
the one way the CLI reaches the run besides the API, on both sides of the pipe between them."""

from __future__ import annotations

from pathlib import Path

import typer

from .guard import guarded
from .process import code_of, end_the_process_lightly

supervising = False  # set by main(): the command's own process (tests calling `app` in-process never fork)


def supervised(work, pipeline_file: Path, verbose: bool, command: str = "run") -> None:
    """`work()` (runs of `pipeline_file`) in a child process that this one supervises (supervisor.py):
    a run whose process ends without recording its end is recorded here, and named in one line."""
    from ..execution import supervisor

    if not (supervising and supervisor.available()):
        work()
        return
    outcome = supervisor.supervise(lambda: _exit_code_of(work, verbose))
    if outcome.unfinished is None:
        raise typer.Exit(outcome.exit_code)
    from .. import api

    raise api.record_crash(pipeline_file, outcome.unfinished, outcome.death, command)


def _exit_code_of(work, verbose: bool) -> int:
    """In the run's process: `work()` with its errors printed as the command prints them, then the
    command's own end (threads joined, exit handlers run, output flushed); its exit code."""
    try:
        guarded(lambda verbose: work())(verbose=verbose)
        code = 0
    except SystemExit as done:  # typer.Exit is not one: it is click's
        code = code_of(done.code)
    except typer.Exit as done:
        code = done.exit_code
    end_the_process_lightly()
    return code


def run_began(run_id: str) -> None:
    """In the run's process: tell the supervising process the run it now runs (recorded if this process dies)."""
    from ..execution import supervisor

    supervisor.run_began(run_id)


def run_ended(run_id: str) -> None:
    """In the run's process: tell the supervising process the run's own end is recorded."""
    from ..execution import supervisor

    supervisor.run_ended(run_id)
