"""Each engine starts when asked, stops everything it started (twice is fine), and fails fast and
in one line when it cannot start or its cluster does not answer."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from hybridflow import backends
from hybridflow.backends.engineoutput import process_output_to
from hybridflow.definition.config import check_file
from hybridflow.engines.dask import DaskSettings
from hybridflow.engines.ray import RaySettings
from hybridflow.engines.spark import SparkSettings
from hybridflow.errors import UnavailableError
from hybridflow.installing import install_extras
from tests.support.engines import TEST_SETTINGS, child_pids


@pytest.mark.parametrize("name", ["spark", "dask", "ray"])
def test_stop_ends_every_process_the_engine_started_and_is_safe_twice(tmp_path, name):
    before, threads_before = child_pids(), set(threading.enumerate())
    engine = backends.create(name, TEST_SETTINGS[name], tmp_path)
    with process_output_to(tmp_path / "engines.log"):
        engine.start()
    assert child_pids() - before, f"{name} started no process?"
    engine.stop()
    engine.stop()
    # nor socket servers of this process (pyspark's accumulator server is shut down aside, not waited for)
    servers = lambda: [t for t in set(threading.enumerate()) - threads_before if "serve_forever" in t.name]  # noqa: E731
    deadline = time.monotonic() + 120
    while (child_pids() - before or servers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = child_pids() - before
    assert not left, f"{name}: processes alive 120 s after stop(): {sorted(left)}"
    assert not servers(), servers()


@pytest.mark.parametrize("name, settings, address", [
    ("spark", SparkSettings(master="spark://127.0.0.1:1"), "spark://127.0.0.1:1"),
    ("dask", DaskSettings(address="tcp://127.0.0.1:1"), "tcp://127.0.0.1:1"),
    ("ray", RaySettings(address="127.0.0.1:1"), "127.0.0.1:1"),
])
def test_unreachable_cluster_is_one_line_naming_backend_and_address(tmp_path, name, settings, address):
    engine = backends.create(name, settings, tmp_path)
    with pytest.raises(UnavailableError) as info:  # a hang here is caught by pytest's global timeout
        engine.start()
    message = info.value.one_line()
    assert f"cannot reach the {name} cluster at {address}" in message and "\n" not in message
    engine.stop()


def test_missing_extra_is_reported_by_validate_and_run_with_the_install_command(project, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a))
    project.stages("def tune(x):\n    return x\n")
    path = project.pipeline("name: demo\ndatasets: {x: {path: x.parquet}}\n"
                            "stages:\n  tune: {run: 'mypkg.steps:tune', backend: ray, inputs: [x], outputs: [y]}\n")
    _, problems = check_file(path)
    [warning] = [p for p in problems if "ray" in p.message]
    assert warning.severity == "warning" and warning.line == 4
    assert install_extras("ray") in warning.message
    with pytest.raises(UnavailableError) as info:
        backends.require("ray")
    assert info.value.hint == install_extras("ray")


def test_rays_session_directory_is_private_and_removed_at_stop(tmp_path):
    """What Ray's workers log (a task's prints, secrets too) stays in an owner-only directory of this
    run, not the shared /tmp/ray, and is gone once the engine stops."""
    import os
    import stat
    from pathlib import Path

    engine = backends.create("ray", TEST_SETTINGS["ray"], tmp_path)
    with process_output_to(tmp_path / "engines.log"):
        engine.start()
    try:
        ray = engine.ray
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        private = Path(engine._session_dir)
        assert private in session.parents and not str(session).startswith("/tmp/ray/")
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700

        @ray.remote
        def chatty():
            print("marker-7f3a printed by a task")
            return 1

        assert ray.get(chatty.remote()) == 1
    finally:
        engine.stop()
    assert not private.exists()

