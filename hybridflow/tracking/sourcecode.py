"""Where a stage's code lives, as trackers record it: its file, and the git commit and remote of
the repository holding it when there is one (a remote's user and password never kept)."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..definition.sqlstage import file_of, is_sql
from ..definition.stagecode import module_file


@dataclass(frozen=True)
class Git:
    top: Path
    commit: str
    remote: str | None


@dataclass(frozen=True)
class StageSource:
    file: Path
    git: Git | None

    @property
    def in_repository(self) -> str | None:
        """The file's path in its git repository."""
        try:
            return self.file.resolve().relative_to(self.git.top.resolve()).as_posix() if self.git else None
        except ValueError:
            return None


def stage_source(pipeline, stage: str) -> StageSource | None:
    """The file a stage's code is in (a module, or a .sql file), None when it cannot be found."""
    target = pipeline.stages[stage].run
    if is_sql(target):
        file = file_of(pipeline.root, target)
    else:
        file = module_file(pipeline.root, target.partition(":")[0])
    if file is None or not file.is_file():
        return None
    return StageSource(file, git_of(file.parent))


@functools.cache
def git_of(directory: Path) -> Git | None:
    """The git repository `directory` is in: None outside one, or without git."""
    top = _git(directory, "rev-parse", "--show-toplevel")
    commit = top and _git(directory, "rev-parse", "HEAD")
    if not top or not commit:
        return None
    remote = _git(directory, "config", "--get", "remote.origin.url")
    return Git(Path(top), commit, without_credentials(remote) if remote else None)


def without_credentials(url: str) -> str:
    """An https remote's user and password dropped (git@host:org/repo stays as it is)."""
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None
