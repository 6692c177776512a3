"""A stop request that arrives inside CPython's import code is raised just after it: an exception
raised there can leave the global import lock held, and every other thread's next import (the stop
deadline telling the run's end) would wait forever."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from hybridflow.execution.stopping import SignalState, Terminated, signals_as_exceptions


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


def test_a_stop_request_inside_the_import_machinery_after_the_run_ended_is_not_sent_again():
    frame = import_machinery_frame()
    state = SignalState()
    with signals_as_exceptions(state):
        state.on_signal(signal.SIGTERM, frame)
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _: received.append(signum))
    try:
        time.sleep(0.2)  # the handlers are gone: nothing is sent to the process that ran the run
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == []
