"""This process's child processes, found and ended through Linux's /proc (nothing elsewhere)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _parents() -> dict[int, int]:
    """Every live (not zombie) process's parent: pid -> ppid."""
    parents = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    return parents


def children() -> set[int]:
    """Process ids of this process's live children."""
    me = os.getpid()
    return {pid for pid, parent in _parents().items() if parent == me}


def descendants() -> set[int]:
    """Children, their children, and so on: everything this process started that still runs
    under it (an engine's JVM, Ray's daemons and workers, Dask's worker processes)."""
    parents = _parents()
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def end(pids: set[int]) -> None:
    """SIGKILL each process, and reap those that are our own children. All are stopped first, so that
    none sees another die and reacts (a Dask nanny restarting its worker, a tracker complaining)."""
    for signum in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                continue
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except (ChildProcessError, OSError):
            pass


def end_all(rounds: int = 20) -> None:
    """End every descendant, again and again while new ones appear: an engine whose client still runs
    in this process (a Dask LocalCluster) starts new workers in place of the ones that died."""
    for _ in range(rounds):
        found = descendants()
        if not found:
            return
        end(found)
