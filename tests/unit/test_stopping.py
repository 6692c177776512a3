"""A stop request that arrives inside CPython's import code is raised just after it: an exception
raised there can leave the global import lock held, and every other thread's next import (the stop
deadline telling the run's end) would wait forever."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from hybridflow.execution import stopping
from hybridflow.execution.stopping import OutsideImports, SignalState, Terminated, signals_as_exceptions


class FrameCatcher:
    """A finder that keeps the import machinery's frame that asked it: where a signal can land."""

    def __init__(self) -> None:
        self.frame = None

    def find_spec(self, name, path=None, target=None):
        if name == "hybridflow_test_never_found":
            self.frame = sys._getframe(1)
        return None


def import_machinery_frame():
    catcher = FrameCatcher()
    sys.meta_path.insert(0, catcher)
    try:
        with pytest.raises(ModuleNotFoundError):
            __import__("hybridflow_test_never_found")
    finally:
        sys.meta_path.remove(catcher)
    assert catcher.frame.f_code.co_filename.startswith("<frozen importlib")
    return catcher.frame


def test_a_stop_request_inside_the_import_machinery_is_raised_once_it_is_left():
    frame = import_machinery_frame()
    state = SignalState()
    with signals_as_exceptions(state):
        state.on_signal(signal.SIGINT, frame)  # returns: raising here could leave the import lock held
        assert state.signum == signal.SIGINT
        with pytest.raises(Terminated) as stopped:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)  # the signal is sent again, and raised here
        assert stopped.value.signum == signal.SIGINT
        with pytest.raises(Terminated):
            state.on_signal(signal.SIGINT, sys._getframe())  # anywhere else: at once


def test_a_stop_request_put_off_then_raised_by_a_check_is_not_raised_again():
    frame = import_machinery_frame()
    state = SignalState()
    with signals_as_exceptions(state):
        state.on_signal(signal.SIGINT, frame)
        with pytest.raises(Terminated):
            state.check()  # the run's own check came first: the stop is under way
        time.sleep(0.2)  # the signal sent again must not interrupt the cleanup a second time


def test_a_stop_request_inside_the_import_machinery_after_the_run_ended_is_not_sent_again():
    frame = import_machinery_frame()
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _: received.append(signum))  # restored after the run
    try:
        state = SignalState()
        with signals_as_exceptions(state):
            state.on_signal(signal.SIGTERM, frame)
        time.sleep(0.2)  # the run's handlers are gone: nothing is sent to the process that ran the run
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == []


def test_a_signal_is_put_off_for_a_bounded_time_only(monkeypatch):
    monkeypatch.setattr(stopping, "RESEND_FOR", 0.05)
    frame = import_machinery_frame()
    outside = OutsideImports(threading.Lock(), lambda: False)  # nothing is actually sent again here
    assert outside.now(signal.SIGINT, frame) is False
    time.sleep(0.1)  # waiting on another thread's import, say: raised anyway
    outside.resent = True  # as the sender marks the signal it sends again
    assert outside.now(signal.SIGINT, frame) is True
    assert outside.now(signal.SIGINT, sys._getframe()) is True  # outside import code: at once


def test_a_new_signal_inside_import_code_is_put_off_again_after_an_earlier_one_was_raised(monkeypatch):
    monkeypatch.setattr(stopping, "RESEND_FOR", 0.05)
    frame = import_machinery_frame()
    state = SignalState()
    with signals_as_exceptions(state):
        state.on_signal(signal.SIGINT, frame)
        with pytest.raises(Terminated):
            state.check()
        time.sleep(0.1)  # past RESEND_FOR since the first one was put off
        state.on_signal(signal.SIGTERM, frame)  # a new request, put off as the first one was: no raise here


def test_a_signal_sent_again_after_the_stop_was_raised_raises_nothing():
    state = SignalState()
    with signals_as_exceptions(state):
        with pytest.raises(Terminated):
            state.on_signal(signal.SIGINT, sys._getframe())
        state._outside.resent = True  # what the put-off sender marks as it sends the signal again
        state.on_signal(signal.SIGINT, sys._getframe())  # the run is stopping already: not a second time
        with pytest.raises(Terminated):
            state.on_signal(signal.SIGINT, sys._getframe())  # a new Ctrl-C is one
