"""GPU selection without a GPU: detection through a fake nvidia-smi, auto falling back to the CPU,
gpu: true failing before any stage starts, and the engine settings each backend would use.
The tests at the end run stages on cuDF and are skipped where no GPU and cudf are present."""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.backends import gpu
from hybridflow.backends.dask import gpu_cluster_options
from hybridflow.backends.ray import RayBackend, gpu_init_options, gpus_per_trial
from hybridflow.backends.spark.rapids import gpu_operators, spark_gpu_conf
from hybridflow.definition.config import load_pipeline
from hybridflow.engines.dask import DaskSettings
from hybridflow.engines.ray import RaySettings
from hybridflow.engines.spark import SparkSettings, host
from hybridflow.errors import ConfigError, ExitCode, UnavailableError
from hybridflow.execution.runner import Runner
from hybridflow.installing import install_extras
from hybridflow.store.state import RunStore

H100 = "0, GPU-0a1b2c3d-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3, 81559, 550.54.15"
A10 = "1, GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA A10, 23028, 550.54.15"
BANNER = "| NVIDIA-SMI 550.54.15      Driver Version: 550.54.15      CUDA Version: 12.4     |"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
QUERY = " ".join(gpu.QUERY)


def fake_smi(directory: Path, lines: list[str], fail: bool = False) -> Path:
    """An nvidia-smi that answers our exact query with `lines`, and its banner otherwise."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    answer = f'echo "{NO_DRIVER}"; exit 9' if fail else "cat <<'EOF'\n" + "\n".join(lines) + "\nEOF"
    script.write_text(f'#!/bin/sh\nif [ "$*" = "{QUERY}" ]; then\n{answer}\nelse\necho "{BANNER}"\nfi\n')
    script.chmod(0o755)
    return directory


@pytest.fixture
def smi_path(tmp_path, monkeypatch):
    """Put a fake nvidia-smi first on PATH (a real one later on PATH stays hidden)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def use(lines: list[str], fail: bool = False) -> None:
        bin_dir = fake_smi(tmp_path / "bin", lines, fail)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")

    return use


@pytest.fixture
def no_driver(tmp_path, monkeypatch):
    """No nvidia-smi anywhere on PATH: a machine without the NVIDIA driver."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return {**os.environ, "PATH": str(empty)}


# -- detection ----------------------------------------------------------------------------------

def test_one_gpu_is_parsed_from_nvidia_smi(smi_path):
    smi_path([H100])
    found = gpu.probe()
    assert found.problem is None
    assert found.devices == (gpu.Device(0, "GPU-0a1b2c3d-1111-2222-3333-444455556666", "NVIDIA H100 80GB HBM3",
                                        81559, "550.54.15"),)
    # every RAPIDS package an engine declares (Polars' cudf_polars too), and the memory pool
    assert set(found.packages) == {"cudf", "dask_cudf", "dask_cuda", "cudf_polars", "rmm"}


def test_cuda_visible_devices_filters_and_orders_gpus(smi_path, monkeypatch):
    smi_path([H100, A10])
    assert [d.name for d in gpu.probe().devices] == ["NVIDIA H100 80GB HBM3", "NVIDIA A10"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [d.index for d in gpu.probe().devices] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9f8e,0")  # a UUID prefix, then an index, in that order
    assert [d.index for d in gpu.probe().devices] == [1, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7,1")  # like CUDA: the list ends at an unknown entry
    assert [d.index for d in gpu.probe().devices] == [0]
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        found = gpu.probe()
        assert found.devices == () and found.problem == f"CUDA_VISIBLE_DEVICES={hidden!r} hides all 2 GPUs"


def test_failing_or_missing_nvidia_smi_means_no_gpu(smi_path, no_driver):
    assert gpu.probe().problem == "no NVIDIA driver (nvidia-smi is not on PATH)"
    smi_path([], fail=True)
    found = gpu.probe()
    assert found.devices == () and found.problem == f"nvidia-smi failed: {NO_DRIVER}"


def test_report_lists_gpu_memory_driver_cuda_packages_and_jar(smi_path, tmp_path, monkeypatch):
    smi_path([H100, A10])
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(host.JAR_ENV, raising=False)
    rows = dict(gpu.report())
    assert rows["GPU 0"] == "NVIDIA H100 80GB HBM3, 81,559 MiB" and rows["GPU 1"] == "NVIDIA A10, 23,028 MiB"
    assert rows["NVIDIA driver"] == "550.54.15" and rows["CUDA (driver)"] == "12.4"
    for name in ("cudf", "dask_cudf", "dask_cuda", "rmm"):
        expected = "importable" if importlib.util.find_spec(name) else "not installed"
        assert rows[name].startswith(expected)
    assert rows["Spark RAPIDS jar"].startswith("not found: nothing matches ~/.hybridflow/jars/")


def test_jar_from_settings_env_or_newest_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(host.JAR_ENV, raising=False)
    jars = tmp_path / ".hybridflow" / "jars"
    jars.mkdir(parents=True)
    for version in ("25.2.0", "25.12.0"):
        (jars / f"rapids-4-spark_2.13-{version}.jar").write_bytes(b"")
    assert host.find_rapids_jar(None)[0] == jars / "rapids-4-spark_2.13-25.12.0.jar"  # by version, not by text
    mine = tmp_path / "lib" / "rapids.jar"
    mine.parent.mkdir()
    mine.write_bytes(b"")
    monkeypatch.setenv(host.JAR_ENV, str(mine))
    assert host.find_rapids_jar(None)[0] == mine
    relative = SparkSettings(rapids_jar="lib/rapids.jar")
    assert host.find_rapids_jar(relative, tmp_path)[0] == mine  # relative to the pipeline root
    assert host.find_rapids_jar(SparkSettings(rapids_jar="missing.jar"), tmp_path) == (
        None, f"backends.spark.rapids_jar = {tmp_path}/missing.jar, which does not exist")


def test_parse_bytes():
    assert gpu.parse_bytes("2GB") == 2 * 10**9 and gpu.parse_bytes("512MiB") == 512 * 2**20
    assert gpu.parse_bytes(1000) == 1000
    with pytest.raises(ConfigError, match="'lots' is not a size in bytes"):
        gpu.parse_bytes("lots")


# -- planning -----------------------------------------------------------------------------------

PIPELINE = """
name: gpudemo
backends:
  dask: {gpu: auto}
  spark: {gpu: auto}
