"""One run as a self-contained HTML file: its Gantt timeline and its pipeline graph (Plotly figures,
see reportcharts.py), each stage with where it ran, why it ran or was skipped, its rows, bytes,
files and error, each published dataset with its schema and lineage, a comparison with the previous
successful run, and the tail of every log. No script, style sheet or font comes from elsewhere: it
opens from cron's output folder, a mail or a CI artifact."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from ..backends.stagelog import private_file
from ..errors import HybridflowError, counted
from . import calendartext, checkstable, reportcharts
from .progress import engine_work_text, seconds_text, size_text, step_seconds

LOG_TAIL = 20  # lines of each stage's log shown in the report
REPORT_FILE = "report.html"  # in each run's directory


def render(run: dict[str, Any], stages: list[dict[str, Any]], spans: list[dict[str, Any]],
           previous: tuple[dict[str, Any], list[dict[str, Any]]] | None = None,
           edges: tuple[list[tuple[str, str]], list[tuple[str, str]]] | None = None, catalog=None,
           chunks: list[dict[str, Any]] = ()) -> str:
    """The report's HTML for a run record, its stage records and its spans (RunStore); `previous`:
    the last successful run before it and its stages, to compare with; `edges`: the pipeline's graph
    (pipeline_edges; by default, what the run's manifests say); `catalog`: where its versions are
    (by default the local workdir the run's directory is in); `chunks`: of the backfill it belongs to
    (calendartext.backfill_chunks)."""
    title = f"{run['pipeline']} · run {run['run_id']}"
    published = _published(run, stages, catalog)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{escape(title)}</title>",
        f"<style>{STYLE}</style>", f"<script>{reportcharts.plotly_script()}</script>", "</head><body>",
        f"<header><h1>{escape(title)}</h1>{_summary(run, stages)}{_chunks(chunks)}</header>",
        "<noscript><p class='error'>The timeline and the graph need JavaScript; the tables below do not.</p>"
        "</noscript>",
        "<h2>Timeline</h2>", _timeline(run, stages, spans),
        "<h2>Pipeline</h2>", _graph(stages, published, edges),
        "<h2>Stages</h2>", _table(stages, spans, published), _clusters(stages, spans),
        checkstable.html_table(stages, previous[1] if previous else None),
        "<h2>Published datasets</h2>", _datasets(published),
        "<h2>Compared with the previous successful run</h2>", _comparison(stages, previous),
        "<h2>Logs</h2>", _logs(stages),
        "</body></html>", ""])


def _chunks(chunks: list[dict[str, Any]]) -> str:
    """A backfill's chunks, a row each: the partitions it processes, its run and how it ended."""
    if not chunks:
        return ""
    rows = "".join(f"<tr><td>{c['chunk']}</td><td>{escape(', '.join(c['values']))}</td>"
                   f"<td><code>{escape(c['run_id'] or '')}</code></td><td>{escape(c['status'])}</td></tr>"
                   for c in chunks)
    return f"<table><tr><th>chunk</th><th>partitions</th><th>run</th><th>status</th></tr>{rows}</table>"


def _published(run: dict[str, Any], stages: list[dict[str, Any]], catalog=None) -> list[dict[str, Any]]:
    """Each dataset version the run published, with its manifest ({} if gc removed it since)."""
    from ..store.catalog import Catalog

    catalog = catalog or Catalog(Path(run["run_dir"]).parent.parent)
    found = []
    for stage in stages:
        for dataset, version_id in json.loads(stage.get("outputs") or "{}").items():
            try:
                manifest = catalog.version(dataset, version_id).manifest
            except Exception:  # removed by gc since: the run still says what it published  # noqa: BLE001
                manifest = {}
            found.append({"dataset": dataset, "version": version_id, "stage": stage["stage"], "manifest": manifest})
    return found


def _timeline(run: dict[str, Any], stages: list[dict[str, Any]], spans: list[dict[str, Any]]) -> str:
    started = _epoch(run["started_at"])
    figure = reportcharts.gantt(started, _epoch(run["ended_at"]) if run.get("ended_at") else started, stages, spans)
    return reportcharts.figure_html("timeline", figure)


def _graph(stages: list[dict[str, Any]], published: list[dict[str, Any]], edges) -> str:
    if edges is None:  # no pipeline file to read: what the manifests say each stage read and wrote
        edges = ([(dataset, item["stage"]) for item in published for dataset in item["manifest"].get("inputs") or {}],
                 [(item["stage"], item["dataset"]) for item in published])
    reads, writes = (list(dict.fromkeys(pairs)) for pairs in edges)
    versions = {item["dataset"]: item for item in published}
    datasets: dict[str, str] = {}
    for name in [d for d, _ in reads] + [d for _, d in writes]:
        item = versions.get(name)
        datasets[name] = (f"{name}: version {item['version']}, {_count(item['manifest'].get('rows'))} rows"
                          if item else f"{name}: not published by this run")
    return reportcharts.figure_html("graph", reportcharts.pipeline_graph(stages, reads, writes, datasets))


def _summary(run: dict[str, Any], stages: list[dict[str, Any]]) -> str:
    status = run["status"]
    counts: dict[str, int] = {}
    for stage in stages:
        counts[stage["status"]] = counts.get(stage["status"], 0) + 1
    duration = ""
    if run.get("ended_at"):
        duration = _seconds(_epoch(run["ended_at"]) - _epoch(run["started_at"]))
    facts = [f'<span class="badge" style="background:{reportcharts.status_colour(status)}">{escape(status)}</span>',
             f"trigger <b>{escape(run['trigger'])}</b>", f"started <b>{escape(run['started_at'])}</b>",
             f"took <b>{escape(duration or 'unfinished')}</b>",
             ", ".join(f"{n} {escape(s)}" for s, n in counts.items()) or "no stage"]
    error = f'<p class="error">{escape(run["error"])}</p>' if run.get("error") else ""
    where = f"<p class='muted'>pipeline file <code>{escape(run.get('pipeline_file') or '')}</code></p>"
    calendar = "".join(f"<p>{escape(line)}</p>" for line in calendartext.lines(run))
    return f"<p class='facts'>{' · '.join(facts)}</p>{calendar}{error}{where}"


STAGE_COLUMNS = ("stage", "backend", "device", "status", "duration", "attempts", "time went to", "rows in",
                 "bytes in", "rows out", "bytes out", "files written", "why it ran / was skipped")
NUMBERS = {"duration", "attempts", "rows in", "bytes in", "rows out", "bytes out", "files written"}


def _table(stages: list[dict[str, Any]], spans: list[dict[str, Any]], published: list[dict[str, Any]]) -> str:
    steps = step_seconds(spans)
    files: dict[str, int] = {}
    for item in published:
        files[item["stage"]] = files.get(item["stage"], 0) + len(item["manifest"].get("files") or [])
    body = []
    for s in stages:
        colour = reportcharts.status_colour(s["status"])
        went = steps.get(s["stage"])
        went_text = " · ".join(f"{k} {_seconds(went[k])}" for k in ("read", "call", "publish", "overhead")
                               if went and went[k] >= 0.005) if went else ""
        if work := engine_work_text(s):
            went_text += f"; engine work {work}"
        cells = [f"<b>{escape(s['stage'])}</b>",
                 f'<span class="dot" style="background:{reportcharts.backend_colour(s["backend"])}"></span>'
                 f"{escape(s['backend'])}", _device(s),
                 f'<span style="color:{colour};font-weight:600">{escape(s["status"])}</span>',
                 _seconds(s.get("duration")), str(s.get("attempts") or ""), escape(went_text),
                 _count(s.get("rows_in")), size_text(s.get("bytes_in")), _count(s.get("rows_out")),
                 size_text(s.get("bytes_out")), str(files.get(s["stage"], "")), escape(s.get("skip_reason") or "")]
        body.append("<tr>" + "".join(f"<td class='num'>{c}</td>" if STAGE_COLUMNS[i] in NUMBERS else f"<td>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
        if s.get("error"):
            body.append(f'<tr class="error-row"><td></td><td colspan="{len(STAGE_COLUMNS) - 1}">'
                        f"<b>error</b> {escape(s['error'])}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in STAGE_COLUMNS)
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _clusters(stages: list[dict[str, Any]], spans: list[dict[str, Any]]) -> str:
    """The clusters brought up for the run, and what each cost (nothing when the run brought none up)."""
    from .clusterusage import COLUMNS, cluster_usage

    usage = cluster_usage(spans, stages)
    if not usage:
        return ""
    rows = []
    for item in usage:
        cells = [f'<span class="dot" style="background:{reportcharts.backend_colour(item.engine)}"></span>'
                 f"{escape(item.engine)}", _count(item.nodes), _seconds(item.up), _seconds(item.busy),
                 _seconds(item.idle), _seconds(item.down),
                 "" if item.node_seconds is None else f"{item.node_seconds:,.0f}", escape(item.outcome)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" if i in (0, len(cells) - 1) else f"<td class='num'>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in COLUMNS)
    return (f"<h2>Clusters brought up for the run</h2><div class='scroll'><table><tr>{head}</tr>{''.join(rows)}"
            "</table></div><p class='muted'>busy: a stage of the engine was running on it; node-seconds: its "
            "hosts times its life from bring up to take down, what a cloud bill counts</p>")


def _device(stage: dict[str, Any]) -> str:
    if stage["status"] in ("skipped", "not run"):
        return ""
    device = "GPU" if stage.get("gpu") else "CPU"
    reason = stage.get("gpu_reason")
    return f"{device}<br><span class='muted'>{escape(reason)}</span>" if reason else device


def _datasets(published: list[dict[str, Any]]) -> str:
    """Each output this run published: version, rows, files, bytes, schema and lineage (manifests)."""
    if not published:
        return "<p>This run published nothing.</p>"
    rows = []
    for item in published:
        manifest = item["manifest"]
        schema = _schema(manifest.get("schema") or {})
        lineage = "<br>".join(f"<code>{escape(k)}@{escape(str(v))}</code>"
                              for k, v in (manifest.get("inputs") or {}).items()) or "<span class='muted'>none</span>"
        files = manifest.get("files") or []
        cells = [f"<b>{escape(item['dataset'])}</b>", f"<code>{escape(item['version'])}</code>", escape(item["stage"]),
                 _count(manifest.get("rows")), str(len(files)), size_text(sum(f.get("size", 0) for f in files)),
                 schema, lineage]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("dataset", "version", "stage", "rows", "files", "bytes", "schema",
                                              "made from (input versions)"))
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(rows)}</table></div>"


SCHEMA_SHOWN = 6  # columns listed before the rest fold away


def _schema(columns: dict[str, Any]) -> str:
    lines = [f"<code>{escape(k)}: {escape(str(v))}</code>" for k, v in columns.items()]
    if len(lines) <= SCHEMA_SHOWN + 1:
        return "<br>".join(lines)
    return ("<br>".join(lines[:SCHEMA_SHOWN]) + f"<details><summary>{len(lines) - SCHEMA_SHOWN} more columns"
            f"</summary>{'<br>'.join(lines[SCHEMA_SHOWN:])}</details>")


def _comparison(stages: list[dict[str, Any]], previous) -> str:
    if previous is None:
        return "<p>No earlier successful run of this pipeline.</p>"
    before_run, before = previous
    old = {s["stage"]: s for s in before}
    rows = []
    for stage in stages:
        was = old.get(stage["stage"], {})
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in (
            f"<b>{escape(stage['stage'])}</b>", _seconds(was.get("duration")), _seconds(stage.get("duration")),
            _change(was.get("duration"), stage.get("duration")), _count(was.get("rows_out")),
            _count(stage.get("rows_out")), _change(was.get("rows_out"), stage.get("rows_out")))) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("stage", "duration then", "duration now", "change", "rows out then",
                                              "rows out now", "change"))
    return (f"<p>run <code>{escape(before_run['run_id'])}</code>, started {escape(before_run['started_at'])}</p>"
            f"<table><tr>{head}</tr>{''.join(rows)}</table>")


def _change(then, now) -> str:
    if then is None or now is None or then == now:
        return ""
    if not then:
        return "new"
    return f"{(now - then) / then:+.0%}"


def _logs(stages: list[dict[str, Any]]) -> str:
    parts = []
    for stage in stages:
        path = Path(stage["log_path"]) if stage.get("log_path") else None
        if path is None or not path.is_file():
            continue
        tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        opened = " open" if stage["status"] in ("failed", "killed") else ""
        parts.append(f"<details{opened}><summary><b>{escape(stage['stage'])}</b> "
                     f"<span class='muted'>{escape(str(path))}, last {counted(len(tail), 'line')}</span></summary>"
                     f"<pre>{escape(chr(10).join(tail))}</pre></details>")
    return "".join(parts) or "<p>No stage ran, so no stage wrote a log.</p>"


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _seconds(value) -> str:
    if value is None:
        return ""
    return f"{value:.2f}s" if value < 60 else seconds_text(value)


def _count(value) -> str:
    return "" if value is None else f"{value:,}"


def pipeline_edges(pipeline) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """A loaded pipeline's graph as the report draws it: (dataset, stage) per input read, and
    (stage, dataset) per output written."""
    reads = [(dataset, name) for name, spec in pipeline.stages.items() for dataset in spec.inputs]
    return reads, [(name, dataset) for name, spec in pipeline.stages.items() for dataset in spec.outputs]


def _edges_from_file(run: dict[str, Any]):
    """The graph of the pipeline file the run recorded, if it still loads (it may have moved, or
    need a --param); None otherwise."""
    from ..definition.config import load_pipeline

    try:
        return pipeline_edges(load_pipeline(run["pipeline_file"])) if run.get("pipeline_file") else None
    except (HybridflowError, OSError) as exc:
        logging.getLogger("hybridflow").debug("report: the graph comes from the run's manifests: %s", exc)
        return None


def write(store, run: dict[str, Any], out: Path | None = None, pipeline=None, catalog=None) -> Path:
    """Write the report of `run` (a record of `store`, a RunStore) and return its path: by default
    report.html in the run's directory. Owner-only (0600), like the logs it quotes. `pipeline`: the
    loaded pipeline, for its graph (else its recorded file is loaded). `catalog`: where the run
    published (a workdir in object storage: its workspace's; None: the run's local workdir)."""
    previous = next((r for r in store.runs(run["pipeline"], limit=50)
                     if r["status"] == "success" and r["started_at"] < run["started_at"]), None)
    edges = pipeline_edges(pipeline) if pipeline is not None else _edges_from_file(run)
    html = render(run, store.stages(run["run_id"]), store.spans(run["run_id"]),
                  (previous, store.stages(previous["run_id"])) if previous else None, edges, catalog,
                  calendartext.backfill_chunks(store.runs(run["pipeline"], limit=500), run))
    path = out or Path(run["run_dir"]) / REPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # whose: workdir.remove_leftovers
    try:
        private_file(partial).write_text(html, encoding="utf-8")  # owner-only before a byte is in it
        partial.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):  # some MB of it: a full disk must not stay full
            partial.unlink()
        raise
    return path


STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; padding: 20px 28px;
       max-width: 1400px; color: #212121; background: #fafafa; }
header { border-bottom: 1px solid #e0e0e0; margin-bottom: 8px; }
h1 { font-size: 22px; margin: 4px 0 6px; } h2 { font-size: 16px; margin: 26px 0 8px; color: #37474f; }
.facts { font-size: 14px; } .muted { color: #757575; font-size: 12px; }
.badge { color: white; padding: 2px 10px; border-radius: 10px; font-weight: 600; }
.dot { display: inline-block; width: 10px; height: 10px; border-radius: 50%; margin-right: 5px; }
.chart { background: white; border: 1px solid #e0e0e0; border-radius: 6px; overflow-x: auto; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; background: white; }
td, th { border: 1px solid #e0e0e0; padding: 5px 9px; text-align: left; vertical-align: top; }
th { background: #eceff1; font-weight: 600; }
td.num { text-align: right; white-space: nowrap; }
.error { color: #c62828; } .error-row td { color: #c62828; background: #fff5f5; border-top: none; }
details { background: white; border: 1px solid #e0e0e0; border-radius: 6px; margin: 6px 0; padding: 4px 10px; }
td details { border: none; margin: 0; padding: 0; } td summary { color: #546e7a; font-size: 12px; }
summary { cursor: pointer; padding: 4px 0; }
pre { background: #f5f5f5; padding: 8px; font-size: 12px; overflow-x: auto; white-space: pre-wrap; }
code { font-size: 12px; }
"""
