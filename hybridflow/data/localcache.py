"""This machine's cache folder, shared by every workdir and pipeline of the user: HYBRIDFLOW_CACHE,
else $XDG_CACHE_HOME/hybridflow, else ~/.cache/hybridflow.

What is kept here is keyed so that it can never be wrong for another workdir (by a digest of the
content it describes, or by a file's whole stat): a fresh workdir, a second checkout or a CI job's
workdir does not pay again for what this machine already worked out. Every file is the owner's only
(0600) and written whole (a reader sees the old file or the new one); all of it is best effort: a
cache that cannot be read or written only costs the work it would have saved.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

VARIABLE = "HYBRIDFLOW_CACHE"


def home(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get(VARIABLE) or Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "hybridflow")
    return Path(base).expanduser()


def read_json(path: Path) -> Any | None:
    """The JSON in `path`, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def write_private(path: Path, text: str, parents: bool = True) -> bool:
    """`text` into `path` (0600, replacing it whole); False when it could not be written. `parents`:
    whether missing folders above its own are made."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=parents, exist_ok=True, mode=0o700)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            os.fchmod(handle.fileno(), 0o600)  # a leftover tmp file keeps its old mode otherwise
            handle.write(text)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):  # on a full disk: gone again, not left filling it
            tmp.unlink()
        return False
