"""Drawing a run: live stage lines on a terminal, plain lines in logs and cron, a summary table."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..errors import counted
from ..results import Listener, RunResult, StageResult
from . import calendartext, checkstable

RUN_STYLES = {"success": "green", "failed": "bold red", "interrupted": "yellow", "killed": "bold red",
              "running": "cyan"}
STYLES = {"waiting": "dim", "running": "cyan", "done": "green", "failed": "bold red", "skipped": "yellow",
          "not run": "dim"}


def _elapsed(stage: StageResult) -> str:
    if stage.duration is not None:
        return f"{stage.duration:.1f}s"
    if stage.started_at is not None:
        return f"{time.monotonic() - stage.started_at:.1f}s"
    return ""


def _stage_line(stage: StageResult) -> Text:
    detail = stage.error or stage.reason or ""
    line = Text.assemble((f"{stage.status:<8}", STYLES.get(stage.status, "")), " ",
                         (f"{stage.name:<24}", "bold"), f" {stage.backend:<7} {_elapsed(stage):>7}")
    if stage.status == "running" and stage.progress:  # what its engine is doing, in place of why it runs
        line.append(f"  {stage.progress}", style="cyan")
    elif detail:
        line.append(f"  {detail}", style="red" if stage.status == "failed" else "dim")
    return line


class LiveListener(Listener):
    """One line per stage, redrawn in place (a terminal)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.stages: list[StageResult] = []
        self.engines: list[str] = []
        self.live: Live | None = None

    def _render(self) -> Group:
        return Group(*(Text(e, style="dim") for e in self.engines), *(_stage_line(s) for s in self.stages))

    def run_started(self, run_id: str, stages: list[StageResult]) -> None:
        self.stages = stages
        self.console.print(f"run [bold]{run_id}[/]")
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, get_renderable=self._render,
                         transient=False)
        self.live.start()

    def engine_started(self, backend: str, seconds: float) -> None:
        self.engines.append(f"engine {backend} started in {seconds:.1f}s")

    def stage_changed(self, stage: StageResult) -> None:
        if self.live:
            self.live.refresh()

    def close(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None


PLAIN_PROGRESS_SECONDS = 10.0


class PlainListener(Listener):
    """A line per change, for logs and cron mail where a live display would be noise; and for a stage
    that runs long, a line with what its engine is doing every `progress_every` seconds (none for a
    stage that ends sooner, none while the engine has nothing new to say)."""

    def __init__(self, console: Console, progress_every: float = PLAIN_PROGRESS_SECONDS) -> None:
        self.console = console
        self.progress_every = progress_every
        self._ticker: ProgressTicker | None = None

    def run_started(self, run_id: str, stages: list[StageResult]) -> None:
        self.console.print(f"run {run_id}: {counted(len(stages), 'stage')}", markup=False)
        self.close()  # a listener used for a second run: one ticker
        self._ticker = ProgressTicker(stages, self.progress_every, self._progress_line)

    def _progress_line(self, stage: StageResult, phrase: str) -> None:
        self.console.print(f"progress {stage.name} {_elapsed(stage)}: {phrase}", markup=False,
                           highlight=False, soft_wrap=True)

    def engine_started(self, backend: str, seconds: float) -> None:
        self.console.print(f"engine {backend} started in {seconds:.1f}s", markup=False)

    def stage_changed(self, stage: StageResult) -> None:
        self.console.print(_stage_line(stage), highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None


class ProgressTicker:
    """A thread that hands `say` each running stage with a progress phrase, at most once per `every`
    seconds per stage, the first time once it has run that long, and only when the phrase changed."""

    def __init__(self, stages: list[StageResult], every: float, say) -> None:
        self.stages, self.every, self.say = stages, every, say
        self._said: dict[str, tuple[float, str]] = {}  # stage -> (when, phrase) of its last line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="hybridflow-progress-lines")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            for stage in list(self.stages):
                self._maybe_say(stage, time.monotonic())

    def _maybe_say(self, stage: StageResult, now: float) -> None:
        phrase = stage.progress
        if stage.status != "running" or not phrase or stage.started_at is None:
            return
        last, said = self._said.get(stage.name, (stage.started_at, None))
        if now - last >= self.every and phrase != said:
            self._said[stage.name] = (now, phrase)
            self.say(stage, phrase)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def listener_for(console: Console) -> LiveListener | PlainListener:
    return LiveListener(console) if console.is_terminal else PlainListener(console)


def size_text(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _engine_cell(backend: str, gpu: bool | None) -> str:
    """The backend, and for a stage that asked for the GPU (true or auto) which device it ran on."""
    return backend if gpu is None else f"{backend} ({'GPU' if gpu else 'CPU'})"


def summary_line(result: RunResult) -> Text:
    style = {"success": "bold green", "failed": "bold red"}.get(result.status, "bold yellow")
    return Text.assemble(f"{result.pipeline} run {result.run_id}: ", (result.status, style),
                         f" in {result.duration:.1f}s")


def summary_table(result: RunResult) -> Table:
    table = Table()
    for column in ("stage", "backend", "status", "duration", "rows", "bytes", "why"):
        table.add_column(column, justify="right" if column in ("duration", "rows", "bytes") else "left",
                         overflow="fold")
    for stage in result.stages.values():
        why = "" if stage.status == "failed" else stage.reason or ""
        table.add_row(stage.name, _engine_cell(stage.backend, stage.gpu),
                      Text(stage.status, style=STYLES.get(stage.status, "")),
                      f"{stage.duration:.1f}s" if stage.duration is not None else "",
                      f"{stage.rows_out:,}" if stage.rows_out is not None else "", size_text(stage.bytes_out),
                      Text(why, style="dim"))
    return table


PLAN_STYLES = {"run": "cyan", "incremental": "cyan", "skip": "green"}


def plan_table(pipeline, decisions: dict) -> Table:
    """What `run` would do now, stage by stage, and why."""
    table = Table(title=f"{pipeline.name}: plan", title_justify="left")
    for column in ("#", "stage", "backend", "will", "why"):
        table.add_column(column, justify="right" if column == "#" else "left", overflow="fold")
    for number, (stage, decision) in enumerate(decisions.items(), 1):
        will = {"skip": "skip", "run": "run", "incremental": "run (incremental)"}[decision.action]
        table.add_row(str(number), stage, pipeline.stages[stage].backend,
                      Text(will, style=PLAN_STYLES[decision.action]), decision.reason)
    return table


def seconds_text(seconds: float) -> str:
    """51.9s, 3m 12s, 2h 05m: a duration as people read one."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    return f"{minutes // 60}h {minutes % 60:02d}m"


def run_duration(run: dict, now: datetime | None = None) -> str:
    """A recorded run's wall time; a run still going shows the time so far with '…'; '' when unknown
    (a run whose process died has only the time its death was noticed, which says nothing)."""
    started = datetime.fromisoformat(run["started_at"])
    if run["ended_at"] and run["status"] != "killed":
        return seconds_text(max(0.0, (datetime.fromisoformat(run["ended_at"]) - started).total_seconds()))
    if run["status"] == "running":
        return seconds_text(max(0.0, ((now or datetime.now(timezone.utc)) - started).total_seconds())) + "…"
    return ""


def backfill_lines(plan) -> list[str]:
    """A backfill's dry run (ops/backfill.DryRun) in lines: its partitions with their rows, its stages."""
    backfill = plan.backfill
    found = [f"backfill of {backfill.partitions.shown()} (reprocess {backfill.reprocess}): "
             f"{len(backfill.chunks)} chunk(s)"]
    for dataset, rows in plan.partitions.items():
        found.append(f"{dataset}: {len(rows)} partition(s)")
        found += [f"  {key}  {'?' if n is None else f'{n:,}'} rows" for key, n in rows.items()]
    found.append(f"processed again by: {', '.join(plan.stages)}")
    if plan.downstream:
        found.append(f"then, as their inputs change: {', '.join(plan.downstream)}")
    found += [f"chunk {c.number}: {', '.join(c.values)}" for c in backfill.chunks if len(backfill.chunks) > 1]
    return found


def runs_table(runs: list[dict]) -> Table:
    table = Table()
    for column in ("run", "pipeline", "trigger", "started", "duration", "status", "error", "for"):
        table.add_column(column, no_wrap=column in ("run", "started", "duration"), overflow="fold",
                         justify="right" if column == "duration" else "left")
    for run in runs:
        error = "; ".join(filter(None, [(run["error"] or "")[:80], *calendartext.lines(run)[1:]]))
        table.add_row(run["run_id"], run["pipeline"], run["trigger"], run["started_at"][:19].replace("T", " "),
                      run_duration(run), Text(run["status"], style=RUN_STYLES.get(run["status"], "")), Text(error),
                      calendartext.for_cell(run))
    return table


def step_seconds(spans: list[dict]) -> dict[str, dict[str, float]]:
    """Per stage, the seconds its attempts spent reading inputs, in the function, publishing, and the
    rest of the attempt ("overhead": engine and device choice, counting, records), from its timeline.
    Spark, Dask and Ray compute lazily, while their output is written: that time is in "publish"."""
    steps: dict[str, dict[str, float]] = {}
    attempts: dict[str, list[tuple[float, float]]] = {}
    # an engine started early is waited for inside the stage's attempt: engine time, not overhead
    starts = [(s["started_at"], s["ended_at"]) for s in spans if s["kind"] == "engine start" and s["ended_at"]]
    for span in spans:
        if span["stage"] is None or span["ended_at"] is None:
            continue
        kind = {"read inputs": "read", "function": "call", "publish": "publish", "attempt": "attempt"}.get(span["kind"])
        if kind:
            totals = steps.setdefault(span["stage"], {"read": 0.0, "call": 0.0, "publish": 0.0, "attempt": 0.0})
            totals[kind] += span["ended_at"] - span["started_at"]
            if kind == "attempt":
                attempts.setdefault(span["stage"], []).append((span["started_at"], span["ended_at"]))
    for stage, totals in steps.items():
        waited = sum(max(0.0, min(end, e) - max(start, s)) for start, end in attempts.get(stage, []) for s, e in starts)
        totals["overhead"] = max(0.0, totals["attempt"] - totals["read"] - totals["call"] - totals["publish"] - waited)
    return steps


def _milliseconds(value: float | None) -> str:
    return "" if value is None else f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def _files_note(files: list[dict] | None) -> str:
    """' (3 files, median 41.2 MB)': how a version is laid out on disk (many small files read slowly)."""
    sizes = sorted(f["size"] for f in files or [] if f["path"].endswith(".parquet"))
    if not sizes:
        return ""
    return f" ({counted(len(sizes), 'file')}, median {size_text(sizes[len(sizes) // 2])})"


def engine_work_text(stage: dict, compact: bool = False) -> str:
    """The engine work a recorded stage ran (Spark jobs, Dask graphs, Ray executions) while reading,
    calling its function and publishing: "0 · 1 · 4", or "read 0 · call 1 · publish 4"; "" where not
    counted."""
    import json

    counts = json.loads(stage.get("engine_work") or "null")
    if not counts:
        return ""
    phases = [(phase, counts[phase]) for phase in ("read", "call", "publish") if phase in counts]
    return " · ".join(str(n) if compact else f"{phase} {n}" for phase, n in phases)


def run_details(run: dict, stages: list[dict], spans: list[dict] = ()) -> list:
    """The header, the stage table and the lineage of one recorded run; `spans`: its timeline, for
    where each stage's time went."""
    import json
    from pathlib import Path

    header = Text.assemble((f"run {run['run_id']}", "bold"), f"  {run['pipeline']}  trigger {run['trigger']}  ",
                           (run["status"], RUN_STYLES.get(run["status"], "")),
                           f"  {run['started_at']} -> {run['ended_at'] or '…'}",
                           f" ({duration})" if (duration := run_duration(run)) else "")
    parts: list = [header]
    parts += [Text(line) for line in calendartext.lines(run)]
    if run["error"]:
        parts.append(Text(f"error: {run['error']}", style="red"))
    table = Table()
    steps = step_seconds(list(spans))
    timed = ("read", "call", "publish", "overhead")
    for column in ("stage", "backend", "status", "tries", "duration", "engine wait", *timed, "engine work",
                   "rows in", "rows out", "bytes out", "note"):
        table.add_column(column, justify="right" if column in ("duration", "engine wait", *timed, "engine work",
                                                                "rows in", "rows out", "bytes out") else "left",
                         overflow="fold")
    lineage = [Text("published (dataset version <- input versions it read):", style="bold")]
    home = Path(run["run_dir"]).parent.parent if run["run_dir"] else None
    for stage in stages:
        seconds = lambda v: f"{v:.1f}s" if v is not None else ""  # noqa: E731
        count = lambda v: f"{v:,}" if v is not None else ""  # noqa: E731
        gpu = None if stage.get("gpu") is None else bool(stage["gpu"])
        table.add_row(stage["stage"], _engine_cell(stage["backend"], gpu),
                      Text(stage["status"], style=STYLES.get(stage["status"], "")), count(stage.get("attempts")),
                      seconds(stage["duration"]), seconds(stage["engine_start"]),
                      *(_milliseconds(steps.get(stage["stage"], {}).get(step)) for step in timed),
                      engine_work_text(stage, compact=True), count(stage["rows_in"]),
                      count(stage["rows_out"]), size_text(stage["bytes_out"]),
                      Text(stage["error"] or stage["skip_reason"] or ""))
        for dataset, version in json.loads(stage["outputs"] or "{}").items():
            manifest = home / "datasets" / dataset / "versions" / version / "_manifest.json" if home else None
            facts = json.loads(manifest.read_text()) if manifest and manifest.exists() else {}
            read = ", ".join(f"{k}@{v}" for k, v in facts.get("inputs", {}).items()) or "no inputs"
            lineage.append(Text(f"  {dataset}@{version}{_files_note(facts.get('files'))} <- {read}",
                                no_wrap=True, overflow="ignore"))
    parts.append(table)
    if clusters := _cluster_table(stages, spans):
        parts.append(clusters)
    if checks := checkstable.rich_table(stages):
        parts.append(checks)
    if len(lineage) > 1:
        parts += lineage
    return parts


def _cluster_table(stages: list[dict], spans) -> Table | None:
    """The clusters brought up for the run and what each cost; None when it brought none up."""
    from .clusterusage import COLUMNS, cluster_usage

    usage = cluster_usage(spans, stages)
    if not usage:
        return None
    table = Table(title="clusters brought up for the run", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("cluster", "ended") else "right")
    seconds = lambda v: f"{v:.1f}s" if v is not None else ""  # noqa: E731
    for item in usage:
        table.add_row(item.engine, "" if item.nodes is None else str(item.nodes), seconds(item.up),
                      seconds(item.busy), seconds(item.idle), seconds(item.down),
                      "" if item.node_seconds is None else f"{item.node_seconds:,.0f}",
                      Text(item.outcome, style="" if item.outcome == "ok" else "red"))
    return table
