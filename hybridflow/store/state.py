"""Run records: every run and every stage, in one embedded SQLite database per workdir.

One file (<workdir>/runs.db) serves every pipeline in the workdir, so `hybridflow runs` can list
them all. WAL mode and a busy timeout let runs of different pipelines record at the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import urllib.parse
from contextlib import closing
from pathlib import Path
from typing import Any

from ..definition.pipeline import REDACTED
from ..errors import UsageError, storage_error, vanished
from .workdir import claim

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, pipeline TEXT NOT NULL, pipeline_file TEXT, trigger TEXT NOT NULL,
    started_at TEXT NOT NULL, ended_at TEXT, status TEXT NOT NULL, error TEXT, run_dir TEXT, arguments TEXT,
    scheduled_for TEXT, calendar TEXT
);
CREATE TABLE IF NOT EXISTS stages (
    run_id TEXT NOT NULL REFERENCES runs(run_id), stage TEXT NOT NULL, backend TEXT NOT NULL,
    status TEXT NOT NULL, duration REAL, engine_start REAL, rows_in INTEGER, bytes_in INTEGER,
    rows_out INTEGER, bytes_out INTEGER, skip_reason TEXT, error TEXT, log_path TEXT, outputs TEXT,
    position INTEGER NOT NULL, fingerprint TEXT, gpu INTEGER, gpu_reason TEXT, attempts INTEGER, engine_work TEXT,
    PRIMARY KEY (run_id, stage)
);
CREATE INDEX IF NOT EXISTS runs_by_pipeline ON runs (pipeline, started_at);
CREATE TABLE IF NOT EXISTS spans (
    run_id TEXT NOT NULL REFERENCES runs(run_id), stage TEXT, kind TEXT NOT NULL, detail TEXT,
    attempt INTEGER, started_at REAL NOT NULL, ended_at REAL, outcome TEXT, nodes INTEGER
);
CREATE INDEX IF NOT EXISTS spans_by_run ON spans (run_id, started_at);
"""
SPAN_FIELDS = ("run_id", "stage", "kind", "detail", "attempt", "started_at", "ended_at", "outcome", "nodes")
CALENDAR_STATUSES = ("held", "released")  # records of a schedule's calendar (ops/calendar.py): no stage ran
ATTEMPTED = ("done", "failed", "killed")  # the statuses of a stage that a run tried and finished with

# scheduled_for: the time the run is for; calendar: JSON of the ticks it caught up or found missed,
# or why a tick was held (ops/calendar.py)
RUN_FIELDS = ("run_id", "pipeline", "pipeline_file", "trigger", "started_at", "ended_at", "status", "error",
              "run_dir", "arguments", "scheduled_for", "calendar")
STAGE_FIELDS = ("run_id", "stage", "backend", "status", "duration", "engine_start", "rows_in", "bytes_in",
                "rows_out", "bytes_out", "skip_reason", "error", "log_path", "outputs", "position", "fingerprint",
                "gpu", "gpu_reason", "attempts", "engine_work", "checks")
# columns added after the first release: added to an existing runs.db when it is opened
ADDED_COLUMNS = {"runs": {"arguments": "TEXT", "scheduled_for": "TEXT", "calendar": "TEXT"},
                 "stages": {"fingerprint": "TEXT", "gpu": "INTEGER", "gpu_reason": "TEXT", "attempts": "INTEGER",
                            "engine_work": "TEXT", "checks": "TEXT"},  # checks: each output's data checks
                 "spans": {"nodes": "INTEGER"}}  # the hosts of a cluster brought up for the run


