"""The pipeline graph as Mermaid or Graphviz DOT text: stages as boxes, datasets between them."""

from __future__ import annotations

from .pipeline import Pipeline


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


def dot(p: Pipeline) -> str:
    datasets, edges = _edges(p)
    lines = [f'digraph "{p.name}" {{', "    rankdir=LR;"]
    for stage, spec in p.stages.items():
        lines.append(f'    st_{stage} [shape=box, style=rounded, label="{stage}\\n({spec.backend})"];')
    for ds in datasets:
        shape = "folder" if p.dataset(ds).kind == "files" else "cylinder"
        lines.append(f'    ds_{ds} [shape={shape}, label="{ds}"];')
    lines += [f"    {a} -> {b};" for a, b in edges]
    return "\n".join(lines + ["}"]) + "\n"
