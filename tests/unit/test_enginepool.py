"""The engine pool's bookkeeping, on an engine whose start the test holds open: no engine is stopped
while its background start is still under way, whatever the run does meanwhile (a stop request
while a stage waits for it, the early stop of engines no stage still needs)."""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import pytest

from hybridflow import backends
from hybridflow.execution.enginepool import EnginePool
from hybridflow.execution.stopping import SignalState, Terminated

NAME = "heldstart"


class HeldStart:
    """A backend whose start() waits until the test releases it; it records what happened, in order."""

    release = threading.Event()
    events: list[str] = []

    def start(self, code=()) -> None:
        self.events.append("starting")
        assert self.release.wait(30), "the test never released the start"
        self.events.append("started")

    def check_versions(self) -> None:
        pass

    def check_shared_workdir(self, workdir) -> bool:
        self.events.append(f"sees {workdir}")
        return True

    def stop(self) -> None:
        self.events.append("stopped")

    def place(self, **placement) -> None:
        pass


def create(settings, log_dir) -> HeldStart:  # the registry's entry point for NAME
    return HeldStart()


@pytest.fixture
def held_engine():
    HeldStart.release.clear()
    HeldStart.events.clear()
    backends.register(backends.Engine(name=NAME, module=__name__, frame_types="nothing"))
    yield HeldStart
    HeldStart.release.set()
    backends.engines().pop(NAME, None)


def pool(tmp_path, signals: SignalState, shared_workdir=None) -> EnginePool:
    pipeline = SimpleNamespace(engine_settings=lambda name: None, secrets=(), stages={}, root=tmp_path, remote=None,
                               spec=SimpleNamespace(lineage=None),
                               workdir=tmp_path, uses_object_storage=False, store=None)
    (tmp_path / "logs").mkdir(exist_ok=True)
    return EnginePool(pipeline, [], tmp_path / "logs", signals=signals, shared_workdir=shared_workdir)


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_stop_request_while_a_stage_waits_never_stops_the_engine_under_its_start(tmp_path, held_engine):
    signals = SignalState()
    engines = pool(tmp_path, signals)
    engines.start_early([NAME])
    try:
        wait_until(lambda: held_engine.events == ["starting"])
        signals.signum = signal.SIGINT  # Ctrl-C while the stage that needs it waits for it
        with pytest.raises(Terminated):
            engines.get(NAME)
        engines.keep_only(set())  # what the runner does after every stage: no stage still needs it
        assert held_engine.events == ["starting"]  # not stopped while it starts
    finally:
        held_engine.release.set()
        engines.stop_all()  # waits for the start, then stops it
    assert held_engine.events == ["starting", "started", "stopped"]


def test_an_engine_started_early_and_no_longer_needed_is_stopped_once_its_start_is_taken(tmp_path, held_engine):
    engines = pool(tmp_path, SignalState())
    engines.start_early([NAME])
    try:
        held_engine.release.set()
        engines.get(NAME)
        assert engines.seconds[NAME] >= 0
        engines.keep_only(set())
        assert held_engine.events == ["starting", "started", "stopped"]
    finally:
        engines.stop_all()
    assert held_engine.events == ["starting", "started", "stopped"]  # stopped once


def test_an_engine_given_up_while_it_starts_is_stopped_by_its_start_once_up(tmp_path, held_engine):
    engines = pool(tmp_path, SignalState())
    engines.start_early([NAME])
    try:
        wait_until(lambda: held_engine.events == ["starting"])
        engines.keep_only(set())  # a failure blocked the stage it was starting for
        assert held_engine.events == ["starting"]  # never stopped under its start
        held_engine.release.set()
        wait_until(lambda: held_engine.events == ["starting", "started", "stopped"])  # not only at the end
        assert engines.started() == []
    finally:
        engines.stop_all()
    assert held_engine.events == ["starting", "started", "stopped"]  # stopped once


def test_an_engine_given_up_while_it_starts_and_then_asked_for_starts_afresh(tmp_path, held_engine):
    engines = pool(tmp_path, SignalState())
    engines.start_early([NAME])
    try:
        wait_until(lambda: held_engine.events == ["starting"])
        engines.keep_only(set())
        held_engine.release.set()
        assert engines.get(NAME) is not None
        assert held_engine.events == ["starting", "started", "stopped", "starting", "started"]
    finally:
        engines.stop_all()
    assert held_engine.events[-1] == "stopped" and held_engine.events.count("stopped") == 2


@pytest.mark.parametrize("shared", [True, False], ids=["a local workdir", "a workdir in object storage"])
def test_an_engine_is_made_to_prove_it_sees_the_workdir_only_where_the_run_shares_one(tmp_path, held_engine, shared):
    HeldStart.release.set()
    engines = pool(tmp_path, SignalState(), shared_workdir=tmp_path / "work" if shared else None)
    try:
        engines.get(NAME)
    finally:
        engines.stop_all()
    assert (f"sees {tmp_path / 'work'}" in HeldStart.events) is shared
