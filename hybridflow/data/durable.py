"""Making what was written survive a power cut: one fsync of a file or a directory by its path."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file's data, or a directory's entries (after a rename into it, to make the rename last)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