stages:
  make:
    run: mypkg.steps:make
    outputs: [numbers]
    gpu: MAKE_MODE
  features:
    backend: dask
    run: mypkg.steps:same
    inputs: [numbers]
    outputs: [features]
  cpu_only:
    backend: dask
    run: mypkg.steps:same
    inputs: [numbers]
    outputs: [other]
    gpu: false
  etl:
    backend: spark
    run: mypkg.steps:same
    inputs: [numbers]
    outputs: [etl]
"""

STAGES = '''
import pandas as pd


def make(ctx):
    ctx.log.info("making")
    return pd.DataFrame({"id": [1, 2, 3]})


def same(numbers):
    return numbers
'''

GPU_MACHINE = gpu.Probe((gpu.Device(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559, "550.54.15"),), None,
                        {"cudf": True, "dask_cudf": True, "dask_cuda": True, "rmm": True})


def pipeline(project, make_mode="auto", text=PIPELINE):
    project.stages(STAGES)
    return load_pipeline(project.pipeline(text.replace("MAKE_MODE", make_mode)))


def test_stage_value_wins_over_the_engine_default(project):
    loaded = pipeline(project)
    modes = {s: gpu.stage_mode(loaded, s) for s in loaded.stages}
    assert modes == {"make": "auto", "features": "auto", "cpu_only": False, "etl": "auto"}


def test_the_python_engine_default_is_a_python_stage_mode_everywhere(project, no_driver):
    from hybridflow.execution.planner import Planner
    from hybridflow.store.workspace import Workspace

    text = PIPELINE.replace("    gpu: MAKE_MODE\n", "").replace("backends:\n", "backends:\n  python: {gpu: AUTO}\n")
    loaded = pipeline(project, text=text)
    assert loaded.spec.backends.python.gpu == "auto"  # the python engine's own settings model
    assert gpu.stage_mode(loaded, "make") == "auto"
    assert Planner(loaded, Workspace.of(loaded)).fingerprint("make").settings["gpu"] == "auto"
    result = Runner(loaded, _selection(["make"])).run()  # no GPU here: auto falls back to the CPU, saying why
    assert result.status == "success" and result.stages["make"].gpu is False
    assert result.stages["make"].gpu_reason == "auto: no NVIDIA driver (nvidia-smi is not on PATH)"
    own = pipeline(project, text=text.replace("outputs: [numbers]\n", "outputs: [numbers]\n    gpu: false\n", 1))
    assert gpu.stage_mode(own, "make") is False  # the stage's own value wins
    project.pipeline(text.replace("{gpu: AUTO}", "{gpu: maybe}"))
    # located at the value itself, as every engine's gpu is (backends.python is a settings model now)
    with pytest.raises(ConfigError, match="backends.python.gpu: must be true, false or auto, not 'maybe'"):
        load_pipeline(project.root / "pipeline.yaml")


def test_auto_uses_the_gpu_only_where_everything_is_there(project, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(host.JAR_ENV, raising=False)
    loaded = pipeline(project)
    choices = gpu.plan(loaded, list(loaded.stages), GPU_MACHINE).choices
    assert choices["make"].use and choices["features"].use
    assert choices["make"].reason == "auto: NVIDIA H100 80GB HBM3, 81559 MiB"
    assert not choices["cpu_only"].use and choices["cpu_only"].reason == "gpu: false"
    assert not choices["etl"].use and choices["etl"].reason.startswith(
        "auto: the RAPIDS Accelerator jar for Spark was not found (nothing matches ~/.hybridflow/jars/")
    no_cudf = gpu.Probe(GPU_MACHINE.devices, None, {"cudf": False})
    choices = gpu.plan(loaded, list(loaded.stages), no_cudf).choices
    assert choices["make"] == gpu.GpuChoice(False, "auto: the RAPIDS package cudf is not installed", "auto")
    assert choices["features"].reason == "auto: the RAPIDS packages cudf, dask_cudf, dask_cuda are not installed"


def test_engine_gets_gpu_resources_only_when_a_stage_on_it_uses_the_gpu(project):
    loaded = pipeline(project)
    planned = gpu.plan(loaded, ["make", "cpu_only"], GPU_MACHINE)
    assert planned.engine("python") == gpu.EngineGpu(GPU_MACHINE.devices)
    assert planned.engine("dask") is None  # cpu_only is its only stage here
    assert gpu.plan(loaded, ["make"], gpu.Probe((), "no NVIDIA driver", {})).engine("python") is None


def test_no_stage_asking_for_a_gpu_never_probes(project, monkeypatch):
    loaded = pipeline(project, "false", PIPELINE.replace("gpu: auto", "gpu: false"))
    monkeypatch.setattr(gpu, "probe", lambda: pytest.fail("probed"))
    assert not any(c.use for c in gpu.plan(loaded, list(loaded.stages)).choices.values())


@pytest.mark.parametrize("found, message, hint", [
    (gpu.Probe((), "no NVIDIA driver (nvidia-smi is not on PATH)", {}),
     "stage 'make' has gpu: true but no NVIDIA driver (nvidia-smi is not on PATH)", "NVIDIA GPU and driver"),
    (gpu.Probe(GPU_MACHINE.devices, None, {"cudf": False}),
     "stage 'make' has gpu: true but the RAPIDS package cudf is not installed", install_extras("gpu")),
])
def test_gpu_true_names_what_is_missing(project, found, message, hint):
    loaded = pipeline(project, "true")
    with pytest.raises(UnavailableError) as raised:
        gpu.plan(loaded, ["make"], found)
    assert raised.value.message == message and hint in raised.value.hint
    assert raised.value.exit_code == ExitCode.UNAVAILABLE


def test_gpu_true_on_spark_without_the_jar(project, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(host.JAR_ENV, raising=False)
    loaded = pipeline(project, text=PIPELINE.replace("spark: {gpu: auto}", "spark: {gpu: true}"))
    with pytest.raises(UnavailableError, match="stage 'etl' has gpu: true but the RAPIDS Accelerator jar for "
                                               "Spark was not found") as raised:
        gpu.plan(loaded, ["etl"], GPU_MACHINE)
    assert "rapids-4-spark_2.13-<version>.jar" in raised.value.hint


def test_attached_cluster_auto_stays_on_cpu_and_true_trusts_the_cluster(project):
    text = PIPELINE.replace("dask: {gpu: auto}", "dask: {gpu: auto, address: 'tcp://10.0.0.5:8786'}")
    loaded = pipeline(project, text=text)
    choice = gpu.plan(loaded, ["features"], gpu.Probe((), "no NVIDIA driver", {"cudf": True, "dask_cudf": True}))
    assert not choice.choices["features"].use and "cannot be probed from here" in choice.choices["features"].reason
    loaded = pipeline(project, text=text.replace("gpu: auto, address", "gpu: true, address"))
    choice = gpu.plan(loaded, ["features"], gpu.Probe((), "no NVIDIA driver", {"cudf": True, "dask_cudf": True}))
    assert choice.choices["features"] == gpu.GpuChoice(True, "gpu: true: the dask cluster", True)


# -- real runs on this machine's CPU ------------------------------------------------------------

def test_auto_runs_on_the_cpu_and_records_why(project, no_driver):
    loaded = pipeline(project, "auto")
    result = Runner(loaded, _selection(["make"])).run()
    assert result.status == "success"
    assert result.stages["make"].gpu is False
    rows = RunStore(project.root / ".hybridflow" / "runs.db").stages(result.run_id)
    assert (rows[0]["gpu"], rows[0]["gpu_reason"]) == (0, "auto: no NVIDIA driver (nvidia-smi is not on PATH)")
    log = Path(rows[0]["log_path"]).read_text()
    assert "device: CPU (auto: no NVIDIA driver (nvidia-smi is not on PATH))" in log and "making" in log


def test_gpu_true_exits_69_before_any_stage_starts(project, no_driver):
    pipeline(project, "true")
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", "--only", "make"],
                          cwd=project.root, env=no_driver, capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.UNAVAILABLE == 69
    assert done.stderr.strip().splitlines() == [
        "error: stage 'make' has gpu: true but no NVIDIA driver (nvidia-smi is not on PATH) (run on a machine "
        "with an NVIDIA GPU and driver, or use gpu: auto to fall back to the CPU)"]
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    (run,) = store.runs("gpudemo")
    assert run["status"] == "failed" and "gpu: true" in run["error"]
    assert store.stages(run["run_id"]) == []  # no stage started
    assert not (Path(run["run_dir"]) / "logs").exists()


def test_summary_table_says_where_a_gpu_stage_ran(project, no_driver):
    from rich.console import Console

    from hybridflow.reporting.progress import summary_table

    result = Runner(pipeline(project, "auto"), _selection(["make"])).run()
    console = Console(width=200, record=True)
    console.print(summary_table(result))
    assert "python (CPU)" in console.export_text()


def test_runs_db_from_before_gpu_columns_gets_them(tmp_path):
    db = tmp_path / "runs.db"
    with sqlite3.connect(db) as old:
        old.execute("CREATE TABLE stages (run_id TEXT NOT NULL, stage TEXT NOT NULL, backend TEXT NOT NULL, "
                    "status TEXT NOT NULL, duration REAL, engine_start REAL, rows_in INTEGER, bytes_in INTEGER, "
                    "rows_out INTEGER, bytes_out INTEGER, skip_reason TEXT, error TEXT, log_path TEXT, "
                    "outputs TEXT, position INTEGER NOT NULL, PRIMARY KEY (run_id, stage))")
    RunStore(db)
    with sqlite3.connect(db) as opened:
        columns = {row[1] for row in opened.execute("PRAGMA table_info(stages)")}
    assert {"gpu", "gpu_reason"} <= columns


def _selection(only):
    from hybridflow.results import RunOptions, Selection

    return RunOptions(Selection(only=only))


# -- the settings each engine gets -------------------------------------------------------------

def test_spark_local_mode_loads_the_plugin_without_asking_for_gpu_resources(tmp_path):
    jar = tmp_path / "rapids-4-spark_2.13-25.12.0.jar"
    conf = spark_gpu_conf(SparkSettings(master="local[4]"), jar)
    assert conf["spark.plugins"] == "com.nvidia.spark.SQLPlugin"
    assert conf["spark.jars"] == conf["spark.driver.extraClassPath"] == str(jar)
    assert conf["spark.rapids.sql.enabled"] == "true" and conf["spark.rapids.sql.explain"] == "NOT_ON_GPU"
    assert conf["spark.rapids.memory.pinnedPool.size"] == "2g"
    assert not any(".resource.gpu." in key for key in conf)  # local mode cannot schedule GPUs: it would hang


def test_spark_cluster_asks_one_gpu_per_executor_shared_by_its_tasks(tmp_path):
    settings = SparkSettings(master="spark://10.0.0.5:7077", conf={"spark.executor.cores": 4})
    conf = spark_gpu_conf(settings, tmp_path / "r.jar")
    assert conf["spark.executor.resource.gpu.amount"] == "1" and conf["spark.task.resource.gpu.amount"] == "0.25"


def test_gpu_operators_are_told_apart_in_a_physical_plan():
    plan = """== Physical Plan ==
GpuColumnarToRow false
+- GpuHashAggregate(keys=[customer_id#1L], functions=[gpucount(1)])
   +- GpuShuffleCoalesce 2147483647
      +- GpuColumnarExchange gpuhashpartitioning(customer_id#1L, 4), ENSURE_REQUIREMENTS
         +- GpuRowToColumnar targetsize(1073741824)
            +- *(1) Project [customer_id#1L, udf(x#2) AS y#5]
               +- GpuColumnarToRow false
                  +- GpuFileGpuScan parquet [customer_id#1L,x#2] Batched: true
"""
    on_gpu, on_cpu = gpu_operators(plan)
    assert on_cpu == ["Project"] and len(on_gpu) == 7 and on_gpu[0] == "GpuColumnarToRow"
    cpu_plan = "== Physical Plan ==\nAdaptiveSparkPlan isFinalPlan=false\n+- HashAggregate(keys=[k#1L])\n" \
               "   +- Project [(id#0L % 3) AS k#1L]\n      +- Range (0, 100, step=1, splits=1)\n"
    assert gpu_operators(cpu_plan) == ([], ["HashAggregate", "Project", "Range"])


def test_dask_local_cuda_cluster_has_one_worker_per_gpu_with_its_rmm_pool():
    devices = (GPU_MACHINE.devices[0], gpu.Device(1, "GPU-1", "NVIDIA A10", 23028, "550.54.15"))
    options = gpu_cluster_options(DaskSettings(rmm_pool_size="8GB", n_workers=5), devices)
    assert options["n_workers"] == 2 and options["rmm_pool_size"] == "8GB"
    assert options["host"] == "127.0.0.1" and options["scheduler_kwargs"] == {"dashboard": False}
    assert options["dashboard_address"] == "127.0.0.1:0"  # its HTTP server on a free loopback port, not 8787


def test_ray_gpus_for_init_and_per_trial():
    assert gpu_init_options(RaySettings(), GPU_MACHINE.devices) == {"num_gpus": 1}
    assert gpu_init_options(RaySettings(num_gpus=4), GPU_MACHINE.devices) == {"num_gpus": 4}
    assert gpus_per_trial(False, {"gpus_per_trial": 0.5}) == 0  # on the CPU a trial asks for none
    assert gpus_per_trial(True, {}) == 1 and gpus_per_trial(True, {"gpus_per_trial": 0.5}) == 0.5
    with pytest.raises(ConfigError, match="gpus_per_trial must be a number above 0"):
        gpus_per_trial(True, {"gpus_per_trial": "half"})
    engine = RayBackend(RaySettings(), Path("."))
    engine.begin_stage(True, {"gpus_per_trial": 0.25}, None)
    assert engine.handles()["gpus_per_trial"] == 0.25  # what the stage sees as ctx.gpus_per_trial


# -- on a GPU -----------------------------------------------------------------------------------

def _usable_gpu() -> bool:
    return importlib.util.find_spec("cudf") is not None and bool(gpu.probe().devices)


ON_GPU = pytest.mark.skipif(not _usable_gpu(), reason="needs an NVIDIA GPU and cudf")

CUDF_STAGES = '''
def make(ctx):
    import cudf

    return cudf.DataFrame({"id": [1, 2, 3], "v": [0.5, 1.5, 2.5]})


def check_python(numbers):
    assert type(numbers).__module__.startswith("cudf"), type(numbers)
    return numbers.assign(v=numbers["v"] * 2)


def check_dask(numbers, ctx):
    assert type(numbers._meta).__module__.startswith("cudf"), type(numbers._meta)
    return numbers.assign(v=numbers["v"] + 1)
'''

CUDF_PIPELINE = """
name: ongpu
backends: {dask: {rmm_pool_size: 1GB}}
stages:
  make: {run: mypkg.steps:make, outputs: [numbers], gpu: true}
  python_stage: {run: mypkg.steps:check_python, inputs: [numbers], outputs: [doubled], gpu: true}
  dask_stage: {backend: dask, run: mypkg.steps:check_dask, inputs: [numbers], outputs: [plus], gpu: true}
"""


@ON_GPU
def test_python_and_dask_stages_run_on_cudf(project):
    project.stages(CUDF_STAGES)
    result = Runner(load_pipeline(project.pipeline(CUDF_PIPELINE))).run()
    assert result.status == "success", [s.error for s in result.stages.values()]
    assert all(stage.gpu for stage in result.stages.values())
    from hybridflow.data.tables import read_arrow
    from hybridflow.store.catalog import Catalog

    catalog = Catalog(project.home("ongpu"))
    assert read_arrow(catalog.current("doubled").source()).column("v").to_pylist() == [1.0, 3.0, 5.0]
    assert sorted(read_arrow(catalog.current("plus").source()).column("v").to_pylist()) == [1.5, 2.5, 3.5]
