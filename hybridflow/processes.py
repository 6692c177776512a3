"""This process's child processes, found and ended through Linux's /proc (nothing elsewhere)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def _parents() -> dict[int, int]:
    """Every live (not zombie) process's parent: pid -> ppid."""
    parents = {}
    for name in os.listdir("/proc"):  # plain os calls: called around every stage, on busy machines too
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            parents[int(name)] = int(fields[1])
    return parents


def _children_files() -> bool:
    """Whether the kernel lists each thread's children (/proc/<pid>/task/<tid>/children): reading a few
    of those is far cheaper than every process's stat on a busy machine."""
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


_CHILDREN_FILES = _children_files()


def _children_of(pid: int) -> set[int]:
    """The live (not zombie) children of `pid`, from its threads' children files."""
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # ended meanwhile
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as listed:
                found.update(int(child) for child in listed.read().split())
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
    return {child for child in found if running(child)}


def running(pid: int) -> bool:
    """Whether process `pid` (above 0) runs: another user's does; a zombie (killed, not yet reaped by
    whoever adopted it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _under(roots: set[int], parents: dict[int, int] | None = None) -> set[int]:
    """Everything below `roots` (not the roots): from the children files, or from `parents` (a
    whole-system scan) where the kernel has none."""
    found, frontier = set(), set(roots)
    while frontier:
        if parents is None and _CHILDREN_FILES:
            below = set().union(*(_children_of(pid) for pid in frontier))
        else:
            parents = parents if parents is not None else _parents()
            below = {pid for pid, parent in parents.items() if parent in frontier}
        frontier = below - found - roots
        found |= frontier
    return found


def children() -> set[int]:
    """Process ids of this process's live children."""
    me = os.getpid()
    if _CHILDREN_FILES:
        return _children_of(me)
    return {pid for pid, parent in _parents().items() if parent == me}


def descendants() -> set[int]:
    """Children, their children, and so on: everything this process started that still runs
    under it (an engine's JVM, Ray's daemons and workers, Dask's worker processes)."""
    return _under({os.getpid()})


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


def adopt_orphans() -> None:
    """Make this process the child subreaper of everything under it (Linux): a process a stage
    started and left, daemonised (double fork, setsid) or not, is re-parented to this process rather
    than to init, where left_behind() finds it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


_engine_processes: set[int] = set()  # started by subprocess in a thread launching an engine
_spawned_workers: set[int] = set()  # multiprocessing's spawned workers (a local Dask cluster's)
_launching = threading.local()
_tracking = threading.Lock()
# Held from a tracked process's fork until its pid is recorded: left_behind() must never see a process
# half started (forked, not yet exec'd or not yet recorded), and take an engine's for a stage's.
_starting = threading.Lock()


def _fresh_lock_in_child() -> None:  # a fork while another thread held it must not leave it held
    global _starting
    _starting = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


@contextlib.contextmanager
def launching_engine():
    """Processes this thread starts with subprocess in the body are an engine's (a JVM, Ray's
    daemons), which left_behind() never counts as a stage's, whatever other threads run meanwhile."""
    _track_process_starts()
    _launching.depth = getattr(_launching, "depth", 0) + 1
    try:
        yield
    finally:
        _launching.depth -= 1


def _track_process_starts() -> None:
    """Wrap, once, the two places processes are created: subprocess.Popen's (pyspark's and Ray's, which
    import the class under their own names) in a launching thread, and multiprocessing's spawn in any
    thread (a local Dask cluster's nanny starts its worker, and restarts it, from its own thread)."""
    from multiprocessing import popen_spawn_posix

    with _tracking:
        popen = subprocess.Popen._execute_child
        if getattr(popen, "hybridflow_tracked", False):
            return

        def execute_child(self, *args, **kwargs):
            if not getattr(_launching, "depth", 0):
                return popen(self, *args, **kwargs)
            with _starting:
                popen(self, *args, **kwargs)
                _engine_processes.add(self.pid)

        spawn = popen_spawn_posix.Popen._launch

        def launch(self, *args, **kwargs):
            with _starting:
                spawn(self, *args, **kwargs)
                _spawned_workers.add(self.pid)

        execute_child.hybridflow_tracked = True
        subprocess.Popen._execute_child = execute_child
        popen_spawn_posix.Popen._launch = launch


def left_behind(before: set[int]) -> set[int]:
    """Children of this process that are not in `before` (the children when a stage began) nor an
    engine's, with everything under them: what a stage started and left running, and what it
    detached (adopted by this process: adopt_orphans). Multiprocessing's workers are left alone: a
    local Dask cluster's nanny, in this process, starts a new one in place of a worker that died.
    A process that has ended is left alone: reaping it would take its exit status from whoever
    waits for it (an engine's Popen)."""
    with _starting:
        found = children() - before - _engine_processes - _spawned_workers
    found = {pid for pid in found if b"multiprocessing" not in _cmdline(pid) and not _of_a_cluster(pid)}
    return found | _under(found)


def _of_a_cluster(pid: int) -> bool:
    """Started by a cluster provider's command for the run (provisioning tags them), adopted here when
    that command ended: the cluster's, which its `down` stops."""
    try:
        return b"\0HYBRIDFLOW_CLUSTER_NAME=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
