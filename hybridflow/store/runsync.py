"""Run records of a workdir in object storage. The store holds the truth: each run's record (the
run, its stages, its timeline) as <workdir>/runs/<run>.json, and its logs and report under
<workdir>/<pipeline>/runs/<run>/. This machine's runs.db is a cache of them, filled from the store
whenever it is opened, so that a runner on a fresh machine (a replaced cron box, a container) lists,
shows, reports and resumes the runs made elsewhere."""

from __future__ import annotations

from pathlib import Path

from .state import RunStore

RECORD_FORMAT = 1


def open_store(pipeline) -> RunStore:
    """The pipeline's run store: its workdir's runs.db, with the records in object storage added."""
    return open_workdir_store(pipeline.workdir, pipeline.remote, pipeline.store if pipeline.remote else None)


def open_workdir_store(local: Path, remote=None, settings=None) -> RunStore:
    store = RunStore(local / "runs.db")
    if remote is not None:
        from ..data.objectstore import ObjectStore

        store.remote = (ObjectStore(settings), remote)
        _pull(store, store.remote[0], remote, local)
    return store


def fetch_run_dir(store: RunStore, run: dict) -> None:
    """A run's logs and report from the workdir in object storage into this machine's cache, where
    the run was made on another machine (its run_dir is not here)."""
    remote = getattr(store, "remote", None)
    run_dir = Path(run.get("run_dir") or "")
    if remote is None or not run.get("run_dir") or run_dir.is_dir():
        return
    objects, root = remote
    prefix = root / run["pipeline"] / "runs" / run["run_id"]
    objects.download(objects.files(prefix), prefix, run_dir)


def open_remote_workdir(uri: str) -> RunStore:
    """The run store of a workdir in object storage named by its URI alone (`hybridflow runs -w
    s3://...`): its records, reached with the AWS variables."""
    import os

    from ..data.storage import StoreSettings, object_path
    from ..spec.config import local_cache

    remote = object_path(uri)
    return open_workdir_store(local_cache(remote, os.environ), remote, StoreSettings.of())


def push(store: RunStore, pipeline, run_id: str, run_dir: Path | None = None) -> None:
    """The run's record, and (when given) its directory of logs and report, into the workdir."""
    from ..data.objectstore import ObjectStore

    objects = ObjectStore(pipeline.store)
    if run_dir is not None and run_dir.is_dir():
        objects.upload(run_dir, pipeline.remote / pipeline.name / "runs" / run_id)
    record = {"format": RECORD_FORMAT, "run": store.run(run_id), "stages": store.stages(run_id),
              "spans": store.spans(run_id)}
    objects.write_json(pipeline.remote / "runs" / f"{run_id}.json", record)


def _pull(store: RunStore, objects, remote, local: Path) -> None:
    known = store.run_statuses()
    for name in objects.children(remote / "runs"):
        run_id = name.removesuffix(".json")
        if not name.endswith(".json") or known.get(run_id, "running") != "running":
            continue  # a finished run's record never changes; a running one's may have since
        record, _ = objects.read_json(remote / "runs" / name)
        if not record or record.get("format") != RECORD_FORMAT or not record.get("run"):
            continue
        store.import_run(_localised(record, local))


def _localised(record: dict, local: Path) -> dict:
    """The record with its paths (run directory, stage logs) in this machine's cache of the workdir."""
    run = dict(record["run"])
    here = local / run["pipeline"] / "runs" / run["run_id"]
    there = run.get("run_dir") or ""
    run["run_dir"] = str(here)
    stages = []
    for stage in record.get("stages", []):
        stage = dict(stage)
        if stage.get("log_path") and there and stage["log_path"].startswith(there):
            stage["log_path"] = str(here) + stage["log_path"][len(there):]
        stages.append(stage)
    return {"run": run, "stages": stages, "spans": record.get("spans", [])}
