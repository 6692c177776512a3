"""One run as a self-contained HTML file: a Gantt timeline of its engines and stages (every attempt's
input read, function, publish and retry waits, coloured by step and outlined by outcome), then a
table of its stages with why each ran or was skipped, its rows, bytes, error and log. No script, no
style sheet, no font from elsewhere: it opens from cron's output folder, a mail or a CI artifact."""

from __future__ import annotations

import json
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from .stagelog import private_file
from .timeline import ATTEMPT, CALL, ENGINE_START, ENGINE_STOP, PUBLISH, READ, RETRY_WAIT

COLOURS = {ENGINE_START: "#8e7cc3", ENGINE_STOP: "#b4a7d6", READ: "#6fa8dc", CALL: "#f6b26b",
           PUBLISH: "#93c47d", RETRY_WAIT: "#cccccc", ATTEMPT: "#eeeeee"}
STATUS_COLOURS = {"done": "#38761d", "failed": "#cc0000", "skipped": "#666666", "not run": "#999999",
                  "running": "#b45f06", "killed": "#cc0000", "success": "#38761d", "interrupted": "#b45f06"}
WIDTH, LABEL, ROW = 1100, 190, 26  # pixels: the chart, the row labels, one row


LOG_TAIL = 20  # lines of each stage's log shown in the report


def render(run: dict[str, Any], stages: list[dict[str, Any]], spans: list[dict[str, Any]],
           previous: tuple[dict[str, Any], list[dict[str, Any]]] | None = None) -> str:
    """The report's HTML for a run record, its stage records and its spans (RunStore); `previous`:
    the last successful run before it and its stages, to compare with."""
    title = f"{run['pipeline']} run {run['run_id']}"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{escape(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _summary(run, stages),
        "<h2>Timeline</h2>", _gantt(run, stages, spans),
        "<h2>Stages</h2>", _table(stages),
        "<h2>Published datasets</h2>", _datasets(run, stages),
        "<h2>Compared with the previous successful run</h2>", _comparison(stages, previous),
        "<h2>Logs</h2>", _logs(stages),
        "</body></html>", ""])


def _datasets(run: dict[str, Any], stages: list[dict[str, Any]]) -> str:
    """Each output this run published: version, rows, files, bytes, schema and lineage (manifests)."""
    from .catalog import Catalog

    catalog = Catalog(Path(run["run_dir"]).parent.parent)
    rows = []
    for stage in stages:
        for dataset, version_id in json.loads(stage.get("outputs") or "{}").items():
            try:
                manifest = catalog.version(dataset, version_id).manifest
            except Exception:  # removed by gc since: the run still says what it published  # noqa: BLE001
                manifest = {}
            schema = ", ".join(f"{k}: {v}" for k, v in (manifest.get("schema") or {}).items())
            lineage = ", ".join(f"{k}@{v}" for k, v in (manifest.get("inputs") or {}).items())
            files = manifest.get("files") or []
            rows.append("<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in (
                dataset, version_id, stage["stage"], _count(manifest.get("rows")), len(files),
                _count(sum(f.get("bytes", 0) for f in files)), schema, lineage)) + "</tr>")
    if not rows:
        return "<p>This run published nothing.</p>"
    head = "".join(f"<th>{h}</th>" for h in ("dataset", "version", "stage", "rows", "files", "bytes", "schema",
                                              "made from"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _comparison(stages: list[dict[str, Any]], previous) -> str:
    if previous is None:
        return "<p>No earlier successful run of this pipeline.</p>"
    before_run, before = previous
    old = {s["stage"]: s for s in before}
    rows = []
    for stage in stages:
        was = old.get(stage["stage"], {})
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in (
            escape(stage["stage"]), _seconds(was.get("duration")), _seconds(stage.get("duration")),
            _count(was.get("rows_out")), _count(stage.get("rows_out")))) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("stage", "duration then", "duration now", "rows out then",
                                              "rows out now"))
    return (f"<p>run {escape(before_run['run_id'])}, started {escape(before_run['started_at'])}</p>"
            f"<table><tr>{head}</tr>{''.join(rows)}</table>")


def _logs(stages: list[dict[str, Any]]) -> str:
    parts = []
    for stage in stages:
        path = Path(stage["log_path"]) if stage.get("log_path") else None
        if path is None or not path.is_file():
            continue
        tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        parts.append(f"<h3>{escape(stage['stage'])}</h3><pre>{escape(chr(10).join(tail))}</pre>")
    return "".join(parts) or "<p>No stage ran, so no stage wrote a log.</p>"


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _seconds(value) -> str:
    return "" if value is None else f"{value:.2f}s"


def _summary(run: dict[str, Any], stages: list[dict[str, Any]]) -> str:
    status = run["status"]
    counts = {}
    for stage in stages:
        counts[stage["status"]] = counts.get(stage["status"], 0) + 1
    parts = ", ".join(f"{n} {escape(s)}" for s, n in counts.items())
    error = f'<p class="error">{escape(run["error"])}</p>' if run.get("error") else ""
    ended = escape(run.get("ended_at") or "-")
    return (f'<p><b style="color:{STATUS_COLOURS.get(status, "#000")}">{escape(status)}</b> · '
            f'{escape(run["trigger"])} · started {escape(run["started_at"])} · ended {ended} · {parts}</p>{error}')


