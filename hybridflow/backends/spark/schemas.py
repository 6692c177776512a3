"""Column names as Spark must be given them: quoted, so that Spark takes them literally."""

from __future__ import annotations

from typing import Sequence


def quoted(name: str) -> str:
    """`name` as a Spark column reference to exactly that column: Spark parses a string column as an
    expression (col.with.dot is field with.dot of col; a space, a bracket or a backtick is a syntax
    error), so it is backtick-quoted, backticks inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def columns(names: Sequence[str]) -> list[str]:
    return [quoted(name) for name in names]
