"""The pipeline graph as Mermaid or Graphviz DOT text: stages as boxes, datasets between them; and
as an SVG or PNG picture drawn by Graphviz (its Python binding and its `dot` program)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..definition.pipeline import Pipeline
from ..errors import UnavailableError

PICTURES = ("svg", "png")


def _edges(p: Pipeline) -> tuple[list[str], list[tuple[str, str]]]:
    datasets, edges = [], []
    for stage, spec in p.stages.items():
        for ds in spec.inputs:
            edges.append((f"ds_{ds}", f"st_{stage}"))
            datasets.append(ds)
        for ds in spec.outputs:
            edges.append((f"st_{stage}", f"ds_{ds}"))
            datasets.append(ds)
    return list(dict.fromkeys(datasets)), edges


def mermaid(p: Pipeline) -> str:
    datasets, edges = _edges(p)
    lines = ["flowchart LR"]
    for stage, spec in p.stages.items():
        lines.append(f'    st_{stage}["{stage}<br/><i>{spec.backend}</i>"]')
    for ds in datasets:
        shape = ('[/"', '"/]') if p.dataset(ds).kind == "files" else ('[("', '")]')
        lines.append(f"    ds_{ds}{shape[0]}{ds}{shape[1]}")
    lines += [f"    {a} --> {b}" for a, b in edges]
    return "\n".join(lines) + "\n"


def dot(p: Pipeline, fill: Callable[[str], str] | None = None) -> str:
    """DOT text; `fill`: a backend -> colour function, to fill each stage's box with its backend's."""
    datasets, edges = _edges(p)
    lines = [f'digraph "{p.name}" {{', "    rankdir=LR;"]
    if fill is not None:
        lines.append('    node [fontname="Helvetica", fontsize=11]; edge [color="#616161"];')
    for stage, spec in p.stages.items():
        style = "rounded" if fill is None else f'"rounded,filled", fillcolor="{fill(spec.backend)}"'
        lines.append(f'    st_{stage} [shape=box, style={style}, label="{stage}\\n({spec.backend})"];')
    for ds in datasets:
        shape = "folder" if p.dataset(ds).kind == "files" else "cylinder"
        lines.append(f'    ds_{ds} [shape={shape}, label="{ds}"];')
    lines += [f"    {a} -> {b};" for a, b in edges]
    return "\n".join(lines + ["}"]) + "\n"


def picture(p: Pipeline, format: str, out: Path) -> Path:
    """Draw the graph into `out` as `format` (svg or png), each stage filled with its backend's colour."""
    try:
        import graphviz
    except ImportError as exc:
        raise UnavailableError("drawing the graph needs the graphviz Python package, which is not installed",
                               hint="pip install graphviz, and Graphviz's dot program (apt-get install graphviz)") \
            from exc
    from .reportcharts import backend_colour

    try:
        drawn = graphviz.Source(dot(p, fill=lambda backend: backend_colour(backend, light=True))).pipe(format=format)
    except graphviz.ExecutableNotFound as exc:
        raise UnavailableError("drawing the graph needs Graphviz's dot program, which is not installed",
                               hint="apt-get install graphviz, or brew install graphviz on macOS") from exc
    out.write_bytes(drawn)
    return out
