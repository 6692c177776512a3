"""The report's two pictures, as Plotly figures drawn in the reader's browser: the run's Gantt
timeline (a row per engine and per stage) and the pipeline's graph, both coloured by backend and
status. Plotly's own JavaScript, from the installed `plotly` package, is inlined into the page once,
so the report opens offline. Plotly is imported here only, when a report is written."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from ..engines import BUILT_IN
from ..errors import UnavailableError
from .timeline import ATTEMPT, CALL, CLUSTER_DOWN, CLUSTER_UP, ENGINE_START, ENGINE_STOP, PUBLISH, READ, RETRY_WAIT

# (strong, light) per backend: the built-in engines in registry order, then any other by its name
BACKEND_COLOURS = [("#4e79a7", "#d4e1ee"), ("#f28e2b", "#fde0c5"), ("#b07aa1", "#ecdcea"), ("#59a14f", "#d7ebd3"),
                   ("#9c755f", "#e9ddd5"), ("#76b7b2", "#d9ecea")]
STEP_COLOURS = {READ: "#76b7b2", CALL: "#edc948", PUBLISH: "#8c6d31", RETRY_WAIT: "#bab0ac"}
STATUS_COLOURS = {"done": "#2e7d32", "success": "#2e7d32", "failed": "#d62728", "killed": "#d62728",
                  "skipped": "#757575", "not run": "#9e9e9e", "running": "#e65100", "interrupted": "#e65100"}
FAILED_OUTLINE = "#d62728"
FAILED_ATTEMPT, FAILED_STEP = "failed attempt", "failed step"  # legend entries: outlined red
SKIPPED_FILL = "#eeeeee"
FONT = "system-ui, -apple-system, Segoe UI, sans-serif"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


def backend_colour(backend: str, light: bool = False) -> str:
    index = BUILT_IN.index(backend) if backend in BUILT_IN else len(BUILT_IN) + sum(map(ord, backend))
    return BACKEND_COLOURS[index % len(BACKEND_COLOURS)][light]


def status_colour(status: str) -> str:
    return STATUS_COLOURS.get(status, "#424242")


def plotly_script() -> str:
    """Plotly's JavaScript bundle, as shipped inside the installed Python package: read from its
    package_data folder, found without importing plotly (about 20 ms at the end of every run),
    else through plotly's own get_plotlyjs."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("plotly")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        bundle = Path(folder) / "package_data" / "plotly.min.js"
        if bundle.is_file():
            return bundle.read_text(encoding="utf-8")
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise UnavailableError("the report's charts need the plotly package, which is not installed",
                               hint="pip install plotly (or reinstall hybridflow)") from exc
    return get_plotlyjs()


def figure_html(element_id: str, figure: dict[str, Any]) -> str:
    """A div and the call that draws `figure` into it; the figure's JSON is made safe inside <script>."""
    spec = json.dumps(figure).replace("</", "<\\/")
    return (f'<div id="{element_id}" class="chart"></div>\n<script>{{ const figure = {spec};\n'
            f'Plotly.newPlot("{element_id}", figure.data, figure.layout, {json.dumps(PLOTLY_CONFIG)}); }}</script>')


def _seconds(value: float) -> str:
    return f"{value:.2f}s" if value < 60 else f"{int(value // 60)}m{value % 60:04.1f}s"


def _row_label(name: str, backend: str | None, status: str | None) -> str:
    if status is None:
        return f"<b>{escape(name)}</b>"
    return (f"<b>{escape(name)}</b> <span style='color:{backend_colour(backend or '')}'>{escape(backend or '')}"
            f"</span> <span style='color:{status_colour(status)}'>● {escape(status)}</span>")


