"""The CLI must stay fast: no engine is imported by --help, validate or a python-only run, and neither
--help nor validate imports pyarrow, pandas or numpy (scripts/bench_cli.py times them)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyspark", "ray", "dask", "distributed", "cudf", "duckdb", "polars")
DATA_LIBRARIES = ("pyarrow", "pandas", "numpy")

PROBE = """
import sys
from typer.testing import CliRunner
from hybridflow.cli import app
runner = CliRunner()
for args in {commands!r}:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
print(" ".join(m for m in {heavy!r} if m in sys.modules))
"""


def loaded_after(*commands: list[str], watched: tuple[str, ...] = HEAVY) -> str:
    code = PROBE.format(commands=list(commands), heavy=watched)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_help_validate_graph_import_no_engine():
    assert loaded_after(["--help"], ["validate", "configs"], ["graph", "configs/quickstart.yaml"]) == ""


def test_the_report_and_picture_libraries_load_only_to_draw():
    assert loaded_after(["--help"], ["validate", "configs"], ["graph", "configs/quickstart.yaml"],
                        watched=("plotly", "graphviz")) == ""


def test_help_and_validate_import_no_data_library():
    assert loaded_after(["--help"], ["validate", "configs"], watched=HEAVY + DATA_LIBRARIES) == ""


def weekly_retrain_with_its_inputs(tmp_path: Path) -> Path:
    """configs/weekly_retrain.yaml beside its stage code and its two external Parquet inputs (schemas
    declared), written here whether or not data/retrain was generated."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "data" / "retrain"
    (data / "events" / "delivery_week=2026-01-05").mkdir(parents=True)
    pq.write_table(pa.table({"customer_id": [1], "plan": ["free"]}), data / "customers.parquet")
    pq.write_table(pa.table({"event_id": [1], "customer_id": [1]}), data / "events" / "delivery_week=2026-01-05" /
                   "part-0.parquet")
    return tmp_path / "configs" / "weekly_retrain.yaml"


def test_validate_checks_declared_parquet_inputs_without_pyarrow(tmp_path):
    pipeline = weekly_retrain_with_its_inputs(tmp_path)
    assert loaded_after(["validate", str(pipeline)], watched=HEAVY + DATA_LIBRARIES) == ""
    events = tmp_path / "data" / "retrain" / "events" / "delivery_week=2026-01-05" / "part-0.parquet"
    events.write_bytes(events.read_bytes()[:-5])  # a delivery cut short: still found, still without pyarrow
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "validate", str(pipeline)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: input 'raw_events': " in done.stdout and "part-0.parquet is truncated" in done.stdout
    assert loaded_after(["validate", str(pipeline)], watched=HEAVY + DATA_LIBRARIES) == ""


def test_python_only_run_imports_no_engine(tmp_path):
    out = tmp_path / "copy"

    for part in ("configs", "stages", "data"):
        shutil.copytree(ROOT / part, out / part)
    code = PROBE.format(commands=[["run", str(out / "configs/quickstart.yaml")]], heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_a_rerun_that_skips_every_stage_imports_no_data_library(tmp_path):
    for part in ("configs", "stages", "data"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("retrain", "tpch*"))
    pipeline = str(tmp_path / "configs/quickstart.yaml")
    first = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", pipeline], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    code = PROBE.format(commands=[["run", pipeline]], heavy=HEAVY + DATA_LIBRARIES)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_validate_loads_no_network_client():
    """Spark's s3a jar fetcher (http, ssl, xml) loads when a run reaches object storage, not with Spark's module."""
    assert loaded_after(["validate", "configs"], watched=("hybridflow.engines.spark.s3_jars", "http.client",
                                                          "ssl", "xml.etree.ElementTree")) == ""


def test_help_and_validate_load_every_engines_declaration_and_no_backend_module():
    """Declarations (hybridflow.engines) are what validate needs of an engine; its backend module is
    imported only when a run creates the engine."""
    from hybridflow.engines import BUILT_IN

    backends = tuple(f"hybridflow.backends.{name}" for name in BUILT_IN)
    declarations = tuple(f"hybridflow.engines.{name}" for name in BUILT_IN)
    assert loaded_after(["--help"], ["validate", "configs"], watched=backends) == ""
    assert loaded_after(["validate", "configs"], watched=declarations).split() == list(declarations)


def test_the_registry_lists_the_built_in_engines_in_order_of_its_declarations():
    from hybridflow.engines import BUILT_IN, engines

    assert tuple(engines())[:len(BUILT_IN)] == BUILT_IN
