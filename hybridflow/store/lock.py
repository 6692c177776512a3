"""One run per pipeline at a time, held by a kernel lock that dies with its process.

flock is released by the kernel when the holder exits for any reason, SIGKILL
included, so it can never go stale the way a PID file does. The file's content
only names the holder for the error message; the lock itself is the truth.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from ..errors import ConfigError, HybridflowError, LockedError, first_line
from ..processes import running

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
LEASE_SECONDS = 60.0  # a dead runner's lease is taken over once seen unchanged this long
LEASE_ENV = "HYBRIDFLOW_LEASE_SECONDS"  # another length (every runner of a workdir should use the same)


def lease_seconds() -> float:
    try:
        seconds = float(os.environ.get(LEASE_ENV) or LEASE_SECONDS)
    except ValueError:
        raise ConfigError(f"{LEASE_ENV} must be a number of seconds, not {os.environ[LEASE_ENV]!r}") from None
    if seconds < 1:
        raise ConfigError(f"{LEASE_ENV} must be 1 or more seconds, not {seconds:g}")
    return seconds


class LeaseLost(LockedError):
    """This run can no longer prove it holds its lease: another runner may hold it now."""

    def __init__(self, workdir_uri: str) -> None:
        super().__init__(f"this run lost its lease on {workdir_uri}; nothing more was published")


class Lease:
    """The pipeline's lock as an object, <workdir>/<pipeline>/LEASE: taken by a create-only write,
    renewed by compare-and-swap while the run lives, released by deleting it.

    No two machines' clocks are compared. The holder keeps a deadline on its own monotonic clock (the
    moment it sent its last renewal that the store confirmed, plus the lease length, less a margin),
    and confirms the lease (a renewal on its own ETag) right before each commit, collection or reaping:
    past its deadline, or when the lease is no longer its own, it publishes nothing more (LeaseLost).
    A runner that finds the lease held takes it over only once it has seen the very same object (the
    same ETag) unchanged for the holder's lease length on its own monotonic clock, which a live holder
    never lets happen; or at once when the holder is a dead process of its own pid namespace."""

    def __init__(self, objects, path, workdir_uri: str | None = None) -> None:
        self.objects, self.path = objects, path  # an ObjectStore, an ObjectPath
        self.workdir_uri = workdir_uri or path.parent.parent.uri
        self.seconds = lease_seconds()
        self._etag: str | None = None
        self._deadline = 0.0  # on time.monotonic()
        self._nonce = self._run = ""
        self._writing = threading.Lock()  # renewals and confirmations: one compare-and-swap at a time
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False
        self.on_lost = None  # called (from the renewal thread) once the lease is lost: stops the run

    @property
    def margin(self) -> float:
        """Given up at the end of each lease: a store's answer that took a while, clocks that run at
        slightly different rates."""
        return self.seconds / 5

    def acquire(self, run_id: str, wait: bool = False) -> None:
        from ..data.objectstore import Conflict

        self.lost, self._nonce, self._run = False, secrets.token_hex(8), run_id
        seen: tuple[str, float] | None = None  # the holder's ETag, and since when (monotonic) it is unchanged
        while True:
            sent = time.monotonic()
            try:
                self._etag = self.objects.write_json(self.path, self._holder(run_id), create_only=True)
                break
            except Conflict:
                pass
            held, etag = self.objects.read_json(self.path)
            if held is None:
                continue  # released meanwhile
            if seen is None or seen[0] != etag:
                renewed = seen is not None
                seen = (etag, time.monotonic())
                if renewed and not wait:
                    raise self._locked(held)  # renewed while we watched: its holder lives
            if _dead_here(held) or time.monotonic() - seen[1] >= _length(held, self.seconds):
                sent = time.monotonic()
                try:  # compare-and-swap: of two runners taking over the same dead lease, one wins
                    self._etag = self.objects.write_json(self.path, self._holder(run_id), if_match=etag)
                    break
                except Conflict:
                    continue
            if not wait and _looks_fresh(held):
                raise self._locked(held)
            time.sleep(min(2.0, self.seconds / 4))
        self._deadline = sent + self.seconds - self.margin
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="hybridflow-lease", daemon=True)
        self._renewer.start()

    def _locked(self, held: dict) -> LockedError:
        return LockedError(f"another run of this pipeline is in progress ({_describe(held)}), holding its "
                           f"lease {self.path.uri}", hint="wait for it to finish, or pass --wait")

    def _holder(self, run_id: str) -> dict:
        return {"run_id": run_id, "nonce": self._nonce, "host": socket.gethostname(), "boot": _boot_id(),
                "pid_namespace": _pid_namespace(), "pid": os.getpid(), "seconds": self.seconds,
                # for people and for a quick refusal only: no runner trusts another machine's clock
                "renewed": time.time()}

    def confirm(self) -> None:
        """Prove the lease is still this run's, right before publishing anything: a renewal on its own
        ETag, within the deadline. Raises LeaseLost otherwise (and the store's own errors)."""
        from ..data.objectstore import Conflict

        with self._writing:
            if self.lost or self._etag is None or time.monotonic() > self._deadline:
                raise self._lose()
            sent = time.monotonic()
            try:
                self._etag = self.objects.write_json(self.path, self._holder(self._run), if_match=self._etag)
            except Conflict:
                raise self._lose() from None
            self._deadline = sent + self.seconds - self.margin
            if time.monotonic() > self._deadline:  # the answer took longer than the lease: proves nothing
                raise self._lose()

    def _lose(self) -> LeaseLost:
        """The lease is lost: said once, and the run told to stop (on_lost)."""
        error = LeaseLost(self.workdir_uri)
        if not self.lost:
            self.lost = True
            logging.getLogger("hybridflow").error("%s", error.message)
            if self.on_lost is not None:
                self.on_lost(error)
        return error

    def _renew(self) -> None:
        log = logging.getLogger("hybridflow")
        while not self._stop.wait(self.seconds / 4):
            try:
                self.confirm()
            except LeaseLost:  # said, and the run told to stop
                return
            except Exception as exc:  # noqa: BLE001 - the store did not answer: said, and tried again until the deadline
                log.warning("renewing the lease %s failed (tried again until %.0fs before it runs out): %s",
                            self.path.uri, self.margin, first_line(exc))

    def release(self) -> None:
        from ..data.objectstore import Conflict

        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)
            self._renewer = None
        if self._etag is not None:  # only while it is still our object: never a lease someone took over
            with contextlib.suppress(Conflict, HybridflowError):
                self.objects.delete(self.path, if_match=self._etag)
        self._etag = None


