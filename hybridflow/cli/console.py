"""The two consoles every command prints with: `out` (stdout, what a command answers) and `err` (stderr:
errors, warnings, progress)."""

from __future__ import annotations

import os

from rich.console import Console

out = Console(highlight=False, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)
for _console in (out, err):
    if not _console.is_terminal and "COLUMNS" not in os.environ:
        _console.width = 160  # logs and pipes: Rich's 80 columns would fold run ids and paths
