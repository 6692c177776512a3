"""One run per pipeline at a time, held by a kernel lock that dies with its process.

flock is released by the kernel when the holder exits for any reason, SIGKILL
included, so it can never go stale the way a PID file does. The file's content
only names the holder for the error message; the lock itself is the truth.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from .errors import LockedError

_HELD: set[int] = set()  # descriptors of the locks this process holds


def _close_held_in_child() -> None:
    """A forked child (a python stage's process) must not keep a run's lock alive: the lock belongs
    to the run, and ends with the runner's process."""
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


class RunLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, run_id: str, wait: bool = False) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockedError(f"another run of this pipeline is in progress ({holder})",
                              hint="wait for it to finish, or pass --wait") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"run_id": run_id, "pid": os.getpid(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
        self._fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"run {info['run_id']} started {info['started']}, pid {info['pid']}"
    except (ValueError, KeyError):
        return "holder unknown"
