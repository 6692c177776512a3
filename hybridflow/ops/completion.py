"""What the shell completes after a command (typer's completion; `hybridflow --install-completion`):
stage names from the pipeline file on the line, and run ids from runs.db. Called on every Tab, so
each reads as little as it can (the YAML alone, no validation, no import of the stage code) and
never fails: a file that does not parse completes nothing."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import typer

LIST_SEPARATOR = ","  # --force takes stage names separated by commas
LAST_RUN = "last"  # in place of a run id: the newest run


def _pipeline_file(ctx: typer.Context) -> Path | None:
    """The pipeline file typed on the line so far: the command's argument, or its --pipeline. When the
    value being completed is an option's, at the end of the line, the parser has not placed the
    arguments before it (the option lacks its value): the file is then among the words left over."""
    value = ctx.params.get("pipeline_file") or next(
        (word for word in ctx.args if word.endswith((".yaml", ".yml")) and Path(word).is_file()), None)
    return Path(value) if value else None


def _stages_of(file: Path | None) -> dict[str, str]:
    """Stage name -> its backend ('' when it names none), read from the file's YAML alone."""
    import yaml

    try:
        stages = yaml.safe_load(file.read_text(encoding="utf-8")).get("stages") or {}
        return {str(name): str((spec or {}).get("backend", "")) for name, spec in stages.items()}
    except Exception:  # noqa: BLE001  (no file yet, unreadable, not YAML, not a mapping: nothing to offer)
        return {}


def stage_names(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """The pipeline's stages (with their backend as help) that start with what is typed."""
    return [(name, backend) for name, backend in _stages_of(_pipeline_file(ctx)).items()
            if name.startswith(incomplete)]


def stage_lists(ctx: typer.Context, incomplete: str) -> list[str]:
    """--force S1,S2,...: completes the last name of the list, and leaves out the names already in it."""
    done, _, last = incomplete.rpartition(LIST_SEPARATOR)
    given = set(done.split(LIST_SEPARATOR)) if done else set()
    prefix = done + LIST_SEPARATOR if done else ""
    return [prefix + name for name in _stages_of(_pipeline_file(ctx))
            if name.startswith(last) and name not in given]


def run_ids(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """The newest recorded runs (of the workdir given, or .hybridflow), with pipeline and status as help."""
    db = Path(ctx.params.get("workdir") or ".hybridflow") / "runs.db"
    found = [(LAST_RUN, "the newest run")]
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as store:
            rows = store.execute("SELECT run_id, pipeline, status FROM runs ORDER BY started_at DESC LIMIT 50")
            found += [(run_id, f"{pipeline} {status}") for run_id, pipeline, status in rows]
    except sqlite3.Error:
        pass  # no runs.db yet
    return [(value, help) for value, help in found if value.startswith(incomplete)]