class _Bars:
    """The timeline's bar traces, one per legend entry, in seconds since `start`."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end, self.traces = start, end, {}

    def add(self, trace: str, row: str, begin: float, finish: float, tip: str, colour: str, failed: bool = False,
            **style) -> dict[str, Any]:
        """A bar on `row`; a failed attempt or step goes to a trace of failures, outlined red, in its own
        colour (a trace has one width and one outline). Returns its trace."""
        name = (FAILED_ATTEMPT if trace.endswith(" stage") else FAILED_STEP) if failed else trace
        t = self.traces.setdefault(name, {
            "type": "bar", "orientation": "h", "name": name, "y": [], "x": [], "base": [], "hovertext": [],
            "hovertemplate": "%{hovertext}<extra></extra>",
            "marker": {"color": [], "line": {"color": FAILED_OUTLINE, "width": 2 * failed}, **style.pop("marker", {})},
            **style})
        t["y"].append(row)
        t["base"].append(begin - self.start)
        t["x"].append(max(finish - begin, (self.end - self.start) / 400))  # the shortest step still shows
        t["hovertext"].append(tip)
        t["marker"]["color"].append(colour)
        return t

    def span(self, span: dict[str, Any], backend_of: dict[str, str]) -> None:
        """An engine's start or stop on its engine's row; a stage's attempt or step on the stage's."""
        finish = span["ended_at"] or span["started_at"]
        tip = (f"<b>{escape(span['stage'] or 'engine ' + (span['detail'] or ''))}</b><br>{escape(span['kind'])}"
               f"{' ' + escape(span['detail']) if span['detail'] and span['stage'] else ''}"
               f"{', attempt ' + str(span['attempt']) if span['attempt'] else ''}<br>"
               f"{_seconds(finish - span['started_at'])}, from {span['started_at'] - self.start:.2f}s: "
               f"{span['outcome']}")
        failed, kind, stage = span["outcome"] != "ok", span["kind"], span["stage"]
        if kind in (ENGINE_START, ENGINE_STOP, CLUSTER_UP, CLUSTER_DOWN):
            backend = span["detail"] or ""
            row = "cluster" if kind in (CLUSTER_UP, CLUSTER_DOWN) else "engine"
            self.add(kind, f"{row} {backend}", span["started_at"], finish, tip,
                     backend_colour(backend, light=kind in (ENGINE_STOP, CLUSTER_DOWN)), failed, width=0.6)
        elif kind == ATTEMPT and stage in backend_of:
            self.add(f"{backend_of[stage]} stage", stage, span["started_at"], finish, tip,
                     backend_colour(backend_of[stage], light=True), failed, width=0.8)
        elif kind in STEP_COLOURS and stage in backend_of:
            pattern = {"pattern": {"shape": "."}} if kind == RETRY_WAIT and not failed else {}
            self.add(kind, stage, span["started_at"], finish, tip, STEP_COLOURS[kind], failed, width=0.4,
                     marker=pattern)

    def not_attempted(self, stage: dict[str, Any]) -> None:
        """A skipped or not-run stage: a hatched bar across the run that says why."""
        reason = stage.get("skip_reason") or "no reason recorded"
        trace = self.add(stage["status"], stage["stage"], self.start, self.end,
                         f"<b>{escape(stage['stage'])}</b><br>{escape(stage['status'])}: {escape(reason)}",
                         SKIPPED_FILL, width=0.6, text=[], textposition="inside", insidetextanchor="start",
                         constraintext="none", textfont={"color": "#424242", "size": 12},
                         marker={"pattern": {"shape": "/", "fgcolor": "#cccccc"}})
        trace["text"].append(escape(reason))


def gantt(started: float, ended: float, stages: list[dict[str, Any]], spans: list[dict[str, Any]]) -> dict[str, Any]:
    """The timeline: one row per engine and per stage, seconds since the run started on x. A stage's
    attempts are wide bars in its backend's colour (outlined red when it failed); its steps (input
    read, function, publish, retry wait) narrow bars over them; a skipped or not-run stage a hatched
    bar with the reason. Everything has a tooltip."""
    start = min([s["started_at"] for s in spans] + [started])
    end = max([s["ended_at"] or s["started_at"] for s in spans] + [ended, start + 1e-3])
    clusters = list(dict.fromkeys(s["detail"] for s in spans if s["kind"] in (CLUSTER_UP, CLUSTER_DOWN)))
    engines = list(dict.fromkeys(s["detail"] for s in spans if s["kind"] in (ENGINE_START, ENGINE_STOP)))
    rows = [(f"cluster {c}", _row_label(f"cluster {c}", None, None)) for c in clusters]
    rows += [(f"engine {e}", _row_label(f"engine {e}", None, None)) for e in engines]
    rows += [(s["stage"], _row_label(s["stage"], s["backend"], s["status"])) for s in stages]
    backend_of = {s["stage"]: s["backend"] for s in stages}
    bars = _Bars(start, end)
    for span in spans:
        bars.span(span, backend_of)
    for stage in stages:
        if stage["status"] in ("skipped", "not run"):
            bars.not_attempted(stage)
    order = [f"{b} stage" for b in dict.fromkeys(backend_of.values())] + \
        [FAILED_ATTEMPT, CLUSTER_UP, CLUSTER_DOWN, ENGINE_START, ENGINE_STOP] + \
        list(STEP_COLOURS) + [FAILED_STEP, "skipped", "not run"]
    layout = {
        "barmode": "overlay", "height": 150 + 34 * max(len(rows), 1), "bargap": 0.2,
        "margin": {"l": 10, "r": 20, "t": 84, "b": 40}, "font": {"family": FONT, "size": 12},
        "plot_bgcolor": "white", "hoverlabel": {"align": "left"}, "showlegend": True,
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0, "traceorder": "normal"},
        "xaxis": {"title": {"text": "seconds since the run started"}, "range": [0, (end - start) * 1.01],
                  "gridcolor": "#eeeeee", "zeroline": False},
        "yaxis": {"autorange": "reversed", "type": "category", "automargin": True,
                  "categoryorder": "array", "categoryarray": [r for r, _ in rows],
                  "tickvals": [r for r, _ in rows], "ticktext": [label for _, label in rows], "ticksuffix": "  "},
    }
    return {"data": [bars.traces[name] for name in order if name in bars.traces], "layout": layout}


STAGE_BOX, DATASET_BOX = (150, 44), (130, 28)  # pixels: width, height
# pixels from one layer of the graph to the next, and between neighbours in a layer: left to right
# where the layers fit the page's width, else top to bottom
ACROSS, ALONG = {"lr": 230, "tb": 190}, {"lr": 70, "tb": 96}
PAGE_WIDTH = 1300


def pipeline_graph(stages: list[dict[str, Any]], reads: list[tuple[str, str]], writes: list[tuple[str, str]],
                   datasets: dict[str, str]) -> dict[str, Any]:
    """The graph: stages as boxes filled with their backend's colour and outlined in their status's;
    a dataset passed from stage to stage labels its arrow, and one read from outside or read by no
    stage is a box of its own (`datasets`: name -> what to say of it, on hover). `reads`: (dataset,
    stage) pairs; `writes`: (stage, dataset) pairs. An arrow that skips layers bends around the boxes
    between (through points of its own in each layer)."""
    by_name = {s["stage"]: s for s in stages}
    labels = _arrows(reads, writes)
    boxed = dict.fromkeys(node for edge in labels for node in edge if node[0] == "dataset")
    others = dict.fromkeys(node for edge in labels for node in edge if node[0] == "stage" and node[1] not in by_name)
    nodes = [("stage", s) for s in by_name] + list(others) + list(boxed)  # others: stages this run did not select
    layer_row, routes = _layered(nodes, list(labels))
    layers = max((layer for layer, _ in layer_row.values()), default=0) + 1
    rows = max((row for _, row in layer_row.values()), default=0) + 1
    way = "lr" if layers * ACROSS["lr"] <= PAGE_WIDTH else "tb"
    at = {node: ((layer, row) if way == "lr" else (row, layer)) for node, (layer, row) in layer_row.items()}
    px = (ACROSS[way], ALONG[way]) if way == "lr" else (ALONG[way] * 2, ACROSS[way] / 2)  # per unit of x, of y
    columns, lines = (layers, rows) if way == "lr" else (rows, layers)
    width, height = max(int(px[0] * columns), 400), int(px[1] * lines) + 40
    annotations = [_box(node, at[node], by_name, datasets) for node in nodes]
    lanes: dict[str, list] = {"x": [], "y": []}
    labelled: set[tuple] = set()
    for (source, target), names in labels.items():
        points = [_edge_point(source, at[source], way, px, leaving=True),
                  *(at[via] for via in routes[(source, target)]),
                  _edge_point(target, at[target], way, px, leaving=False)]
        for axis, index in (("x", 0), ("y", 1)):
            lanes[axis] += [p[index] for p in points[:-1]] + [None]
        annotations.insert(0, {"x": points[-1][0], "y": points[-1][1], "ax": points[-2][0], "ay": points[-2][1],
                               "xref": "x", "yref": "y", "axref": "x", "ayref": "y", "text": "", "showarrow": True,
                               "arrowhead": 2, "arrowsize": 1, "arrowwidth": 1.3, "arrowcolor": "#616161"})
        shown = [n for n in names if n and (source, n) not in labelled]  # a dataset named once per producer
        labelled.update((source, n) for n in shown)
        if shown:
            annotations.append({"x": (points[0][0] + points[1][0]) / 2, "y": (points[0][1] + points[1][1]) / 2,
                                "text": f"<i>{escape(', '.join(shown))}</i>", "showarrow": False,
                                "font": {"size": 11, "color": "#455a64"}, "bgcolor": "rgba(255,255,255,0.9)",
                                "hovertext": "<br>".join(escape(datasets.get(n, n)) for n in shown)})
    invisible = {"visible": False, "fixedrange": True}
    layout = {"width": width, "height": height, "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
              "font": {"family": FONT, "size": 12}, "plot_bgcolor": "white", "annotations": annotations,
              "xaxis": {**invisible, "range": [-0.5, columns - 0.5]},
              "yaxis": {**invisible, "range": [lines - 0.5, -0.5]}, "showlegend": False}
    # the arrows' bends (under the boxes), and one invisible point per box: Plotly draws the axes they sit on
    xs, ys = zip(*at.values()) if at else ((), ())
    data = [{"type": "scatter", "mode": "lines", "x": lanes["x"], "y": lanes["y"], "hoverinfo": "skip",
             "line": {"color": "#616161", "width": 1.3}},
            {"type": "scatter", "mode": "markers", "x": list(xs), "y": list(ys), "hoverinfo": "skip",
             "marker": {"opacity": 0}}]
    return {"data": data, "layout": layout}


def _arrows(reads: list[tuple[str, str]], writes: list[tuple[str, str]]) -> dict[tuple, list[str]]:
    """(from, to) node pairs, each with the datasets it carries ('' for an arrow from or to a dataset's
    own box). A node is ("stage", name) or ("dataset", name): a stage and a dataset may share a name."""
    producer = {d: s for s, d in writes}
    read = {d for d, _ in reads}
    labels: dict[tuple, list[str]] = {}
    for dataset, stage in reads:
        source = ("stage", producer[dataset]) if dataset in producer else ("dataset", dataset)
        labels.setdefault((source, ("stage", stage)), []).append(dataset if dataset in producer else "")
    for stage, dataset in writes:
        if dataset not in read:
            labels.setdefault((("stage", stage), ("dataset", dataset)), []).append("")
    return labels


def _box(node: tuple, at: tuple[float, float], by_name: dict[str, dict[str, Any]], datasets: dict[str, str]) -> dict:
    """A node's box: a stage in its backend's colour outlined in its status's, a stage this run did
    not select in grey, a dataset in white."""
    kind, name = node
    stage = by_name.get(name) if kind == "stage" else None
    if stage is not None:
        text = f"<b>{escape(name)}</b><br>{escape(stage['backend'])} · {escape(stage['status'])}"
        tip = stage.get("error") or stage.get("skip_reason") or stage["status"]
        box = {"bgcolor": backend_colour(stage["backend"], light=True), "bordercolor": status_colour(stage["status"]),
               "borderwidth": 3 if stage["status"] in ("failed", "killed") else 2}
    elif kind == "stage":
        text, tip = f"<b>{escape(name)}</b><br>not in this run", "not selected by this run"
        box = {"bgcolor": "#f5f5f5", "bordercolor": "#bdbdbd", "borderwidth": 1}
    else:
        text, tip = f"<i>{escape(name)}</i>", datasets.get(name) or "dataset"
        box = {"bgcolor": "white", "bordercolor": "#9e9e9e", "borderwidth": 1}
    size = STAGE_BOX if kind == "stage" else DATASET_BOX
    return {"x": at[0], "y": at[1], "text": text, "hovertext": escape(tip), "showarrow": False, "borderpad": 2,
            "font": {"size": 12, "color": "#9e9e9e" if kind == "stage" and stage is None else "#212121"},
            "width": size[0], "height": size[1], **box}


def _edge_point(node: tuple, at: tuple[float, float], way: str, px: tuple[float, float],
                leaving: bool) -> tuple[float, float]:
    """Where an arrow leaves or reaches a node's box: its right or left side (left to right), its
    bottom or top (top to bottom); a few pixels off, so an arrowhead is not hidden by the border."""
    width, height = STAGE_BOX if node[0] == "stage" else DATASET_BOX
    sign = 1 if leaving else -1
    if way == "lr":
        return at[0] + sign * (width / 2 + (4 if leaving else 6)) / px[0], at[1]
    return at[0], at[1] + sign * (height / 2 + (4 if leaving else 6)) / px[1]


def _layered(nodes: list, edges: list[tuple]) -> tuple[dict[Any, tuple[int, int]], dict[tuple, list]]:
    """(layer, row) of each node, and for each edge the points it passes through in the layers it
    skips (Sugiyama's dummy nodes: placed like nodes, so an arrow never crosses a box). The layer is
    the longest path from a source; the rows in a layer follow the mean row of each node's
    predecessors (fewer crossings), in the given order otherwise."""
    before: dict[Any, list] = {n: [] for n in nodes}
    for source, target in edges:
        before[target].append(source)
    layer: dict[Any, int] = {}

    def depth(node, seen: frozenset = frozenset()) -> int:
        if node not in layer:
            parents = [p for p in before[node] if p not in seen]  # a cycle (never valid) cannot recurse forever
            layer[node] = 1 + max((depth(p, seen | {node}) for p in parents), default=-1)
        return layer[node]

    for node in nodes:
        depth(node)
    placed, routes = list(nodes), {}
    for source, target in edges:
        previous, routes[(source, target)] = source, []
        for hop in range(layer[source] + 1, layer[target]):
            via = ("via", source, target, hop)
            layer[via], before[via] = hop, [previous]
            placed.append(via)
            routes[(source, target)].append(via)
            previous = via
        before[target] = [previous if p == source else p for p in before[target]]
    position: dict[Any, tuple[int, int]] = {}
    for index in range(max(layer.values(), default=-1) + 1):
        members = [n for n in placed if layer[n] == index]
        members.sort(key=lambda n: sum(position[p][1] for p in before[n]) / len(before[n]) if before[n] else 0)
        for row, node in enumerate(members):
            position[node] = (index, row)
    return position, routes
