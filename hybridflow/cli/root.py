"""The root of the command: the Typer app every command module adds its commands to, what a bare
--force means, --version, and the exit codes listed under --help."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.core import TyperGroup

from ..errors import ExitCode
from .console import out

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
    help="Run each stage of a pipeline on the engine that suits it: Spark, Dask, Ray, DuckDB, Polars or plain Python.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion: commands, options, stages, run ids
    pretty_exceptions_enable=False,
)

EXIT_CODES_HELP = "Exit codes: " + ", ".join(f"{c.value} {c.name.lower().replace('_', ' ')}" for c in ExitCode)


def _version() -> str:
    """The installed distribution's version (what pip reports), or the package's own in a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hybridflow")
    except PackageNotFoundError:
        from .. import __version__

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
