"""What an engine needs beyond its package is its own declaration (backends.Engine): the checks
`hybridflow doctor` runs for it, the variables a cron run must carry for it, and the file its GPU
stages load. The core reads them from the registry; an engine registered at run time (as a plugin
package's is) gets each of them without any core module naming it."""

from __future__ import annotations

import dataclasses

import pytest

from hybridflow import backends
from hybridflow.backends import GpuPlugin, gpu
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import UnavailableError
from hybridflow.ops import doctor, schedule

GPU_MACHINE = gpu.Probe((gpu.Device(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559, "550.54.15"),), None,
                        {"cudf": True})


@pytest.fixture
def widgets(tmp_path):
    """An engine `widgets` (stages run in-process, as python's do) that needs WIDGETS_HOME, a licence
    file for its GPU stages, and a check of its own; registered for the test, then forgotten."""
    licence = tmp_path / "widgets.lic"
    found = {"path": None}

    def find(settings, root):
        return (found["path"], "WIDGETS_LICENCE") if found["path"] else (None, "no WIDGETS_LICENCE set")

    def checks(environ, needed):
        if environ.get("WIDGETS_HOME"):
            yield "widgets home", "ok", environ["WIDGETS_HOME"], ""
        else:
            yield "widgets home", needed, "WIDGETS_HOME is not set", "export WIDGETS_HOME=/opt/widgets"

    engine = dataclasses.replace(backends.engine("python"), name="widgets", doctor=checks,
                                 environment=("WIDGETS_HOME",), gpu=True, gpu_packages=(),
                                 gpu_plugin=GpuPlugin("widgets licence", "the widgets GPU licence", find,
                                                      "ask your vendor for widgets.lic"))
    backends.register(engine)
    try:
        yield licence, found
    finally:
        backends.engines.cache_clear()


def widgets_pipeline(project, gpu_mode="auto"):
    project.stages("def make():\n    import pandas as pd\n    return pd.DataFrame({'x': [1]})\n")
    return load_pipeline(project.pipeline(f"""
    name: widgetsdemo
    stages:
      make: {{run: mypkg.steps:make, backend: widgets, outputs: [numbers], gpu: {gpu_mode}}}
    """))


def test_doctor_runs_the_engines_own_checks_for_a_pipeline_that_uses_it(widgets, project):
    loaded = widgets_pipeline(project)
    rows = {f.check: f for f in doctor.check_engines(doctor.Target(loaded, {"PATH": "/usr/bin"}))}
    assert (rows["widgets home"].status, rows["widgets home"].fix) == ("error", "export WIDGETS_HOME=/opt/widgets")
    rows = {f.check: f for f in doctor.check_engines(doctor.Target(loaded, {"WIDGETS_HOME": "/opt/w"}))}
    assert (rows["widgets home"].status, rows["widgets home"].detail) == ("ok", "/opt/w")
    assert "java" not in rows  # Spark's own check runs only where Spark is used


def test_a_cron_run_carries_what_the_engines_declare(widgets):
    carried = schedule.run_environment("/venv/bin/python", {"PATH": "/usr/bin", "WIDGETS_HOME": "/opt/w",
                                                            "JAVA_HOME": "/jdk", "SECRET": "x"})
    assert carried["WIDGETS_HOME"] == "/opt/w" and carried["JAVA_HOME"] == "/jdk"  # widgets' and Spark's
    assert "SECRET" not in carried


def test_the_gpu_choice_asks_the_engine_for_its_plug_in_and_hands_it_over(widgets, project, tmp_path):
    licence, found = widgets
    loaded = widgets_pipeline(project)
    [choice] = gpu.plan(loaded, ["make"], GPU_MACHINE).choices.values()
    assert not choice.use and choice.reason == "auto: the widgets GPU licence was not found (no WIDGETS_LICENCE set)"
    with pytest.raises(UnavailableError, match="gpu: true but the widgets GPU licence was not found") as raised:
        gpu.plan(widgets_pipeline(project, "true"), ["make"], GPU_MACHINE)
    assert raised.value.hint == "ask your vendor for widgets.lic"
    licence.write_text("ok")
    found["path"] = licence
    planned = gpu.plan(loaded, ["make"], GPU_MACHINE)
    assert planned.choices["make"].use and planned.engine("widgets") == gpu.EngineGpu(GPU_MACHINE.devices, licence)
    assert dict(gpu.report(GPU_MACHINE, loaded))["widgets licence"] == str(licence)


def test_polars_gpu_stages_find_the_package_polars_declares():
    with_it = gpu.Probe(GPU_MACHINE.devices, None, {"cudf_polars": True})
    assert gpu.missing("polars", with_it, None, is_attached=False) is None
    assert gpu.missing("polars", GPU_MACHINE, None, is_attached=False)[0] == \
        "the RAPIDS package cudf_polars is not installed"
