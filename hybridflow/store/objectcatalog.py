"""A pipeline's datasets in object storage: the same versions and manifests as a local workdir, made
current without a rename.

Layout under <workdir>/<pipeline>/ (s3://bucket/prefix/<pipeline>/):
    datasets/<name>/versions/<version>/   data files, then _manifest.json (written create-only, last)
    CURRENT                               {"datasets": {name: version}}: the one commit point

Engines that can reach the store themselves (Spark, Dask, Ray: their workers may be on other hosts,
which share no disk with the runner) write each output straight under its version's own prefix, which
no reader looks at; hybridflow lists what they wrote (sizes and ETags from the listing, schemas and
row counts from the footers: no file is read back) and checks it against the contract. Engines that
run in the runner's own process write a local staging directory, which is checked and uploaded. Either
way the manifest is written last, create-only, and the outputs are made current together by one
compare-and-swap of CURRENT (If-Match its ETag; If-None-Match: * for the first commit). A reader
follows CURRENT to a manifest and the manifest to the files: it never lists a prefix, so a run
killed at any moment leaves each dataset at its old version or its new one, and what it uploaded
without committing is garbage that gc removes. A compare-and-swap that fails means another writer
committed meanwhile (the run's lease was lost): this run publishes nothing and says so.

Every manifest, commit of CURRENT and collection first confirms the run's lease (`confirm`, set by
whoever holds it): a run paused past its lease (SIGSTOP, a suspended VM, a long store outage) may find
another runner took it meanwhile, and what that runner's gc removed must never become current. Gc
also spares a version without a manifest written less than the grace period ago (GC_GRACE_ENV, never
less than the longest stage timeout): a writer slower than its lease is not deleted under it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePath, PurePosixPath

from ..data import untrusted
from ..data.copies import Copy
from ..data.objectstore import Conflict, ObjectStore
from ..data.storage import ObjectPath
from ..data.tables import TableSource
from ..errors import ConfigError, DataError, LockedError
from . import faults
from .catalog import MANIFEST, Catalog, Version, describe_version, read_footer
from .workdir import remove_leftovers

POINTER = "CURRENT"
GC_GRACE_SECONDS = 24 * 3600.0  # a version without a manifest is garbage only once left this long
GC_GRACE_ENV = "HYBRIDFLOW_GC_GRACE_SECONDS"
STALE_UPLOADS = timedelta(days=1)  # an incomplete multipart upload this old has no writer left
# what engines leave beside their data files: markers and checksums, not data
NOT_DATA = ("_SUCCESS", "_common_metadata", "_metadata")


class ObjectCatalog(Catalog):
    def __init__(self, home: Path, remote: ObjectPath, objects: ObjectStore,
                 grace: float = GC_GRACE_SECONDS) -> None:
        super().__init__(home)  # the local cache: staging, logs
        self.remote = remote  # <workdir>/<pipeline> in the object store
        self.objects = objects  # the workspace's store client, shared with its lease and records
        self.settings = objects.settings
        self.grace = grace  # seconds: how long a version without a manifest is spared by gc
        self._manifests: dict[tuple[str, str], dict] = {}  # versions never change: read once
        # CURRENT's ETag as this run last saw it (at its start, then after each of its commits): a
        # commit against any other means another writer committed meanwhile
        self._expected: str | None = None
        self._in_run = False
        self._pending: dict[str, list[ObjectPath]] = {}  # by run: prefixes engines write, not yet versions

    def _pointer(self) -> tuple[dict[str, str], str | None]:
        found, etag = self.objects.read_json(self.remote / POINTER)
        if found is not None and not isinstance(found.get("datasets"), dict):
            raise DataError(f"the pointer object {(self.remote / POINTER).uri} is corrupt",
                            hint="restore it from the store's object versions, or delete it to start afresh")
        return (found or {}).get("datasets", {}), etag

    def current(self, name: str) -> Version | None:
        version_id = self._pointer()[0].get(name)
        return self.version(name, version_id) if version_id else None

    def version(self, name: str, version_id: str) -> Version:
        directory = self._version_dir(name, version_id)
        manifest = self._manifests.get((name, version_id))
        if manifest is None:
            manifest, _ = self.objects.read_json(directory / MANIFEST)
            if manifest is None:
                raise DataError(f"dataset '{name}' version {version_id} has no manifest at "
                                f"{(directory / MANIFEST).uri}")
            _check_files(manifest, directory / MANIFEST)
            self._manifests[(name, version_id)] = manifest
        return Version(name, version_id, directory, manifest, self.settings)

    def _version_dir(self, name: str, version_id: str) -> ObjectPath:
        return self._child(self._child(self.remote / "datasets", name) / "versions", version_id)

    def new_staging(self, run_id: str, name: str, remote: bool = False) -> PurePath:
        """Where a stage's engine writes an output: a local staging directory, or, for an engine that
        reaches the store itself (`remote`), the prefix of the version it becomes (invisible until
        committed; removed by gc if it never is)."""
        if not remote:
            return super().new_staging(run_id, name)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        directory = self._version_dir(name, f"{stamp}-{secrets.token_hex(5)}-{secrets.token_hex(2)}")
        self._pending.setdefault(run_id, []).append(directory)
        return directory

    def discard_staging(self, run_id: str | None = None) -> None:
        super().discard_staging(run_id)
        for pending in self._pending.pop(run_id, []) if run_id else []:
            self.objects.abort_uploads(pending, quiet=True)  # what an engine left half-uploaded there
            if not self.objects.exists(pending / MANIFEST):  # a version now: Publication.discard removes those
                self.objects.delete_tree(pending)

    def prepare(self, name: str, staging: PurePath, **facts) -> Version:
        if isinstance(staging, ObjectPath):
            return self._prepare_in_place(name, staging, **facts)
        manifest, _ = self._manifest(name, staging, **facts)
        version_id = manifest["version"]
        directory = self._version_dir(name, version_id)
        self.objects.upload(staging, directory)
        faults.checkpoint("publish:uploaded")
        # last, and create-only: a version with a manifest is whole, and no two writers share one
        self.confirm()
        self.objects.write_json(directory / MANIFEST, manifest, create_only=True)
        shutil.rmtree(staging, ignore_errors=True)
        faults.checkpoint("publish:moved")
        self._manifests[(name, version_id)] = manifest
        return Version(name, version_id, directory, manifest, self.settings)

    def _prepare_in_place(self, name: str, directory: ObjectPath, **facts) -> Version:
        """An output an engine wrote under its version's prefix: described from the listing and the
        footers, then made a version by its manifest."""
        listed, junk = [], []
        for path, size, etag in self.objects.listing(directory):
            relative = PurePosixPath(path.relative_to(directory).as_posix())
            hidden = any(part.startswith((".", "_")) and "=" not in part for part in relative.parts)
            (junk if hidden or relative.name in NOT_DATA else listed).append((path, relative, size, etag))
        self.objects.delete_all([path for path, *_ in junk], directory)
        files = [{"path": relative.as_posix(), "size": size, "etag": etag} for _, relative, size, etag in listed]
        parquet = [path for path, relative, _, _ in listed if relative.suffix == ".parquet"]
        footers = []
        if facts["kind"] == "table":
            with ThreadPoolExecutor(max_workers=8) as pool:
                found = list(pool.map(lambda p: read_footer(name, p, self.objects.filesystem), parquet))
            footers = [(path, rows, schema) for path, (rows, schema) in zip(parquet, found)]
        manifest = describe_version(name, directory, files, footers, **facts)
        manifest["version"] = directory.name
        faults.checkpoint("publish:uploaded")
        self.confirm()
        self.objects.write_json(directory / MANIFEST, manifest, create_only=True)
        faults.checkpoint("publish:moved")
        self._manifests[(name, directory.name)] = manifest
        return Version(name, directory.name, directory, manifest, self.settings)

    def bring(self, version: Version, files: list[PurePosixPath], into: PurePath) -> None:
        if isinstance(into, ObjectPath):  # copied inside the store: the data never comes here
            self.objects.copy([(version.directory / f.as_posix(), into / f.as_posix()) for f in files], into)
        else:
            self.objects.download([version.directory / f.as_posix() for f in files], version.directory, into)

    def local_copy(self, version: Version) -> Path:
        """A version downloaded into this machine's cache (once: versions never change), for stages
        that read a `kind: files` dataset as a folder, as they do from a local workdir."""
        every_file = TableSource(version.dataset, version.files, "files", base=version.directory, store=version.store)
        return Copy(every_file, listed=False, objects=self.objects).into(self.home / "copies" / version.dataset /
                                                                         version.id).base

    def discard(self, version: Version) -> None:
        current = self.current(version.dataset)
        if current is not None and current.id == version.id:
            raise DataError(f"refusing to discard the current version {version.id} of '{version.dataset}'")
        self.objects.delete_tree(version.directory)

    def commit_together(self, versions: list[Version]) -> None:
        """One compare-and-swap of CURRENT makes every version current at once."""
        datasets, etag = self._pointer()
        updated = {**datasets, **{v.dataset: v.id for v in versions}}
        self.confirm()
        try:
            if self._in_run and etag != self._expected:
                raise Conflict(str(self.remote / POINTER))
            # a nonce makes this commit's bytes its own: a retry whose first answer was lost knows it
            pointer = {"datasets": updated, "commit": secrets.token_hex(8)}
            self._expected = self.objects.write_json(self.remote / POINTER, pointer,
                                                     create_only=etag is None, if_match=etag)
        except Conflict:
            raise LockedError(f"another run committed to {self.remote.uri} while this one was publishing "
                              f"{', '.join(v.dataset for v in versions)}: nothing of this stage was published",
                              hint="two runners share this workdir; only one may run the pipeline at a time "
                                   "(its lease expired?): run again") from None
        faults.checkpoint("publish:committed")

    def recover(self) -> list[str]:
        """At a run's start, under its lease: nothing to finish (a commit is one write, never half
        done); CURRENT as this run finds it is what its commits expect to replace."""
        remove_leftovers(self.home)  # the local cache's
        self._expected, self._in_run = self._pointer()[1], True
        return []

    def datasets(self) -> list[str]:
        return sorted(set(self._pointer()[0]) | set(self.objects.children(self.remote / "datasets")))

    def versions(self, name: str) -> list[str]:
        return self.objects.children(self._child(self.remote / "datasets", name) / "versions")

    def collect_garbage(self, keep: int, dry_run: bool = False) -> list[tuple[str, str]]:
        """As a local workdir's, sparing each version without a manifest that was written to less than
        `grace` seconds ago (by the store's clock): it may be a slow writer's, still uploading. Then the
        incomplete multipart uploads under the workdir older than a day (a writer killed mid-upload; a
        younger one may belong to a writer still at work)."""
        removed = [(dataset, version_id) for dataset, version_id in super().collect_garbage(keep, dry_run=True)
                   if not self._young_upload(self._version_dir(dataset, version_id))]
        if not dry_run:
            self._remove_versions(removed)
            aborted = self.objects.abort_uploads(self.remote.parent, older_than=STALE_UPLOADS)
            if aborted:
                logging.getLogger("hybridflow").info("aborted %d incomplete uploads under %s", aborted,
                                                     self.remote.parent.uri)
        return removed

    def _young_upload(self, directory: ObjectPath) -> bool:
        if self.objects.exists(directory / MANIFEST):
            return False
        age = self.objects.seconds_since_written(directory)
        return age is not None and age < self.grace

    def _remove_versions(self, versions: list[tuple[str, str]]) -> None:
        for dataset, version_id in versions:
            directory = self._version_dir(dataset, version_id)
            self.confirm()  # a runner that lost its lease deletes nothing: the new holder may need it
            # the manifest first: what is left of a deletion cut short is a version without one, never read
            self.objects.delete(directory / MANIFEST)
            self.objects.delete_tree(directory)
            shutil.rmtree(self.home / "copies" / dataset / version_id, ignore_errors=True)


def _check_files(manifest, where: ObjectPath) -> None:
    """Every file a manifest read from the store names is a plain path inside its version (it becomes
    a local path in the cache, and a key to copy or delete)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise DataError(f"the manifest {where.uri} is corrupt (no list of files)",
                        hint="restore it from the store's object versions")
    for entry in files:
        untrusted.relative_file(entry.get("path"), f"the manifest {where.uri}")


def gc_grace(pipeline) -> float:
    """Seconds gc spares a version without a manifest: HYBRIDFLOW_GC_GRACE_SECONDS (default a day),
    never less than the pipeline's longest stage timeout."""
    try:
        grace = float(os.environ.get(GC_GRACE_ENV) or GC_GRACE_SECONDS)
    except ValueError:
        raise ConfigError(f"{GC_GRACE_ENV} must be a number of seconds, not {os.environ[GC_GRACE_ENV]!r}") from None
    timeouts = [stage.timeout for stage in pipeline.spec.stages.values() if stage.timeout]
    return max([grace, *timeouts])