def _length(held: dict, own: float) -> float:
    """How long a lease must be seen unchanged before it is taken over: its holder's length, never
    less than ours."""
    try:
        return max(own, float(held.get("seconds", own)))
    except (TypeError, ValueError):
        return own


def _same_pid_namespace(held: dict) -> bool:
    """Whether the holder's pid means a process here: the same boot of the same kernel and the same
    pid namespace (containers on one host share the host name and boot id, but not their pids)."""
    return bool(held.get("pid_namespace")) and held.get("pid_namespace") == _pid_namespace() \
        and held.get("boot") == _boot_id() and isinstance(held.get("pid"), int)


def _dead_here(held: dict) -> bool:
    return _same_pid_namespace(held) and not running(held["pid"])


def _looks_fresh(held: dict) -> bool:
    """Whether the holder's own clock says it renewed within its lease length: a reason to refuse at
    once, never to take over (a lease that does not look fresh is watched before it is taken)."""
    try:
        age = time.time() - float(held.get("renewed", 0))
    except (TypeError, ValueError):
        return False
    return -_length(held, 0) <= age <= _length(held, 0)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _describe(held: dict) -> str:
    try:
        renewed = time.strftime("%H:%M:%SZ", time.gmtime(float(held.get("renewed", 0))))
    except (TypeError, ValueError):
        renewed = "?"
    return f"run {held.get('run_id')} on host {held.get('host')}, pid {held.get('pid')}, last renewed {renewed}"


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

    def confirm(self) -> None:
        """Right before publishing, collecting or reaping: raises LeaseLost when this run can no longer
        prove the pipeline is its own (the kernel lock cannot be lost while the process lives)."""
        if self.lease is not None:
            self.lease.confirm()

    def on_lost(self, stop) -> None:
        """`stop(error)` is called when the lease is lost while the run goes on: the run stops."""
        if self.lease is not None:
            self.lease.on_lost = stop

    def release(self) -> None:
        try:
            if self.lease is not None:
                self.lease.release()
        finally:
            self.local.release()
