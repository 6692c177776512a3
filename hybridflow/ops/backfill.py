"""Backfills: reprocess chosen partitions of the incremental stages, and what depends on them.

`--partitions "week=2026-01-05..2026-03-30"` (a range) or `"week=a,b,c"` (a list) names values of
one partition column. Every incremental stage whose partitioned input is partitioned by it processes
exactly those of its partitions again (the planner's backfill hook), keeping every other output
partition as it is; stages downstream run as their inputs changed. In chunks (`--chunk N`: N
partitions per run), each chunk is one run that commits on its own, recorded with the backfill's id,
so `--resume` runs only the chunks the last backfill did not finish.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from ..definition.pipeline import Pipeline
from ..errors import DataError, UsageError
from ..results import Listener, RunOptions, RunResult
from ..store.state import json_field
from ..store.workspace import Workspace

REPROCESS = ("missing", "failed", "all")
TRIGGER = "backfill"
HISTORY = 500  # the newest run records read to find the last backfill
_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*$")


@dataclass(frozen=True)
class Partitions:
    """A column and the values asked for: a range (low..high, both included) or a list."""

    column: str
    low: str | None = None
    high: str | None = None
    values: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Partitions:
        match = _SPEC.match(text or "")
        if not match:
            raise UsageError(f"--partitions '{text}' must look like column=low..high or column=a,b,c",
                             hint='e.g. --partitions "delivery_week=2026-01-05..2026-03-30"')
        column, rest = match.groups()
        if ".." in rest:
            low, _, high = (part.strip() for part in rest.partition(".."))
            if not low or not high:
                raise UsageError(f"--partitions '{text}': a range needs both ends (low..high)")
            return cls(column, low, high)
        return cls(column, values=tuple(v.strip() for v in rest.split(",") if v.strip()))

    def __contains__(self, value: str) -> bool:
        if self.values:
            return value in self.values
        return _ordered(self.low) <= _ordered(value) <= _ordered(self.high)

    def holds(self, key: str) -> bool:
        """Whether a partition key ('week=2026-01-05/region=eu') is one of those asked for."""
        value = value_of(key, self.column)
        return value is not None and value in self

    def shown(self) -> str:
        return f"{self.column}={self.low}..{self.high}" if not self.values else f"{self.column}={','.join(self.values)}"


def _ordered(value: str) -> tuple:
    """Integers compare as numbers, everything else (ISO dates too) as text."""
    try:
        return (0, int(value), "")
    except ValueError:
        return (1, 0, value)


def value_of(key: str, column: str) -> str | None:
    """The value of `column` in a partition key ('week=2026-01-05/region=eu')."""
    for part in key.split("/"):
        name, _, value = part.partition("=")
        if name == column:
            return value
    return None


@dataclass(frozen=True)
class Chunk:
    number: int
    values: tuple[str, ...]  # the column's values this chunk processes


@dataclass
class Backfill:
    """One backfill of a pipeline: its id, what it asked for and its chunks."""

    id: str
    partitions: Partitions
    reprocess: str
    chunks: list[Chunk]
    selection: dict[str, list[str]] = field(default_factory=dict)  # --only/--to: the stages each chunk runs

    def notes(self, chunk: Chunk) -> dict[str, Any]:
        return {"backfill": self.id, "partitions": self.partitions.shown(), "reprocess": self.reprocess,
                "selection": self.selection,
                "chunk": chunk.number, "chunks": len(self.chunks), "values": list(chunk.values),
                "plan": [list(c.values) for c in self.chunks]}


def incremental_stages(pipeline: Pipeline, column: str) -> list[tuple[str, str]]:
    """(stage, its partitioned input) of each incremental stage whose input is partitioned by `column`."""
    found = []
    for name, spec in pipeline.stages.items():
        dataset = next((ds for ds in spec.inputs if pipeline.dataset(ds).partition_by), None) \
            if spec.incremental else None
        if dataset is not None and column in pipeline.dataset(dataset).partition_by:
            found.append((name, dataset))
    return found


def plan(pipeline: Pipeline, partitions: Partitions, *, chunk: int, reprocess: str, datums_of,
         failed: set[str] = frozenset()) -> tuple[Backfill, dict[str, list[str]]]:
    """The backfill and, per partitioned input, its partition keys in range. `datums_of(dataset)`:
    {partition key: digest} of a dataset as it is now; `failed`: the values of the last backfill's
    chunks that did not succeed (reprocess failed)."""
    if reprocess not in REPROCESS:
        raise UsageError(f"--reprocess must be one of {', '.join(REPROCESS)}, not '{reprocess}'")
    if chunk < 0:
        raise UsageError("--chunk must be a number of partitions, 1 or more")
    stages = incremental_stages(pipeline, partitions.column)
    if not stages:
        raise UsageError(f"no incremental stage of {pipeline.name} reads an input partitioned by "
                         f"'{partitions.column}'", hint="name a partition_by column of an incremental stage's input")
    keys = {ds: sorted(k for k in datums_of(ds) if partitions.holds(k)) for ds in dict.fromkeys(ds for _, ds in stages)}
    values = sorted({value_of(k, partitions.column) for found in keys.values() for k in found}, key=_ordered)
    if reprocess == "failed":
        values = [v for v in values if v in failed]
    if not values:
        unfinished = " that the last backfill did not finish" if reprocess == "failed" else ""
        raise DataError(f"--partitions {partitions.shown()} names no partition of {', '.join(keys)}{unfinished}",
                        hint="hybridflow backfill --dry-run with a wider range lists the partitions there are")
    size = chunk or len(values)
    chunks = [Chunk(i + 1, tuple(values[start:start + size])) for i, start in enumerate(range(0, len(values), size))]
    return Backfill(f"bf-{secrets.token_hex(4)}", partitions, reprocess, chunks), keys


def chooser(backfill: Backfill, chunk: Chunk) -> Callable[[str, str, dict, dict], set[str] | None]:
    """The planner's hook for one chunk: the partitions of a stage's input to process again."""
    column = backfill.partitions.column

    def choose(stage: str, dataset: str, current: dict, made_from: dict) -> set[str] | None:
        if all(value_of(k, column) is None for k in [*current, *made_from]):
            return None  # not partitioned by the column: decided as any run decides
        keys = {k for k in current if value_of(k, column) in chunk.values}
        return {k for k in keys if k not in made_from} if backfill.reprocess == "missing" else keys

    return choose


def last_backfill(pipeline: Pipeline) -> tuple[Backfill, dict[int, str]] | None:
    """The newest backfill of the pipeline, and its chunks' last statuses by number."""
    store = Workspace.of(pipeline).run_store(newest=HISTORY)
    newest: dict | None = None
    statuses: dict[int, str] = {}
    for run in store.runs(pipeline.name, limit=HISTORY):  # newest first: a chunk's last attempt comes first
        notes = json_field(run, "calendar") if run["trigger"] == TRIGGER else {}
        if not (notes.get("backfill") and isinstance(notes.get("chunk"), int) and isinstance(notes.get("plan"), list)):
            continue
        newest = newest or notes
        if notes["backfill"] == newest["backfill"]:
            statuses.setdefault(int(notes["chunk"]), run["status"])
    if newest is None:
        return None
    chunks = [Chunk(i + 1, tuple(values)) for i, values in enumerate(newest["plan"])]
    return Backfill(newest["backfill"], Partitions.parse(newest["partitions"]), newest["reprocess"], chunks,
                    newest.get("selection") or {}), statuses


