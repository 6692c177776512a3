"""How a run stops: a stage's time limit, SIGINT and SIGTERM turned into exceptions in the main
thread, and the engine cancels that unblock a main thread waiting inside an engine. The runner's
session installs them; the stage executor runs each stage inside a time limit."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable

from ..errors import InterruptedRun, StageTimeout


class TimedOut(BaseException):
    """Raised in the main thread when a stage's timeout fires (BaseException: user code that catches
    Exception cannot swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float | None, backend, stage: str, end_run=None):  # noqa: C901 - the timer, its handler and their cleanup, together
    """Run the body for at most `seconds`. When time is up, a timer thread asks the engine to cancel
    its work (which unblocks a main thread waiting on it) and interrupts the main thread with
    SIGALRM; any way the body then ends becomes a StageTimeout. A body that still has not ended
    STUCK_AFTER seconds later is busy in native code: `end_run(error)` ends the whole run."""
    if not seconds:
        yield
        return
    fired, finished = threading.Event(), threading.Event()
    main = threading.main_thread()
    in_main = threading.current_thread() is main

    switching = threading.Lock()  # restoring SIGALRM's handler: no alarm put off is sent after it
    outside = OutsideImports(switching, lambda: not finished.is_set())

    def on_alarm(signum, frame):
        if not finished.is_set() and outside.now(signum, frame):
            raise TimedOut()

    def expire():
        if finished.is_set():
            return  # the body ended in time: its result stands
        fired.set()
        with contextlib.suppress(Exception):
            backend.cancel()
        if in_main and not finished.is_set():
            signal.pthread_kill(main.ident, signal.SIGALRM)
        _cancel_until_it_ends(backend, finished, stage, seconds, end_run if in_main else None)

    previous = signal.signal(signal.SIGALRM, on_alarm) if in_main else None
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    timed_out = StageTimeout(f"stage '{stage}' timed out after {seconds_text(seconds)}; its engine work was "
                             "cancelled", hint="raise its timeout, or make it faster")
    try:
        yield
        finished.set()
    except BaseException as exc:
        finished.set()
        if fired.is_set() and not isinstance(exc, Terminated):
            raise timed_out from exc
        raise
    finally:
        timer.cancel()
        timer.join()  # a late expire() must not cancel or signal anything after this point
        outside.cancel()
        if in_main:
            with switching:
                signal.signal(signal.SIGALRM, previous)
    if fired.is_set():
        raise timed_out  # no signal interrupted the body (none could, or it ended first): it ran too long


def _cancel_until_it_ends(backend, finished: threading.Event, stage: str, seconds: float, end_run) -> None:
    """A timed-out stage's engine work cancelled again until the stage ends; `end_run(error)` ends the
    run when it does not within STUCK_AFTER seconds (None: nothing more can be done from here)."""
    stuck = StageTimeout(f"stage '{stage}' timed out after {seconds_text(seconds)} and did not stop within "
                         f"{STUCK_AFTER:g}s more (busy in native code outside its engine), so the run was ended",
                         hint="raise its timeout, or make it faster")
    keep_cancelling(backend, finished.is_set, pause=finished.wait, stuck=(lambda: end_run(stuck)) if end_run else None)


# Seconds a stage may take to end after its engine work was cancelled (a timeout, a stop request)
# before the run is ended around it: on a loaded machine a cancel and its engine's reply take a few.
STUCK_AFTER = 6.0


def keep_cancelling(engine, done, pause=time.sleep, seconds: float = 60, stuck=None) -> None:
    """After a first cancel: cancel the engine's work again each second until `done()` (the stage
    has ended) or `seconds` pass, since work the stage starts after a cancel (an actor still being
    created, a task submitted late) must not keep it waiting. `pause(1)` waits a second. A stage
    still not done STUCK_AFTER seconds after the first cancel is handed to `stuck()`."""
    started = time.monotonic()
    while not done() and time.monotonic() - started < seconds:
        pause(1)
        if done():
            return
        if stuck is not None and time.monotonic() - started >= STUCK_AFTER:
            stuck()
            return
        with contextlib.suppress(Exception):
            engine.cancel()


