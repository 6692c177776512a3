"""The `hybridflow` command. The only package that prints, and the one place errors become exit codes.

Engines are never imported here: `hybridflow --help` and `validate` stay fast. Each command module
imports what its command needs inside the command.
"""

from __future__ import annotations

from . import supervision
from .process import exit_without_teardown, log_warnings_to_current_stderr
from .root import app

# imported for the commands they add to `app`, in the order --help lists them (groups come last)
# isort: off
from . import validate, running, project, records, clusters, unattended  # noqa: F401
# isort: on

__all__ = ["app", "main"]


def main() -> None:
    """The console script `hybridflow` (and `python -m hybridflow.cli`): the command in a process it
    ends itself, with runs supervised from it."""
    log_warnings_to_current_stderr()
    supervision.supervising = True
    try:
        app()
    except SystemExit as done:
        exit_without_teardown(done.code)
    exit_without_teardown(0)