def failed_values(pipeline: Pipeline) -> set[str]:
    """The values of the last backfill's chunks that did not succeed (reprocess failed): those that
    failed or were killed, and those a failed chunk kept from running."""
    last = last_backfill(pipeline)
    if last is None:
        return set()
    backfill, statuses = last
    # chunks run in order and stop at the first that fails: one above every recorded chunk never ran
    # (one below them without a record is older than the run records read: it ran)
    ran = max(statuses, default=0)
    return {v for c in backfill.chunks if c.number > ran or statuses.get(c.number, "success") != "success"
            for v in c.values}


def run_chunk(pipeline: Pipeline, backfill: Backfill, chunk: Chunk, listener: Listener, *, wait: bool,
              subscribers=(), exit_when_stuck: bool = False) -> RunResult:
    """One chunk as one run (the pipeline's lock, its own commit and record); exit_when_stuck as for
    hybridflow.run (the CLI's)."""
    from ..execution.runner import new_runner

    pipeline.calendar = backfill.notes(chunk)
    arguments = {"only": [], "from": [], "to": [], **backfill.selection, "params": list(pipeline.param_args),
                 "force": None}
    options = RunOptions(trigger=TRIGGER, wait_for_lock=wait, exit_when_stuck=exit_when_stuck, arguments=arguments)
    runner = new_runner(pipeline, options, listener=listener, subscribers=subscribers)
    runner.session.planner.backfill = chooser(backfill, chunk)
    try:
        return runner.run()
    finally:
        listener.close()


@dataclass
class Outcome:
    """What a backfill did: its chunks' runs (those run now), and the chunks a resume skipped."""

    backfill: Backfill
    results: list[RunResult]
    skipped: list[int]

    @property
    def failed(self) -> RunResult | None:
        return next((r for r in self.results if r.status != "success"), None)