IMPORT_CODE = "<frozen importlib"  # the file name of CPython's own import code in a frame
RESEND_AFTER = 0.005  # seconds after which a signal put off is sent again
RESEND_FOR = 1.0  # seconds one signal is put off at most: past them it is raised wherever it comes


class OutsideImports:
    """Whether a handler may raise where it was called. Inside CPython's import code an exception can
    leave the global import lock held for good (between its acquire and the `try` that gives it
    back): every other thread's next import then waits forever, the stop deadline's included as it
    tells the run's end. There the exception is put off: the signal is sent to the main thread again
    RESEND_AFTER seconds later, while `wanted()`, checked and sent under `lock` (the lock the handler
    is removed under, so none is sent once it is gone), until it comes outside that code or RESEND_FOR
    seconds have passed (the main thread then waits on another thread's import: raising is safe)."""

    def __init__(self, lock: threading.Lock, wanted: Callable[[], bool]) -> None:
        self.lock, self.wanted = lock, wanted
        self.resent = False  # the signal being handled was sent again from here
        self._since: float | None = None
        self._timer: threading.Timer | None = None

    def now(self, signum: int, frame) -> bool:
        """True: raise now; False: put off, the signal sent again shortly."""
        resent, self.resent = self.resent, False
        if not resent:
            self._since = None  # a new signal: its own RESEND_FOR
        inside = frame is not None and frame.f_code.co_filename.startswith(IMPORT_CODE)
        if not inside or (self._since is not None and time.monotonic() - self._since > RESEND_FOR):
            self._since = None
            return True
        self._since = self._since or time.monotonic()
        self._timer = threading.Timer(RESEND_AFTER, self._send, (signum,))
        self._timer.daemon = True
        self._timer.start()
        return False

    def cancel(self) -> None:
        """No signal put off is sent again (one being sent is decided under the lock)."""
        if self._timer is not None:
            self._timer.cancel()
        self._since = None

    def _send(self, signum: int) -> None:
        with self.lock:
            if self.wanted():
                self.resent = True
                with contextlib.suppress(ProcessLookupError, RuntimeError):  # the process is ending
                    signal.pthread_kill(threading.main_thread().ident, signum)


def seconds_text(value: float) -> str:
    return f"{value:g}s" if value < 120 else f"{value / 60:g}m"


