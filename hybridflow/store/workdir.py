"""The workdir as a place: made (or recognised) as hybridflow's before anything is written into it,
and kept free of the temporary files of writers that died.

hybridflow deletes what it finds under its own staging/ and versions/, so it refuses a folder that
already holds files it did not make: a workdir it makes (or finds empty) gets a marker file, and so
does one from before the marker, recognised by what only hybridflow writes (runs.db), so that
upgrading users are not refused.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from ..errors import ConfigError
from ..processes import running

MARKER = ".hybridflow-workdir"
# what only hybridflow writes into a workdir: runs.db (in every one, since the first release), the key
# of secrets' fingerprints, and each pipeline's lock (what a run makes first, even in a workdir
# removed and made anew while in use)
OURS = ("runs.db", ".fingerprint-key", "*/run.lock")
PLACEHOLDERS = {".gitkeep", ".DS_Store"}  # what a folder made empty on purpose may hold
_NOTE = ("This folder is a hybridflow workdir: run records (runs.db) and each pipeline's datasets.\n"
         "hybridflow manages everything in it; delete the whole folder to start afresh.\n")

# hybridflow's own temporary files, each beside the file it becomes: .NAME.PID[.N].tmp (catalog.py's
# durable writes, the hash cache, the fingerprint key) and .NAME.PID.partial (htmlreport.py), named
# after the process writing them; .report.html.partial is the report's name from before the pid was in it
_TEMPORARY = re.compile(r"^\..+?\.(?P<pid>\d+)(?:\.\d+)?\.(?:tmp|partial)$|^\.report\.html\.partial$")
# the files the backends write to see whether a cluster shares the workdir, gone within seconds
_SHARED_MARKER = re.compile(r"^\.hybridflow-shared-[0-9a-f]{32}$")
_SHARED_MARKER_AGE = 3600.0


def claim(workdir: Path) -> Path:
    """`workdir`, made if missing, refused (ConfigError) if it is a file or a non-empty folder that is
    not hybridflow's. Before anything is written into it: the run store calls it on opening."""
    try:
        workdir.mkdir(parents=True)
    except FileExistsError:
        if not workdir.is_dir():
            raise ConfigError(f"the workdir {workdir} is a file, not a folder",
                              hint="point workdir: in the pipeline file at a folder (hybridflow makes it)") from None
        if (workdir / MARKER).exists():
            return workdir
        _refuse_foreign(workdir)
    (workdir / MARKER).write_text(_NOTE, encoding="utf-8")
    return workdir


def _refuse_foreign(workdir: Path) -> None:
    """A folder without the marker is hybridflow's to take only if it is empty or holds what only
    hybridflow writes (a workdir from before the marker)."""
    if any(next(workdir.glob(pattern), None) is not None for pattern in OURS):
        return
    # the marker too: another process may be claiming the folder at this moment
    found = sorted(p.name for p in workdir.iterdir() if p.name not in {*PLACEHOLDERS, MARKER})
    if found and not all(_cron_log_only(workdir / name) for name in found):
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ConfigError(f"the workdir {workdir} is a folder hybridflow did not make, and it holds {shown}",
                          hint="point workdir: in the pipeline file at a new or empty folder: hybridflow deletes "
                               "what it finds under its own staging/ and versions/")


def _cron_log_only(folder: Path) -> bool:
    """What a scheduled pipeline's first run finds: its cron line made <workdir>/<pipeline>/ for the
    run's output, cron.log, before hybridflow started (schedule.py)."""
    return folder.is_dir() and [p.name for p in folder.iterdir()] == ["cron.log"]


def remove_leftovers(home: Path) -> list[Path]:
    """Remove the temporary files hybridflow's writers left behind when they died (SIGKILL, a full
    disk) from the workdir (home's parent), the pipeline's home, its datasets and its run folders;
    never one a live process is still writing. Under the pipeline's run lock (a run's start, gc):
    another pipeline of the workdir may be running, whose files are told apart by their pid."""
    removed = []
    for folder in _folders(home):
        for path in _entries(folder):
            if _left_behind(path):
                try:
                    path.unlink()
                except FileNotFoundError:  # its writer finished meanwhile
                    continue
                removed.append(path)
    if removed:
        logging.getLogger("hybridflow").info("removed %d leftover temporary files", len(removed))
    return removed


def _folders(home: Path) -> list[Path]:
    """Where hybridflow writes through a temporary file; not versions/ (written in staging, which
    the run's start discards whole) and not each version's files."""
    return [home.parent, home, *_subfolders(home / "datasets"), *_subfolders(home / "runs")]


def _subfolders(folder: Path) -> list[Path]:
    return [p for p in _entries(folder) if p.is_dir() and not p.is_symlink()]


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _left_behind(path: Path) -> bool:
    name = path.name
    if _SHARED_MARKER.match(name):  # named by a random id, not its writer: old is dead
        return _age(path) > _SHARED_MARKER_AGE
    found = _TEMPORARY.match(name)
    if not found or not path.is_file() or path.is_symlink():
        return False
    return found["pid"] is None or not _alive(int(found["pid"]))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True  # this process may be writing it now (a watch session's earlier run)
    return running(pid)


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