@dataclass
class DryRun:
    """What a backfill would do: per partitioned input, each partition in range and its rows; the
    stages it would process again, and those downstream that may run."""

    backfill: Backfill
    partitions: dict[str, dict[str, int | None]]
    stages: list[str]
    downstream: list[str]


def prepare(pipeline: Pipeline, partitions: str | None, *, chunk: int, reprocess: str, resume: bool,
            selection: dict[str, list[str]]) -> tuple[Backfill, set[int]]:
    """The backfill to run (a new one, or the last one resumed) and its chunks already done."""
    if resume:
        if partitions or any(selection.values()):
            raise UsageError("--resume repeats the last backfill's --partitions, --only and --to; "
                             "do not give them again")
        last = last_backfill(pipeline)
        if last is None:
            raise UsageError(f"{pipeline.name} has no backfill to resume", hint="start one with --partitions")
        backfill, statuses = last
        return backfill, {n for n, status in statuses.items() if status == "success"}
    if not partitions:
        raise UsageError("backfill needs --partitions (or --resume)",
                         hint='e.g. --partitions "delivery_week=2026-01-05..2026-03-30"')
    planner = _planner(pipeline)
    failed = failed_values(pipeline) if reprocess == "failed" else set()
    backfill, _ = plan(pipeline, Partitions.parse(partitions), chunk=chunk, reprocess=reprocess,
                       datums_of=planner.datums, failed=failed)
    backfill.selection = {k: list(v) for k, v in selection.items() if v}
    return backfill, set()


def dry_run(pipeline: Pipeline, partitions: str | None, *, chunk: int, reprocess: str,
            selection: dict[str, list[str]]) -> DryRun:
    planner = _planner(pipeline)
    failed = failed_values(pipeline) if reprocess == "failed" else set()
    asked = Partitions.parse(partitions or "")
    backfill, keys = plan(pipeline, asked, chunk=chunk, reprocess=reprocess, datums_of=planner.datums, failed=failed)
    selected = set(pipeline.dag.select(selection.get("only", ()), (), selection.get("to", ())))
    stages = [stage for stage, _ in incremental_stages(pipeline, asked.column) if stage in selected]
    below = {d for stage in stages for d in pipeline.dag.descendants(stage)} & selected - set(stages)
    rows = {ds: partition_rows(pipeline, planner.catalog, ds, found) for ds, found in keys.items()}
    return DryRun(backfill, rows, stages, [s for s in pipeline.dag.order() if s in below])


def run(pipeline: Pipeline, backfill: Backfill, done: set[int], listener_for: Callable[[], Listener], *,
        wait: bool, subscribers: Callable[[Pipeline], list] = lambda pipeline: [],
        exit_when_stuck: bool = False) -> Outcome:
    """Each chunk not done, in order, as its own run; stops at the first that does not succeed."""
    outcome = Outcome(backfill, [], sorted(done))
    for chunk in backfill.chunks:
        if chunk.number in done:
            continue
        result = run_chunk(pipeline, backfill, chunk, listener_for(), wait=wait, subscribers=subscribers(pipeline),
                           exit_when_stuck=exit_when_stuck)
        outcome.results.append(result)
        if result.status != "success":
            break
    return outcome


def partition_rows(pipeline: Pipeline, catalog, dataset: str, keys: list[str]) -> dict[str, int | None]:
    """The rows of each partition of `dataset` named by `keys`, from its Parquet footers."""
    import pyarrow.parquet as pq

    from ..data import storage
    from ..store.incremental import partition_key, schema_types

    spec = pipeline.dataset(dataset)
    partition_by = tuple(spec.partition_by)
    if pipeline.is_external(dataset):
        root = pipeline.external_path(dataset)
        filesystem = pipeline.filesystem_of(root)
        files, types = storage.files_under(root, filesystem), dict(spec.schema_ or {})
    else:
        version = catalog.current(dataset)
        root, types = version.directory, schema_types(version.schema)
        filesystem = pipeline.filesystem_of(root)
        files = list(version.files)
    rows: dict[str, int | None] = dict.fromkeys(keys, 0)
    for file in files:
        key = partition_key(file.relative_to(root), partition_by, types) if file.suffix == ".parquet" else None
        if key in rows:
            try:
                rows[key] += pq.read_metadata(str(file), filesystem=filesystem).num_rows
            except (OSError, ValueError):
                rows[key] = None
    return rows


def _planner(pipeline: Pipeline):
    from ..execution.planner import Planner

    return Planner(pipeline, Workspace.of(pipeline))
