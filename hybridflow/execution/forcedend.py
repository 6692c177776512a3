"""Ending a run from a helper thread, when its main thread cannot be got back: a stage busy in native
code that no cancel and no Python signal handler interrupts, or a stop request whose run is still
alive past its deadline (an engine's stop that waits forever). The run is recorded and told as ended,
every process it started is ended, and a CLI's process exits with the error's code.

Two locks decide who ends a run: `ending` is held by whichever thread finishes it (the main thread
after its stages, or a forced end), `reporting` by whichever tells its end (the main thread's
_close, or a forced end): a run is never ended or told twice. The runner records the run's end
itself (`record`); this module only holds the choreography around it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from .. import processes
from ..errors import HybridflowError, InterruptedRun
from .stopping import RunEnded, SignalState

TELLING_WAIT = 150.0  # seconds telling a run's end may take: MLflow's wait for its records, notifications' tries
LEASE_RELEASE_WAIT = 10.0  # seconds a forced end waits for the lease's release before the process exits


class ForcedEnd:
    """The forced ends of one runner's runs. `record(live, error)` ends the engines and records and
    tells the run as ended (from the helper thread); `release_lease` gives the run's lock back before a
    CLI's process exits; `exit_when_stuck`: a CLI run (the process exits), not a library caller's;
    `deadline`: the seconds a run asked to stop may take (enginepool.stop_deadline)."""

    def __init__(self, signals: SignalState, record: Callable[[Any, HybridflowError], None],
                 release_lease: Callable[[], None], *, exit_when_stuck: bool, deadline: Callable[[], float]) -> None:
        self.signals, self.record, self.release_lease = signals, record, release_lease
        self.exit_when_stuck, self.deadline = exit_when_stuck, deadline
        self.live = None  # the run in progress once its stages run: what a stuck stage's end needs
        self.opened = None  # the run recorded as running, its stages begun or not: what an overdue end needs
        self.ending = threading.Lock()  # held by whichever ends the run: the main thread or a forced end
        self.reporting = threading.Lock()  # held by whichever tells the run's end: _close or a forced end
        self.telling = False  # the main thread holds `reporting`
        self.over = threading.Event()  # set when run() returns or raises: a stop deadline has nothing to do
        self.ender: threading.Thread | None = None  # the thread that ended it
        signals.on_stuck = self.end_stuck_run
        signals.on_stop_requested = self.arm_stop_deadline

    def begin(self) -> None:
        """A new run of the runner (a watch loop runs again)."""
        self.over = threading.Event()
        self.live = self.opened = None

    def tell_end(self) -> None:
        """The main thread tells the run's end: held until run() is over (an overdue end that tells it
        already ends this process)."""
        self.reporting.acquire()
        self.telling = True

    def run_over(self) -> None:
        self.over.set()
        if self.telling:  # held since tell_end: a stop deadline could not tell the end again
            self.telling = False
            self.reporting.release()

    def changes_allowed(self) -> None:
        """Once a run was ended around a stuck stage, only the thread that ended it records anything:
        the main thread, back from its native call, raises RunEnded instead (no stage saved again, no
        listener told after the run's end)."""
        if self.signals.ended is not None and threading.current_thread() is not self.ender:
            raise RunEnded(self.signals.ended)

    def end_stuck_run(self, error: HybridflowError) -> None:
        """The last resort when a stop request or a timeout could not get the main thread back (called
        from a helper thread): ends every process the run started, records the run and reports it.
        Then the CLI's process exits with the error's code; a library caller's does not: when the
        native call returns, the main thread raises the error to it, publishing nothing (every check of
        the signal state raises RunEnded from then on). Published data is safe: no commit is under way
        (a commit defers stop requests; a stop deadline waits for it), and staging is never read."""
        live = self.live
        if live is None or self.signals.ended is not None or not self.ending.acquire(blocking=False):
            return  # the main thread is ending the run, or it was ended already (a second stop request)
        if not self.reporting.acquire(blocking=False):
            self.ending.release()
            return  # the main thread is telling the run's end already
        self._end_around(live, error, holding=True)

    def arm_stop_deadline(self, signum: int) -> None:
        """A CLI run asked to stop ends within its deadline: past it, whatever still holds the process
        is written to the run's logs as every thread's stack, and the run is ended around it as around
        a stuck stage. A library caller's process is never ended from here."""
        if not self.exit_when_stuck:
            return
        over, seconds = self.over, self.deadline()

        def wait_then_end() -> None:
            if not over.wait(seconds):
                self._end_overdue_run(signum, seconds)

        threading.Thread(target=wait_then_end, name="hybridflow-stop-deadline", daemon=True).start()

    def _end_overdue_run(self, signum: int, seconds: float) -> None:
        live = self.opened
        waited = time.monotonic()
        while self.signals.deferring and time.monotonic() - waited < seconds:
            time.sleep(0.5)  # a commit under way ends first: what it publishes is recorded as published
        error = self.signals.stopped_by or InterruptedRun(signum)
        if live is None:  # still waiting for its lock or lease: nothing of the run recorded to end
            logging.getLogger("hybridflow").warning("the run did not start within %gs of its stop request", seconds)
            processes.end_all()
            exit_now(int(error.exit_code))
            return
        if self.signals.ended is not None or not self.reporting.acquire(blocking=False):
            # ended around a stuck stage, or telling its end: each has bounds of its own (trackers,
            # notifications) that have run out too
            if not self.over.wait(TELLING_WAIT):
                logging.getLogger("hybridflow").warning("the run's end was not told within %gs; %s",
                                                        TELLING_WAIT, _dump_stacks(live))
                exit_now(int(error.exit_code))
            return
        sys.stdout, sys.stderr = live.streams  # the warning goes where the run's own output does
        logging.getLogger("hybridflow").warning("the run did not end within %gs of its stop request; %s",
                                                seconds, _dump_stacks(live))
        # the main thread holds `ending` when what hangs is its own cleanup (an engine's stop)
        self._end_around(live, error, holding=self.ending.acquire(blocking=False))

    def _end_around(self, live, error: HybridflowError, *, holding: bool) -> None:
        """End the run from this helper thread (a stuck stage's end, or an overdue one). Holds `reporting`."""
        self.signals.ended = error  # from now on nothing more of this run may happen in the main thread
        self.ender = threading.current_thread()
        if self.exit_when_stuck:  # telling the end (trackers, notifications) must not hold the process
            bound = threading.Timer(TELLING_WAIT, exit_now, (int(error.exit_code),))
            bound.daemon = True
            bound.start()
        try:
            self.record(live, error)
        finally:
            processes.end_all()  # again: an engine still running in a thread here replaces what died
            if self.exit_when_stuck:
                # a lease in object storage: the next run need not wait out its expiry (bounded: a store
                # that does not answer must not keep the process)
                releasing = threading.Thread(target=self.release_lease, daemon=True)
                releasing.start()
                releasing.join(LEASE_RELEASE_WAIT)
                exit_now(int(error.exit_code))
            self.reporting.release()
            if holding:
                self.ending.release()  # the main thread, back from its native call, raises the error


def _dump_stacks(live) -> str:
    """Every thread's stack written to the run's logs, when the run is about to be ended around them;
    says where, for the warning."""
    stacks = live.run_dir / "logs" / "stop-stacks.log"
    try:
        stacks.parent.mkdir(parents=True, exist_ok=True)
        with stacks.open("w") as out:
            faulthandler.dump_traceback(out, all_threads=True)
    except OSError:
        return "its threads' stacks could not be written"
    return f"every thread's stack is in {stacks}"


def exit_now(code: int) -> None:
    """End the process at once (a forced end), its output flushed first: os._exit skips it, and a
    summary sent to a file or a pipe would be lost."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
