"""What sqlglot reads in a query file, remembered on this machine (data/localcache.py) by a digest of
the query's text.

Validating or running a SQL stage needs what its query reads (tables, `:params`, each at its place)
and fingerprinting it needs the digest of its tokens; getting them from sqlglot costs every process
about 0.15 s (importing sqlglot and its dialect, parsing). What is kept of it is small, and keyed by
sha256 of the text, the dialect and the sqlglot installed (its path and version file): an edited
query has another key, so an entry is never stale; an upgraded sqlglot reads every query again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from ..data import localcache

FORMAT = 1  # what an entry holds: a change of it makes every entry unread


@functools.cache
def _parser_identity() -> str:
    """The sqlglot installed, without importing it: its folder and its version file's text."""
    spec = importlib.util.find_spec("sqlglot")
    if spec is None or spec.origin is None:
        return "none"
    folder = Path(spec.origin).parent
    try:
        version = (folder / "_version.py").read_text()
    except OSError:
        version = "?"
    return f"{folder}\n{version}"


def _file(kind: str, text: str, dialect: str) -> Path:
    key = hashlib.sha256(f"{FORMAT}\0{_parser_identity()}\0{kind}\0{dialect}\0{text}".encode()).hexdigest()
    return localcache.home() / "sql" / key[:2] / f"{key}.json"


def recall(kind: str, text: str, dialect: str) -> Any | None:
    """What was remembered of `text` read as `kind` in `dialect`, or None."""
    return localcache.read_json(_file(kind, text, dialect))


def remember(kind: str, text: str, dialect: str, value: Any) -> None:
    localcache.write_private(_file(kind, text, dialect), json.dumps(value))
