"""`hybridflow validate`: pipeline files checked without running anything (what CI and editors call,
so it imports no engine and no data library)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from ..errors import ConfigError, ExitCode, counted
from .console import out
from .guard import guarded
from .options import ParamOption, VerboseOption
from .root import app


@app.command()
@guarded
def validate(
    paths: List[Path] = typer.Argument(..., help="Pipeline files, or directories to search for *.yaml/*.yml."),
    format: str = typer.Option("text", "--format", help="text or json"),
    params: Optional[List[str]] = ParamOption,
    verbose: bool = VerboseOption,
) -> None:
    """Check pipeline files and report every problem as file:line:col."""
    from .. import api
    from ..diagnostics import errors_in

    if format not in ("text", "json"):
        raise ConfigError(f"--format must be text or json, not '{format}'")
    files, problems = api.validate(paths, params)
    errors = errors_in(problems)
    if format == "json":
        out.print_json(json.dumps({"valid": not errors, "files": [str(f) for f in files],
                                   "problems": [p.as_dict() for p in problems]}))
    else:
        for problem in problems:
            style = "red" if problem.severity == "error" else "yellow"
            out.print(f"{escape(problem.file)}:{problem.line}:{problem.col}: [{style}]{problem.severity}[/]: "
                      f"{escape(problem.message)}", soft_wrap=True)
        warnings = len(problems) - len(errors)
        verdict = "[green]valid[/]" if not errors else "[red]invalid[/]"
        out.print(f"{counted(len(files), 'file')} checked: {verdict} "
                  f"({counted(len(errors), 'error')}, {counted(warnings, 'warning')})")
    if errors:
        raise typer.Exit(int(ExitCode.CONFIG))
