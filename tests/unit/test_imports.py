"""The CLI must stay fast: no engine is imported by --help, validate or a python-only run."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyspark", "ray", "dask", "distributed", "cudf", "duckdb", "polars")

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


def test_python_only_run_imports_no_engine(tmp_path):
    out = tmp_path / "copy"
    import shutil

    for part in ("configs", "stages", "data"):
        shutil.copytree(ROOT / part, out / part)
    code = PROBE.format(commands=[["run", str(out / "configs/quickstart.yaml")]], heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
