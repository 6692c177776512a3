"""Run records of a workdir in object storage. The store holds the truth: each run's record (the
run, its stages, its timeline) as <workdir>/runs/<run>.json, and its logs and report under
<workdir>/<pipeline>/runs/<run>/. This machine's runs.db is a cache of them, filled from the store
whenever it is opened, so that a runner on a fresh machine (a replaced cron box, a container) lists,
shows, reports and resumes the runs made elsewhere."""

from __future__ import annotations

import logging
from pathlib import Path

from ..data import untrusted
from .state import RunStore

RECORD_FORMAT = 1


class RemoteRecords:
    """The run records in the workdir, read into this machine's runs.db only as they are needed: a
    fresh machine reads the newest (what `run`, `--resume` and `runs` look at) and a named older run
    when it is asked for, never every record ever written."""

    def __init__(self, store: RunStore, objects, remote, local: Path) -> None:
        self.store, self.objects, self.remote, self.local = store, objects, remote, local
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """The run ids recorded in the workdir, newest first (run ids begin with their start time)."""
        if self._names is None:
            found = self.objects.children(self.remote / "runs")
            self._names = sorted((n.removesuffix(".json") for n in found if n.endswith(".json")), reverse=True)
        return self._names

    def pull(self, newest: int, pipeline: str | None) -> None:
        """Every record this machine saw running (it may have ended since), and the unseen ones newer
        than the `newest` runs of `pipeline` (of any, when None) already here, read newest first,
        side by side, until that many are here."""
        known = self.store.run_statuses()
        self._read([name for name in self.names if known.get(name) == "running"])
        pipelines = {run["run_id"]: run["pipeline"] for run in self.store.runs(limit=len(known) + 1)}
        count, names = 0, self.names
        while names and count < newest:
            name = names[0]
            if name in known:
                count += pipeline is None or pipelines.get(name) == pipeline
                names = names[1:]
                continue
            unseen = 0  # the unseen run ids that follow, newest first: read as many as may still be wanted
            while unseen < len(names) and names[unseen] not in known and unseen < newest - count:
                unseen += 1
            read = self._read(names[:unseen])
            count += sum(1 for record in read if pipeline is None or record["run"].get("pipeline") == pipeline)
            names = names[unseen:]

    def fetch_matching(self, prefix: str) -> None:
        """The records whose run id begins with `prefix` (a run asked for by id), when not here yet."""
        known = self.store.run_statuses()
        self._read([name for name in self.names if name.startswith(prefix) and name not in known][:2])

    def _read(self, names: list[str]) -> list[dict]:
        """The records named, read side by side, imported into the store; the ones imported."""
        from concurrent.futures import ThreadPoolExecutor

        if not names:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
            answers = list(pool.map(lambda name: self.objects.read_json(self.remote / "runs" / f"{name}.json")[0],
                                    names))
        imported = []
        for name, record in zip(names, answers):
            if not record or not isinstance(record, dict) or record.get("format") != RECORD_FORMAT \
                    or not isinstance(record.get("run"), dict):
                continue
            try:
                self.store.import_run(_localised(record, self.local, (self.remote / "runs" / f"{name}.json").uri))
            except untrusted.UntrustedValue as exc:  # one tampered record must not stop every run
                logging.getLogger("hybridflow").warning("%s", exc.one_line())
                continue
            imported.append(record)
        return imported


def fetch_run_dir(objects, root, run: dict) -> None:
    """A run's logs and report from the workdir in object storage (`root`, reached by `objects`) into
    this machine's cache, where the run was made on another machine (its run_dir is not here)."""
    run_dir = Path(run.get("run_dir") or "")
    if not run.get("run_dir") or run_dir.is_dir():
        return
    prefix = root / run["pipeline"] / "runs" / run["run_id"]
    objects.download(objects.files(prefix), prefix, run_dir)


def push(objects, root, store: RunStore, pipeline: str, run_id: str, run_dir: Path | None = None) -> None:
    """The run's record, and (when given) its directory of logs and report, into the workdir `root`."""
    if run_dir is not None and run_dir.is_dir():
        objects.upload(run_dir, root / pipeline / "runs" / run_id)
    record = {"format": RECORD_FORMAT, "run": store.run(run_id), "stages": store.stages(run_id),
              "spans": store.spans(run_id)}
    objects.write_json(root / "runs" / f"{run_id}.json", record)


def _localised(record: dict, local: Path, where: str) -> dict:
    """The record with its paths (run directory, stage logs) in this machine's cache of the workdir,
    where each must stay: a record is the bucket's data, its names are checked before they are paths."""
    run = dict(record["run"])
    here = local / untrusted.name(run.get("pipeline"), where) / "runs" / untrusted.run_id(run.get("run_id"), where)
    there = run.get("run_dir") or ""
    run["run_dir"] = str(here)
    stages = []
    for stage in _rows(record.get("stages"), run["run_id"]):
        log = stage.get("log_path")
        if isinstance(log, str) and there and log.startswith(there.rstrip("/") + "/"):
            stage["log_path"] = str(here / untrusted.relative_file(log[len(there.rstrip("/")) + 1:], where))
        else:
            stage["log_path"] = None  # a log elsewhere on the machine that wrote it is not this machine's to read
        stages.append(stage)
    return {"run": run, "stages": stages, "spans": _rows(record.get("spans"), run["run_id"])}


def _rows(rows, run_id: str) -> list[dict]:
    """A record's stage or span rows, each of this run (whatever run id a row itself claims)."""
    return [{**row, "run_id": run_id} for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []
