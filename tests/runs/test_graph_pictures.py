"""`hybridflow graph --format svg|png -o FILE` draws the graph with Graphviz; without its dot program
the error names what to install and exits 69; Mermaid and DOT text stay as they were."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "configs" / "quickstart.yaml"


def graph(tmp_path: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "graph", str(PIPELINE), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz; "
                    ".ci/run does)")
def test_the_graph_is_drawn_as_svg_and_png(tmp_path):
    drawn = graph(tmp_path, "--format", "svg", "-o", "graph.svg")
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.strip() == "graph.svg"
    svg = ET.parse(tmp_path / "graph.svg").getroot()
    texts = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"report", "(python)", "activity_report"} <= texts  # a stage, its backend, a dataset
    fills = {p.get("fill") for p in svg.iter("{http://www.w3.org/2000/svg}path")}
    assert "#d4e1ee" in fills  # python stages filled with python's colour, as in the run report
    assert graph(tmp_path, "--format", "png", "-o", "graph.png").returncode == 0
    assert (tmp_path / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_graphviz_the_error_says_what_to_install(tmp_path):
    missing = graph(tmp_path, "--format", "svg", "-o", "graph.svg", path=str(tmp_path))  # no dot on PATH
    assert missing.returncode == 69
    assert "needs Graphviz's dot program, which is not installed (apt-get install graphviz" in missing.stderr
    assert not (tmp_path / "graph.svg").exists()
    nowhere = graph(tmp_path, "--format", "png")
    assert nowhere.returncode == 78 and "--out FILE" in nowhere.stderr
    assert graph(tmp_path, "--format", "dot").stdout.startswith('digraph "quickstart" {\n    rankdir=LR;\n    st_')
    assert graph(tmp_path).stdout.startswith("flowchart LR\n")