def _gantt(run: dict[str, Any], stages: list[dict[str, Any]], spans: list[dict[str, Any]]) -> str:
    """Rows: each engine, then each stage (a skipped one says so on its row); bars: the spans."""
    bounds = [_epoch(run["started_at"]), _epoch(run.get("ended_at") or run["started_at"])]
    start = min([s["started_at"] for s in spans] + bounds)
    end = max([s["ended_at"] or s["started_at"] for s in spans] + bounds)
    scale = (WIDTH - LABEL - 20) / max(end - start, 1e-3)
    engines = sorted({s["detail"] for s in spans if s["kind"] in (ENGINE_START, ENGINE_STOP)})
    rows = [f"engine {e}" for e in engines] + [s["stage"] for s in stages]
    height = ROW * (len(rows) + 2)
    out = [f'<svg width="{WIDTH}" height="{height}" role="img" aria-label="timeline">']
    for index, row in enumerate(rows):
        y = ROW * index
        out.append(f'<text x="4" y="{y + 17}" class="label">{escape(row)}</text>')
        out.append(f'<line x1="{LABEL}" x2="{WIDTH}" y1="{y + ROW}" y2="{y + ROW}" class="grid"/>')
    status = {s["stage"]: s for s in stages}
    for span in spans:
        row = f"engine {span['detail']}" if span["kind"] in (ENGINE_START, ENGINE_STOP) else span["stage"]
        if row not in rows:
            continue
        y = ROW * rows.index(row)
        x = LABEL + (span["started_at"] - start) * scale
        w = max(((span["ended_at"] or span["started_at"]) - span["started_at"]) * scale, 1.5)
        inset = 3 if span["kind"] == ATTEMPT else 7
        stroke = "#cc0000" if span["outcome"] != "ok" else "none"
        seconds = (span["ended_at"] or span["started_at"]) - span["started_at"]
        tip = f"{span['kind']}{' ' + span['detail'] if span['detail'] else ''}: {seconds:.2f}s ({span['outcome']})"
        if span.get("attempt"):
            tip += f", attempt {span['attempt']}"
        out.append(f'<rect x="{x:.1f}" y="{y + inset}" width="{w:.1f}" height="{ROW - 2 * inset}" '
                   f'fill="{COLOURS.get(span["kind"], "#999")}" stroke="{stroke}"><title>{escape(tip)}</title></rect>')
    for name, stage in status.items():  # skipped and not-run stages: say so on their row
        if stage["status"] in ("skipped", "not run") and name in rows:
            y = ROW * rows.index(name)
            out.append(f'<text x="{LABEL + 4}" y="{y + 17}" class="note">{escape(stage["status"])}: '
                       f'{escape(stage.get("skip_reason") or "")}</text>')
    y = ROW * (len(rows) + 1)
    for index, (kind, colour) in enumerate(COLOURS.items()):
        x = LABEL + index * 125
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{x + 16}" y="{y + 11}" class="note">{escape(kind)}</text>')
    out.append(f'<text x="{WIDTH - 4}" y="{y + 11}" class="note" text-anchor="end">{end - start:.1f}s</text>')
    out.append("</svg>")
    return "\n".join(out)


def _table(stages: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("stage", "backend", "status", "duration", "rows in", "rows out",
                                              "bytes out", "attempts", "why / error", "log"))
    body = []
    for s in stages:
        why = s.get("error") or s.get("skip_reason") or ""
        duration = "" if s.get("duration") is None else f"{s['duration']:.2f}s"
        body.append("<tr>" + "".join([
            f"<td>{escape(s['stage'])}</td>", f"<td>{escape(s['backend'])}</td>",
            f'<td style="color:{STATUS_COLOURS.get(s["status"], "#000")}">{escape(s["status"])}</td>',
            f"<td>{duration}</td>", f"<td>{_count(s.get('rows_in'))}</td>", f"<td>{_count(s.get('rows_out'))}</td>",
            f"<td>{_count(s.get('bytes_out'))}</td>", f"<td>{s.get('attempts') or ''}</td>",
            f"<td>{escape(why)}</td>", f"<td><code>{escape(s.get('log_path') or '')}</code></td>"]) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _count(value) -> str:
    return "" if value is None else f"{value:,}"


def write(store, run: dict[str, Any], out: Path | None = None) -> Path:
    """Write the report of `run` (a record of `store`, a RunStore) and return its path: by default
    report.html in the run's directory. Owner-only (0600), like the logs it quotes."""
    previous = next((r for r in store.runs(run["pipeline"], limit=50)
                     if r["status"] == "success" and r["started_at"] < run["started_at"]), None)
    html = render(run, store.stages(run["run_id"]), store.spans(run["run_id"]),
                  (previous, store.stages(previous["run_id"])) if previous else None)
    path = out or Path(run["run_dir"]) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    private_file(partial).write_text(html, encoding="utf-8")  # owner-only before a byte is in it
    partial.replace(path)
    return path


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.error { color: #cc0000; }
pre { background: #f8f8f8; padding: 8px; font-size: 12px; overflow-x: auto; }
svg .label { font-size: 12px; } svg .note { font-size: 11px; fill: #555; } svg .grid { stroke: #eee; }
"""