class RunStore:
    fetch_missing = None  # reads the records of a run id (prefix) not here yet from that workdir (runsync)

    def __init__(self, path: Path) -> None:
        self.path = path
        with _explained(path, opened=False):
            claim(path.parent)  # the workdir is made here, first of all it holds
            _make_private(path)
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)
            for table, columns in ADDED_COLUMNS.items():
                present = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
                for column, kind in columns.items():
                    if column not in present:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _connect(self, any_thread: bool = False) -> sqlite3.Connection:
        # mode=rw: a runs.db removed while in use is an error here, never silently a new empty one
        with _explained(self.path):
            db = sqlite3.connect(f"file:{urllib.parse.quote(str(self.path))}?mode=rw", uri=True, timeout=30,
                                 factory=_Connection, check_same_thread=not any_thread)
        db.path = self.path
        db.execute("PRAGMA journal_mode=WAL")
        db.row_factory = sqlite3.Row
        return db

    def save_run(self, **run: Any) -> None:
        self._upsert("runs", RUN_FIELDS, ("run_id",), run)

    def save_stage(self, **stage: Any) -> None:
        self._upsert("stages", STAGE_FIELDS, ("run_id", "stage"), stage)

    def held_open(self) -> sqlite3.Connection:
        """A connection that only stays open while a run records (close it when the run ends): SQLite
        checkpoints the WAL into runs.db, with fsyncs, whenever its last connection closes, which
        would be after every one of a run's many small writes otherwise (closed by whichever thread
        ends the run)."""
        return self._connect(any_thread=True)

    def save_span(self, **span: Any) -> None:
        """One timed step of a run (see timeline.py); wall-clock seconds since the epoch. Committed
        without waiting for the disk (the WAL keeps it whatever ends the process; a power cut may take
        the last steps of the timeline, never the run's or its stages' records)."""
        with closing(self._connect()) as db, db:
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"INSERT INTO spans ({', '.join(SPAN_FIELDS)}) VALUES ({', '.join('?' * len(SPAN_FIELDS))})",
                       [span.get(f) for f in SPAN_FIELDS])

    def spans(self, run_id: str) -> list[dict[str, Any]]:
        with closing(self._connect()) as db:
            rows = db.execute("SELECT * FROM spans WHERE run_id = ? ORDER BY started_at", (run_id,)).fetchall()
        return [dict(row) for row in rows]

    def _upsert(self, table: str, fields: tuple[str, ...], key: tuple[str, ...], values: dict[str, Any]) -> None:
        updates = ", ".join(f"{f} = excluded.{f}" for f in fields if f not in key)
        with closing(self._connect()) as db, db:
            db.execute(f"INSERT INTO {table} ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))}) "
                       f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}", [values.get(f) for f in fields])

    def runs(self, pipeline: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        where, args = ("WHERE pipeline = ?", [pipeline]) if pipeline else ("", [])
        with closing(self._connect()) as db:
            rows = db.execute(f"SELECT * FROM runs {where} ORDER BY started_at DESC, rowid DESC LIMIT ?",
                              [*args, limit]).fetchall()
        return [dict(r) for r in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run by id, or by a unique prefix of it (read from the workdir in object storage first,
        when it is not here: fetch_missing)."""
        rows = self._runs_like(run_id)
        if not rows and self.fetch_missing is not None:
            self.fetch_missing(run_id)
            rows = self._runs_like(run_id)
        return dict(rows[0]) if len(rows) == 1 else None

    def _runs_like(self, run_id: str) -> list:
        with closing(self._connect()) as db:
            return db.execute("SELECT * FROM runs WHERE run_id LIKE ? ORDER BY run_id",
                              [run_id.replace("%", "") + "%"]).fetchall()

    def mark_abandoned(self, pipeline: str, ended_at: str) -> list[str]:
        """Runs still marked running, found by a run that holds the pipeline's lock: their process died
        without recording an end (SIGKILL, power loss). Returns their ids."""
        with closing(self._connect()) as db, db:
            ids = [r["run_id"] for r in db.execute("SELECT run_id FROM runs WHERE pipeline = ? AND status = 'running'",
                                                   [pipeline])]
            for run_id in ids:
                db.execute("UPDATE runs SET status = 'killed', ended_at = ?, error = ? "
                           "WHERE run_id = ? AND status = 'running'",
                           [ended_at, "the run's process died before it finished (killed?)", run_id])
                db.execute("UPDATE stages SET status = 'killed' WHERE run_id = ? AND status = 'running'", [run_id])
        return ids

    def running_stages(self, run_id: str) -> list[dict[str, Any]] | None:
        """The stages (stage, log_path) of a run still recorded as running; None if its end is recorded."""
        with closing(self._connect()) as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ? AND status = 'running'", [run_id]).fetchone() is None:
                return None
            return [dict(r) for r in db.execute("SELECT stage, log_path FROM stages WHERE run_id = ? AND "
                                                "status = 'running' ORDER BY position", [run_id])]

    def mark_crashed(self, run_id: str, error: str, ended_at: str) -> None:
        """A run whose process ended without recording its end (os._exit, a crash in native code),
        recorded by the command that started it: killed, with the error, as its running stages."""
        with closing(self._connect()) as db, db:
            db.execute("UPDATE runs SET status = 'killed', ended_at = ?, error = ? WHERE run_id = ? AND "
                       "status = 'running'", [ended_at, error, run_id])
            db.execute("UPDATE stages SET status = 'killed', error = ? WHERE run_id = ? AND status = 'running'",
                       [error, run_id])

    def run_statuses(self) -> dict[str, str]:
        with closing(self._connect()) as db:
            return {row["run_id"]: row["status"] for row in db.execute("SELECT run_id, status FROM runs")}

    def import_run(self, record: dict[str, Any]) -> None:
        """A run recorded elsewhere (runsync.py): its run, stages and spans, in place of what this
        store holds of it (a run it last saw running)."""
        with closing(self._connect()) as db, db:
            run = record["run"]
            for table in ("spans", "stages", "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", [run["run_id"]])
            for table, fields, rows in (("runs", RUN_FIELDS, [run]), ("stages", STAGE_FIELDS, record["stages"]),
                                        ("spans", SPAN_FIELDS, record["spans"])):
                for row in rows:
                    db.execute(f"INSERT INTO {table} ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))})",
                               [row.get(f) for f in fields])

    def last_run(self, pipeline: str | None = None) -> dict[str, Any] | None:
        """The newest run of `pipeline`, or of every pipeline in this store when it is None; a held
        tick or a release (records of the schedule's calendar, in which nothing ran) is not one."""
        found = self.runs(pipeline, limit=20)
        return next((run for run in found if run["status"] not in CALENDAR_STATUSES), None)

    def last_attempt(self, pipeline: str, stage: str) -> dict[str, Any] | None:
        """The newest run of `pipeline` that tried `stage` and finished it: {"run_id", "status"}, the
        status one of ATTEMPTED. A run that skipped the stage or never reached it does not count."""
        statuses = ", ".join("?" * len(ATTEMPTED))
        with closing(self._connect()) as db:
            row = db.execute("SELECT stages.run_id, stages.status FROM stages JOIN runs USING (run_id) "
                             f"WHERE runs.pipeline = ? AND stages.stage = ? AND stages.status IN ({statuses}) "
                             "ORDER BY runs.started_at DESC, runs.rowid DESC LIMIT 1",
                             [pipeline, stage, *ATTEMPTED]).fetchone()
        return dict(row) if row else None

    def stages(self, run_id: str) -> list[dict[str, Any]]:
        with closing(self._connect()) as db:
            rows = db.execute("SELECT * FROM stages WHERE run_id = ? ORDER BY position", [run_id]).fetchall()
        return [dict(r) for r in rows]


class _Connection(sqlite3.Connection):
    """A connection to runs.db whose every query and commit has its errors explained (_explained)."""

    path: Path

    def execute(self, *args):
        with _explained(self.path):
            return super().execute(*args)

    def executescript(self, script):
        with _explained(self.path):
            return super().executescript(script)

    def __exit__(self, *exc_info):
        with _explained(self.path):
            return super().__exit__(*exc_info)


@contextlib.contextmanager
def _explained(path: Path, opened: bool = True):
    """runs.db's OS and SQLite errors that are the user's to fix, raised as the hybridflow errors that
    name the workdir (a full, read-only or not writable one: errors.storage_error); once the store is
    opened, a missing workdir or runs.db was removed while in use."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        gone = next((p for p in (path.parent, path) if not p.exists()), None) if opened else None
        # the workdir, else runs.db itself (another user's, in a workdir this one may write)
        problem = vanished(gone) if gone is not None else storage_error(exc, path.parent) or storage_error(exc, path)
        if problem is None:
            raise
        raise problem from exc


def _make_private(path: Path) -> None:
    """runs.db created owner-only, and narrowed if an older one is not: its errors may quote data, as
    the logs (0600) do. SQLite gives the files it keeps beside it (-wal, -shm) the database's mode."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for file in (path, *(path.with_name(path.name + side) for side in ("-wal", "-shm", "-journal"))):
        try:
            if file.stat().st_mode & 0o077:
                os.chmod(file, 0o600)
        except (FileNotFoundError, PermissionError):  # gone meanwhile, or another user's to narrow
            continue


# A run's arguments (how it was asked for: --only/--from/--to/--param/--force) are kept so --resume
# can ask again. A --param typed with a secret's value in it (-p token=$API_TOKEN, where the pipeline
# reads ${env:API_TOKEN}) is kept with ${env:API_TOKEN} in the value's place and its position listed
# under "env_params": runs.db never holds the secret, and --resume reads it from the environment again.
# A secret no variable holds any more is kept as *** under "lost_params", and --resume refuses.
ENV_PARAMS, LOST_PARAMS = "env_params", "lost_params"
_REFERENCE = re.compile(r"\$\{env:(\w+)\}")


def json_field(run: dict[str, Any], name: str) -> dict[str, Any]:
    """A run record's JSON object field (calendar, arguments): {} when missing or not an object; a
    record read from a bucket, or written by another version, must not stop the runs that read it."""
    try:
        value = json.loads(run.get(name) or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def recorded_arguments(arguments: dict[str, Any], secrets, sources: dict[str, str]) -> dict[str, Any]:
    """`arguments` as runs.db keeps them. `secrets`: the pipeline's; `sources`: each secret -> the
    environment variable holding it (Pipeline.secret_sources)."""
    ordered = sorted((s for s in secrets if s), key=len, reverse=True)  # a secret containing another goes first
    if not ordered or not arguments.get("params"):
        return dict(arguments)
    pattern = re.compile("|".join(re.escape(s) for s in ordered))
    params, marked = [], {ENV_PARAMS: [], LOST_PARAMS: []}
    for index, param in enumerate(arguments["params"]):
        lost = False

        def reference(match: re.Match) -> str:
            nonlocal lost
            name = sources.get(match.group())
            lost = lost or name is None
            return REDACTED if name is None else "${env:" + name + "}"

        kept = pattern.sub(reference, param)  # one pass: a reference written is never searched again
        if kept != param:
            marked[LOST_PARAMS if lost else ENV_PARAMS].append(index)
        params.append(kept)
    return {**arguments, "params": params, **{k: v for k, v in marked.items() if v}}


def resumed_arguments(recorded: dict[str, Any], environ) -> dict[str, Any]:
    """The arguments runs.db keeps, with each secret read from the environment again."""
    params = list(recorded.get("params") or [])
    lost = recorded.get(LOST_PARAMS)
    if lost:
        raise UsageError(f"--resume cannot repeat --param {_key(params[lost[0]])}: it held a secret that is "
                         "not kept", hint="run again without --resume, giving the --param values again")
    for index in recorded.get(ENV_PARAMS) or []:
        param = params[index]
        params[index] = _REFERENCE.sub(lambda match, param=param: _read(match.group(1), param, environ), param)
    resumed = {k: v for k, v in recorded.items() if k not in (ENV_PARAMS, LOST_PARAMS)}
    resumed["params"] = params
    return resumed


def _key(param: str) -> str:
    return param.partition("=")[0]


def _read(name: str, param: str, environ) -> str:
    if name not in environ:
        raise UsageError(f"--resume: the last run's --param {_key(param)} held the value of ${name}, which "
                         "is not set now", hint=f"export {name}=... and resume again")
    return environ[name]
