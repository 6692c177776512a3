"""Where datasets live and how a new version becomes visible: all at once, or not at all.

Layout under <workdir>/<pipeline>/:
    datasets/<name>/versions/<version>/   immutable: data files plus _manifest.json
    datasets/<name>/CURRENT               a small pointer file; replacing it is the commit point
    staging/<run>/<name>/                 where engines write; readers never look here

An engine writes into a fresh staging directory; the files are checked, hashed and
fsynced; the manifest is written; the directory is renamed into versions/; then
CURRENT is replaced with os.replace and its directory fsynced. A reader resolves
CURRENT and reads the manifest's file list, never a directory listing, so a crash
at any moment leaves it the previous complete version or the new complete one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable

from ..data.contract import check_schema, schema_to_dict
from ..data.durable import fsync_path
from ..data.hashing import file_digests
from ..data.stores import Settings
from ..data.tables import TableSource, partition_values
from ..errors import DataError, vanished
from . import faults
from .workdir import remove_leftovers

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa
    import pyarrow.parquet as pq

MANIFEST = "_manifest.json"
POINTER = "CURRENT"
JOURNAL = "COMMITTING"  # a stage's outputs being made current together
MANIFEST_FORMAT = 1
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Version:
    dataset: str
    id: str
    directory: PurePath  # a local Path, or an ObjectPath in a workdir in object storage
    manifest: dict[str, Any]
    store: Settings | None = None  # how to reach an ObjectPath directory

    @property
    def files(self) -> tuple[PurePath, ...]:
        return tuple(self.directory / f["path"] for f in self.manifest["files"])

    @property
    def schema(self) -> pa.Schema | None:
        import pyarrow as pa

        raw = self.manifest.get("arrow_schema")
        return pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(raw))) if raw else None

    @property
    def rows(self) -> int | None:
        return self.manifest.get("rows")

    @property
    def bytes(self) -> int:
        return sum(f["size"] for f in self.manifest["files"])

    def source(self) -> TableSource:
        return TableSource(self.dataset, self.files, "parquet", self.schema,
                           tuple(self.manifest.get("partition_by", ())), self.directory, self.store)


class Catalog:
    def __init__(self, home: Path) -> None:
        self.home = home  # <workdir>/<pipeline>
        # the run lock's proof that it is still held, set by its holder: asked before every commit and
        # removal, so a lock that can be lost (a lease) publishes and deletes nothing once it is
        self.confirm: Callable[[], None] = _unguarded

    def dataset_dir(self, name: str) -> Path:
        return self._child(self.home / "datasets", name)

    def staging_root(self) -> Path:
        return self.home / "staging"

    def current(self, name: str) -> Version | None:
        """The published version of a dataset, or None if it was never published. A stage commit
        that a crash interrupted counts as done: its versions were complete before it began."""
        pending = self._journal().get(name)
        if pending is not None:
            return self.version(name, pending)
        pointer = self.dataset_dir(name) / POINTER
        try:
            version_id = json.loads(pointer.read_text())["version"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError) as exc:
            raise DataError(f"the pointer file {pointer} is corrupt: {exc}") from exc
        return self.version(name, version_id)

    def version(self, name: str, version_id: str) -> Version:
        """One version of a dataset, by id, with its manifest."""
        directory = self._child(self.dataset_dir(name) / "versions", version_id)
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (FileNotFoundError, ValueError) as exc:
            raise DataError(f"dataset '{name}' version {version_id} has no readable manifest: {exc}") from exc
        return Version(name, version_id, directory, manifest)

    def staging_of(self, run_id: str, name: str) -> Path:
        """Where a run stages an output on this machine (made by new_staging)."""
        return self._child(self._child(self.staging_root(), run_id), name)

    def new_staging(self, run_id: str, name: str, remote: bool = False) -> Path:
        """A fresh directory a stage's engine writes an output into (`remote`: whether the engine could
        write object storage itself; a local workdir has none)."""
        directory = self.staging_of(run_id, name)
        if directory.exists():
            shutil.rmtree(directory)
        return self._made(directory)

    def discard_staging(self, run_id: str | None = None) -> None:
        """Remove one run's staging area, or all of it (only ever under the lock)."""
        target = self._child(self.staging_root(), run_id) if run_id else self.staging_root()
        shutil.rmtree(target, ignore_errors=True)

    def publish(self, name: str, staging: Path, **facts: Any) -> Version:
        """Check, hash and atomically publish what a stage wrote into `staging`."""
        version = self.prepare(name, staging, **facts)
        self.commit(version)
        return version

    def prepare(self, name: str, staging: Path, *, kind: str, stage: str, run_id: str,  # noqa: PLR0913 - keyword-only: the facts a version's manifest records
                inputs: dict[str, str], declared: dict[str, pa.DataType] | None = None,
                partition_by: tuple[str, ...] = (), written: pa.Schema | None = None,
                fingerprint: dict[str, Any] | None = None, checks: list[dict] | None = None) -> Version:
        """Check, hash and fsync what a stage wrote, and move it into an immutable version directory
        that no reader sees until commit() points the dataset at it."""
        self._require_workdir()
        files = _list_files(staging, name)
        for file in files:
            file.chmod(0o444)  # published versions are immutable
        # the files reach the disk while they are read back and hashed: the wait for one overlaps the other
        syncing = _Background(_fsync_tree, staging, files)
        try:
            manifest, _ = self._manifest(name, staging, files, kind=kind, stage=stage, run_id=run_id, inputs=inputs,
                                         declared=declared, partition_by=partition_by, written=written,
                                         fingerprint=fingerprint, checks=checks)
        except BaseException:
            with contextlib.suppress(OSError):  # what the check found is the error to tell
                syncing.wait()
            raise
        syncing.wait()  # durable before anything names them
        version_id = manifest["version"]
        _write_durably(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        (staging / MANIFEST).chmod(0o444)
        versions = self._made(self.dataset_dir(name) / "versions")
        final = versions / version_id
        os.rename(staging, final)
        fsync_path(versions)
        faults.checkpoint("publish:moved")
        return Version(name, version_id, final, manifest)

    @staticmethod
    def _manifest(name: str, staging: Path, files: list[Path] | None = None,
                  **facts: Any) -> tuple[dict[str, Any], list[Path]]:
        """What a stage wrote into `staging` (its `files`, listed here if not given), checked against its
        contract and described: every file with its size and digests, the rows, the schema; and the
        new version's id."""
        files = _list_files(staging, name) if files is None else files
        metadata = {f: _footer_metadata(name, f) for f in files if f.suffix == ".parquet"} \
            if facts["kind"] == "table" else {}
        footers = [(f, m.num_rows, m.schema.to_arrow_schema().remove_metadata()) for f, m in metadata.items()]
        manifest = describe_version(name, staging, [_describe(staging, f, metadata.get(f)) for f in files], footers,
                                    **facts)
        manifest["version"] = _new_version_id(manifest)
        return manifest, files

    def local_copy(self, version: Version) -> Path:
        """A version as a local folder (a `kind: files` dataset a stage reads): its own directory."""
        return version.directory

    def bring(self, version: Version, files: list[PurePosixPath], into: PurePath) -> None:
        """Some files of a published version (relative paths) into a staging directory: hard-linked,
        since published files never change (copied across file systems)."""
        for relative in files:
            target = into / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(version.directory / relative, target)
            except OSError:
                shutil.copy2(version.directory / relative, target)

    def discard(self, version: Version) -> None:
        """Remove a prepared version that will never be committed (renamed out of versions/ first, so
        that a crash half-way leaves trash, never a half-deleted version)."""
        if self.current(version.dataset) is not None and self.current(version.dataset).id == version.id:
            raise DataError(f"refusing to discard the current version {version.id} of '{version.dataset}'")
        trash = self._made(self.home / "trash") / f"{version.dataset}-{version.id}"
        os.rename(version.directory, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def commit(self, version: Version) -> None:
        """Make a prepared version the dataset's current one: the single atomic step."""
        self.commit_together([version])

    def commit_together(self, versions: list[Version]) -> None:
        """Make prepared versions current together (a stage's outputs). The journal, written
        durably first, names them all; readers take it as already done, and recover() completes
        it after a crash, so no reader ever sees one output new and another old."""
        self._require_workdir()
        self.confirm()
        if len(versions) > 1:
            _write_durably(self.home / JOURNAL, json.dumps({v.dataset: v.id for v in versions}))
            faults.checkpoint("publish:journal")
        for version in versions:
            _write_durably(self.dataset_dir(version.dataset) / POINTER, json.dumps({"version": version.id}) + "\n")
            faults.checkpoint("publish:committed")
        if len(versions) > 1:
            (self.home / JOURNAL).unlink()
            fsync_path(self.home)

    def recover(self) -> list[str]:
        """Finish what a crash interrupted (only ever under the run lock): a stage commit, and the
        temporary files its dead writers left (workdir.remove_leftovers). Returns the datasets the
        commit pointed at their new versions."""
        pending = self._journal()
        if pending:
            self.commit_together([self.version(name, version_id) for name, version_id in pending.items()])
        remove_leftovers(self.home)
        return sorted(pending)

    def _journal(self) -> dict[str, str]:
        try:
            return json.loads((self.home / JOURNAL).read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:  # written by atomic replace: only damage from outside gets here
            raise DataError(f"the commit journal {self.home / JOURNAL} is unreadable: {exc}",
                            hint="check the outputs' CURRENT files, then delete the journal") from exc

    def datasets(self) -> list[str]:
        root = self.home / "datasets"
        return sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []

    def versions(self, name: str) -> list[str]:
        """Every version id of a dataset, oldest first (ids start with their UTC creation time)."""
        directory = self.dataset_dir(name) / "versions"
        return sorted(d.name for d in directory.iterdir() if d.is_dir()) if directory.is_dir() else []

    def protected(self) -> set[tuple[str, str]]:
        """(dataset, version) pairs that must never be removed: every current version and, following the
        recorded inputs, every version the current ones were made from."""
        keep: set[tuple[str, str]] = set()
        todo = [(name, v.id) for name in self.datasets() if (v := self.current(name)) is not None]
        while todo:
            dataset, version_id = todo.pop()
            if (dataset, version_id) in keep:
                continue
            keep.add((dataset, version_id))
            try:
                manifest = self.version(dataset, version_id).manifest
            except DataError:  # an unreadable or oddly named version: nothing to follow from it
                continue
            todo += [(ds, vid) for ds, vid in manifest.get("inputs", {}).items()
                     if not str(vid).startswith("external:")]
        return keep

    def collect_garbage(self, keep: int, dry_run: bool = False) -> list[tuple[str, str]]:
        """Remove all but the newest `keep` committed versions of each dataset, and every version that
        was prepared but never made current; never a protected one (only ever under the run lock).
        A version is first renamed out of versions/ and then deleted, so a crash
        half-way leaves trash, never a half-deleted version."""
        protected = self.protected()
        removed = []
        for dataset in self.datasets():
            versions = self.versions(dataset)
            current = self.current(dataset)
            # prepared after the current one and never committed (a later output of the stage failed)
            never_current = [v for v in versions if current is None or v > current.id]
            committed = [v for v in versions if v not in never_current]
            old = never_current + (committed[:-keep] if keep > 0 else committed)
            for version_id in old:
                if (dataset, version_id) in protected:
                    continue
                removed.append((dataset, version_id))
        if not dry_run:
            self._remove_versions(removed)
        return removed

    def _remove_versions(self, versions: list[tuple[str, str]]) -> None:
        for dataset, version_id in versions:
            self.confirm()
            trash = self._made(self.home / "trash") / f"{dataset}-{version_id}"
            os.rename(self.dataset_dir(dataset) / "versions" / version_id, trash)
        shutil.rmtree(self.home / "trash", ignore_errors=True)

    def _made(self, directory: Path) -> Path:
        """`directory` below home, made with what is missing above it, but never the workdir itself."""
        self._require_workdir()
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _require_workdir(self) -> None:
        """The run store makes the workdir (workdir.claim): a missing one was removed while in use, and
        made anew here it would hold half a pipeline, so nothing is published into it."""
        if not self.home.parent.is_dir():
            raise vanished(self.home.parent)

    @staticmethod
    def _child(parent: Path, name: str) -> Path:
        """parent/name, where name must be one plain path component: a name like '', '.' or '..'
        joined onto a data directory is the directory itself, and must never be written or deleted."""
        if not _COMPONENT.match(name or ""):
            raise DataError(f"refusing to use {name!r} as a dataset or run name under {parent}")
        return parent / name


def _list_files(staging: Path, name: str) -> list[Path]:
    files = []
    for path in sorted(staging.rglob("*")):
        if path.is_symlink():
            raise DataError(f"output '{name}' contains a symbolic link ({path.name}); write real files")
        if path.is_file() and path.name != MANIFEST:
            files.append(path)
    return files


def _describe(root: Path, file: Path, metadata: pq.FileMetaData | None = None) -> dict[str, Any]:
    whole, data = file_digests(file, metadata)
    return {"path": file.relative_to(root).as_posix(), "size": file.stat().st_size, "sha256": whole, "data": data}


def data_digest(entry: dict[str, Any]) -> str:
    """What decides skipping for a manifest's file: its data digest (manifests written before there
    was one hold only the sha256 of the bytes; a file an engine wrote into object storage itself has
    the ETag the store gave it, which no one had to read the file back for)."""
    if "etag" in entry:
        return f"etag:{entry['etag']}"
    return entry.get("data", entry["sha256"])


def describe_version(name: str, root: PurePath, files: list[dict[str, Any]],  # noqa: PLR0913 - keyword-only: the facts a version's manifest records
                     footers: list[tuple[PurePath, int, pa.Schema]], *, kind: str, stage: str, run_id: str,
                     inputs: dict[str, str], declared: dict[str, pa.DataType] | None = None,
                     partition_by: tuple[str, ...] = (), written: pa.Schema | None = None,
                     fingerprint: dict[str, Any] | None = None, checks: list[dict] | None = None) -> dict[str, Any]:
    """A version's manifest (without its id): `files` described, and for a table the (file, rows,
    schema) of each Parquet file's footer, checked against the output's contract."""
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT, "dataset": name, "kind": kind, "stage": stage, "run_id": run_id,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "inputs": inputs, "files": files,
    }
    if fingerprint is not None:
        manifest["fingerprint"] = fingerprint
    if checks:
        manifest["checks"] = checks  # the data checks' outcomes: history kept with the data
    if kind == "table":
        manifest.update(_table_facts(name, root, footers, declared, tuple(partition_by), written))
    faults.checkpoint("publish:staged")
    return manifest


def read_footer(name: str, file: PurePath, filesystem=None) -> tuple[int, pa.Schema]:
    """A written Parquet file's row count and schema, from its footer alone."""
    metadata = _footer_metadata(name, file, filesystem)
    return metadata.num_rows, metadata.schema.to_arrow_schema().remove_metadata()


def _footer_metadata(name: str, file: PurePath, filesystem=None):
    """A written Parquet file's footer (read once: its rows, schema and where its data ends)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(str(file) if filesystem else file, filesystem=filesystem) as parquet:
            return parquet.metadata
    except pa.ArrowInvalid as exc:
        raise DataError(f"output '{name}': {file.name} is not a readable parquet file: {exc}") from exc
    except OSError as exc:
        if filesystem is None:
            raise DataError(f"output '{name}': {file.name} is not a readable parquet file: {exc}") from exc
        from ..errors import store_error

        raise store_error(exc, getattr(file, "uri", str(file))) from exc


def _table_facts(name: str, root: PurePath, footers: list[tuple[PurePath, int, pa.Schema]],
                 declared: dict[str, pa.DataType] | None, partition_by: tuple[str, ...],
                 written: pa.Schema | None) -> dict[str, Any]:
    """Every written file's footer: row count, one schema for all, partition values that fit their
    column's type, and the declared contract."""
    if not footers:
        raise DataError(f"output '{name}' was written without any parquet file")
    rows, schema = 0, None
    for file, file_rows, file_schema in footers:
        if schema is not None and not file_schema.equals(schema):
            raise DataError(f"output '{name}': {file.name} has a different schema from the other files")
        rows, schema = rows + file_rows, file_schema
    if partition_by:
        schema = _with_partitions(name, root, [f for f, _, _ in footers], schema, partition_by, written)
    check_schema(name, declared, schema)
    facts = {"rows": rows, "schema": schema_to_dict(schema), "arrow_schema": schema.serialize().to_pybytes().hex(),
             "partition_by": list(partition_by)}
    if partition_by:  # what row_count_change compares each partition of the next version with
        facts["partition_rows"] = partition_rows(root, footers, partition_by, schema)
    return facts


def partition_rows(root: PurePath, footers: list[tuple[PurePath, int, pa.Schema]], partition_by: tuple[str, ...],
                   schema: pa.Schema) -> dict[str, int]:
    """{partition key ('week=2026-11-16'): its rows} from the files' footers (no data read)."""
    from .incremental import partition_key, schema_types

    counts: dict[str, int] = {}
    for file, file_rows, _ in footers:
        key = partition_key(PurePosixPath(file.relative_to(root).as_posix()), partition_by, schema_types(schema))
        if key is not None:
            counts[key] = counts.get(key, 0) + file_rows
    return dict(sorted(counts.items()))


def _with_partitions(name: str, staging: PurePath, files: list[PurePath], data: pa.Schema,
                     partition_by: tuple[str, ...], written: pa.Schema | None) -> pa.Schema:
    """The full schema of a partitioned output: its files' columns plus the partition columns, typed as
    the engine held them, after checking every directory value fits that type."""
    import pyarrow as pa

    types = {f.name: f.type for f in written} if written is not None else {}
    fields = [pa.field(c, types.get(c, pa.string())) for c in partition_by]
    for file in files:
        values = partition_values(file, staging, partition_by)
        for field in fields:
            try:
                pa.array([values.get(field.name)], pa.string()).cast(field.type)
            except pa.ArrowInvalid as exc:
                raise DataError(f"output '{name}': partition value {values.get(field.name)!r} of '{field.name}' "
                                f"is not a {field.type}: {exc}") from exc
    full = pa.schema(list(data) + fields)
    if written is not None and set(written.names) == set(full.names):
        full = pa.schema([full.field(n) for n in written.names])  # the column order the stage produced
    return full


def _new_version_id(manifest: dict[str, Any]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    content = hashlib.sha256("".join(f["sha256"] for f in manifest["files"]).encode()).hexdigest()[:10]
    return f"{stamp}-{content}-{secrets.token_hex(2)}"


class _Background:
    """`work(*args)` in a thread of its own; wait() returns once it is done, raising what it raised."""

    def __init__(self, work, *args: Any) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                work(*args)
            except BaseException as exc:  # noqa: BLE001 - raised again in the waiting thread
                self._error = exc
        self._thread = threading.Thread(target=run, name="hybridflow-fsync", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _fsync_tree(root: Path, files: list[Path]) -> None:
    for file in files:
        fsync_path(file)
    for directory in sorted({f.parent for f in files} | {root}, reverse=True):
        fsync_path(directory)


def _write_durably(path: Path, text: str) -> None:
    """Write to a temp file beside `path`, fsync, os.replace, fsync the directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk must not stay full of it (a kill: remove_leftovers)
            tmp.unlink()
        raise
    fsync_path(path.parent)


def _unguarded() -> None:
    """No lock to confirm: a catalog opened outside a run (reading, planning)."""
