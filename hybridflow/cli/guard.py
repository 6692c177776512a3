"""Where a command's errors become one line on stderr and the documented exit code."""

from __future__ import annotations

import functools
from pathlib import Path

import typer
from rich.markup import escape

from ..errors import ConfigError, ExitCode, HybridflowError, storage_error
from .console import err


def guarded(command):
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
            print_error(exc)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except Exception as exc:  # a bug in hybridflow: say so plainly
            raise typer.Exit(_unexpected(exc, verbose)) from None

    return wrapper


def print_error(exc: HybridflowError) -> None:
    """A hybridflow error as its one line on stderr."""
    if isinstance(exc, ConfigError) and exc.located:  # file:line:col: error: ..., labelled already
        err.print(escape(exc.one_line()), soft_wrap=True)
    else:
        err.print(f"[bold red]error:[/] {escape(exc.one_line())}", soft_wrap=True)


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