class Terminated(BaseException):
    """SIGINT or SIGTERM, raised in the main thread so cleanup runs the same way for both."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RunEnded(BaseException):
    """Raised in the main thread when its stage's native call returns after the run was ended around
    it (forcedend.ForcedEnd.end_stuck_run): the run is over and recorded, and nothing more of it may happen.
    BaseException, as Terminated: stage code that catches Exception cannot swallow it."""

    def __init__(self, error) -> None:
        super().__init__(error)
        self.error = error  # what ended the run: a StageTimeout or an InterruptedRun


class SignalState:
    """The signal a run received. Engine code may swallow the exception the handler raises (a
    KeyboardInterrupt caught inside a library), so the runner also checks this between steps: a run
    that was asked to stop never goes on to publish."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.installed = False
        self._deferred = False
        self.running = None  # the engine of the stage being called, which a stop request cancels
        self.on_stuck = None  # called with an InterruptedRun when the stage does not end after a cancel
        self.ended = None  # the error the run was ended around a stuck stage with: every check() raises it
        self.stopped_by = None  # the error a run stopped by itself ends with (its lease lost), not a signal's
        self.on_stop_requested = None  # called once with the first stop request's signal number
        self._requested = False
        self._cancelling = None  # the engine a thread is cancelling now: a signal sent again starts no other
        self._switching = threading.Lock()  # installing or removing the handlers, or stopping by a signal
        self._raised = False  # the stop request was raised in the main thread (by the handler or check())
        self._outside = OutsideImports(self._switching, lambda: self.installed and self.ended is None
                                       and not self._raised)

    def on_wakeup(self, signum: int) -> None:
        """Called from the watcher thread the moment SIGINT or SIGTERM arrives, even while the main
        thread is blocked in an engine's native wait (ray.get, a Spark action) where Python's own
        handler cannot run: cancelling the engine's work unblocks it, and the handler then runs."""
        if not self._requested and self.on_stop_requested is not None:
            self._requested = True
            try:
                self.on_stop_requested(signum)
            except Exception as exc:  # this thread must go on watching, and the stage must still be cancelled
                import logging

                logging.getLogger("hybridflow").warning("could not arm the stop deadline: %s", exc)
        engine = self.running
        if engine is None or self._deferred or self._cancelling is engine:
            return
        self._cancelling = engine

        def cancel_until_the_stage_ends() -> None:
            try:
                with contextlib.suppress(Exception):
                    engine.cancel()
                stuck = (lambda: self.on_stuck(self.stopped_by or InterruptedRun(signum))) if self.on_stuck else None
                keep_cancelling(engine, lambda: self.running is not engine, stuck=stuck)
            finally:
                self._cancelling = None

        threading.Thread(target=cancel_until_the_stage_ends, name="hybridflow-cancel", daemon=True).start()

    def on_signal(self, signum, frame) -> None:
        if self.ended is not None:
            return  # the run was ended already: the main thread's next check() raises RunEnded
        if self._outside.resent and self._raised:
            self._outside.resent = False
            return  # put off inside import code, then raised by check() before it came again
        self.signum = signum
        if self._deferred or not self._outside.now(signum, frame):
            return  # raised by the next check(), or by this handler once the import code is left
        self._raised = True
        raise Terminated(signum)

    def stop_for(self, error) -> None:
        """Stop the run as a SIGTERM would, from any thread, ending it with `error` (a HybridflowError)
        instead of as interrupted: the running stage's engine work is cancelled and the main thread
        interrupted; a stage that runs without the handlers installed stops at the next check()."""
        self.stopped_by = error
        with self._switching:
            self.signum = self.signum or signal.SIGTERM
            # our handler, never the default one (which would end the process); the main thread itself
            # raises at its next check()
            if self.installed and not self._raised and threading.current_thread() is not threading.main_thread():
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    @property
    def deferring(self) -> bool:
        """A stop request is held (a commit is under way)."""
        return self._deferred

    @contextlib.contextmanager
    def deferred(self):
        """Hold a stop request until the block ends (it is then raised by the next check())."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    def reclaim(self) -> None:
        """Take SIGINT/SIGTERM back after an engine started: ray.init installs its own SIGTERM handler,
        which would exit at once, skipping cleanup and the run record."""
        if self.installed:
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, self.on_signal)

    def reset(self) -> None:
        """A new run of the same Runner (a watch loop) starts with no stop asked for."""
        self.signum = self.ended = self.stopped_by = None
        self._requested = self._raised = False

    def check(self) -> None:
        if self.ended is not None:
            raise RunEnded(self.ended)
        if self.signum is not None:
            self._raised = True
            self._outside.cancel()
            raise Terminated(self.signum)


@contextlib.contextmanager
def signals_as_exceptions(state: SignalState):
    try:
        previous = {s: signal.signal(s, state.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    state.installed = True
    watcher = SignalWatcher(state)
    try:
        yield
    finally:
        watcher.close()
        state._outside.cancel()
        with state._switching:
            state.installed = False
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class SignalWatcher:
    """Python runs signal handlers only when the main thread gets back to the interpreter; the C-level
    handler also writes each signal's number to a wake-up socket at once, which this thread reads."""

    def __init__(self, state: SignalState) -> None:
        import socket

        self.state = state
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        self.previous_fd = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="hybridflow-signals", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while True:
            try:
                data = self.reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    self.state.on_wakeup(signum)

    def close(self) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        self.writer.close()  # the reader sees the end and the thread returns
        self.thread.join(timeout=5)
        self.reader.close()
