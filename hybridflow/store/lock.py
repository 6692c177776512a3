"""One run per pipeline at a time, held by a kernel lock that dies with its process.

flock is released by the kernel when the holder exits for any reason, SIGKILL
included, so it can never go stale the way a PID file does. The file's content
only names the holder for the error message; the lock itself is the truth.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

from ..errors import HybridflowError, LockedError

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


# -- a workdir in object storage: a lease object, since runners on other machines share no kernel

LEASE = "LEASE"
LEASE_SECONDS = 60.0  # a dead runner's lease is taken over this long after its last renewal
RENEW_EVERY = LEASE_SECONDS / 4


class Lease:
    """The pipeline's lock as an object, <workdir>/<pipeline>/LEASE: taken by a create-only write,
    renewed by compare-and-swap while the run lives, released by deleting it. A runner that died
    stops renewing: its lease expires after LEASE_SECONDS and the next runner takes it over (at once
    when the dead runner was on this machine: its process is known to be gone)."""

    def __init__(self, objects, path) -> None:
        self.objects, self.path = objects, path  # an ObjectStore, an ObjectPath
        self._etag: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False

    def acquire(self, run_id: str, wait: bool = False) -> None:
        from ..data.objectstore import Conflict

        while True:
            try:
                self._etag = self.objects.write_json(self.path, self._holder(run_id), create_only=True)
                break
            except Conflict:
                pass
            held, etag = self.objects.read_json(self.path)
            if held is None:
                continue  # released meanwhile
            if _expired(held):
                try:  # compare-and-swap: of two runners taking over the same dead lease, one wins
                    self._etag = self.objects.write_json(self.path, self._holder(run_id), if_match=etag)
                    break
                except Conflict:
                    continue
            if not wait:
                raise LockedError(f"another run of this pipeline is in progress ({_describe(held)}), holding its "
                                  f"lease {self.path.uri}", hint="wait for it to finish, or pass --wait")
            time.sleep(2.0)
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, args=(run_id,), name="hybridflow-lease", daemon=True)
        self._renewer.start()

    def _holder(self, run_id: str) -> dict:
        return {"run_id": run_id, "host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "expires": time.time() + LEASE_SECONDS}

    def _renew(self, run_id: str) -> None:
        from ..data.objectstore import Conflict

        while not self._stop.wait(RENEW_EVERY):
            try:
                self._etag = self.objects.write_json(self.path, self._holder(run_id), if_match=self._etag)
            except Conflict:  # taken over: this run's commits will fail their own compare-and-swap
                self.lost = True
                return
            except Exception:  # noqa: BLE001 - the store did not answer this time: try again next time
                continue

    def release(self) -> None:
        from ..data.objectstore import Conflict

        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)
            self._renewer = None
        if self._etag is not None and not self.lost:
            with contextlib.suppress(Conflict, HybridflowError):  # expired and taken over: not ours to delete
                self.objects.delete(self.path, if_match=self._etag)
        self._etag = None


def _expired(held: dict) -> bool:
    if time.time() > float(held.get("expires", 0)):
        return True
    mine = held.get("host") == socket.gethostname() and held.get("boot") == _boot_id()
    return mine and isinstance(held.get("pid"), int) and not _alive(held["pid"])


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (killed, not yet reaped by whoever adopted it) does not."""
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


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _describe(held: dict) -> str:
    until = time.strftime("%H:%M:%SZ", time.gmtime(float(held.get("expires", 0))))
    return f"run {held.get('run_id')} on host {held.get('host')}, pid {held.get('pid')}, lease renewed until {until}"


class PipelineLock:
    """The run lock of a pipeline: the local kernel lock, and the lease too when the workdir is in
    object storage (the local lock then guards this machine's cache of it)."""

    def __init__(self, local: RunLock, lease: Lease | None) -> None:
        self.local, self.lease = local, lease

    def acquire(self, run_id: str, wait: bool = False) -> None:
        self.local.acquire(run_id, wait)
        if self.lease is not None:
            try:
                self.lease.acquire(run_id, wait)
            except BaseException:
                self.local.release()
                raise

    def release(self) -> None:
        try:
            if self.lease is not None:
                self.lease.release()
        finally:
            self.local.release()


def pipeline_lock(pipeline) -> PipelineLock:
    home = pipeline.workdir / pipeline.name
    lease = None
    if pipeline.remote is not None:
        from ..data.objectstore import ObjectStore

        lease = Lease(ObjectStore(pipeline.store), pipeline.remote / pipeline.name / LEASE)
    return PipelineLock(RunLock(home / "run.lock"), lease)
