"""Where a pipeline's workdir lives, decided in one place: on this machine, or in object storage
(with this machine's cache of it). A workspace is made once per run (or per command) and hands out
what lives there: the catalog, the run lock (with the lease in object storage), the run store,
the cluster records; in object storage all of them share its one store client. It also answers
where each dataset is read from (`locate`), published or external alike.

Layout (unchanged): <workdir>/runs.db, and per pipeline <workdir>/<pipeline>/ holding its datasets,
runs/, clusters/, run.lock; in object storage <workdir>/runs/<run>.json, <workdir>/<pipeline>/CURRENT,
datasets/, clusters/ and the lease, and the local cache holds runs.db, staging, logs and run.lock.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import locations, runsync
from .catalog import Catalog
from .clusterrecords import FOLDER, LocalRecords, ObjectRecords
from .locations import Location
from .lock import LEASE, Lease, PipelineLock, RunLock
from .objectcatalog import ObjectCatalog, gc_grace
from .state import RunStore

KEY = ".fingerprint-key"  # in the workdir: see fingerprint_key()

if TYPE_CHECKING:
    from ..data.objectstore import ObjectStore
    from ..data.storage import ObjectPath
    from ..data.stores import Settings


class Workspace:
    """A workdir: `local` on this machine (in object storage: its cache here), `remote` its place in
    object storage or None, `settings` how that store is reached; `pipeline` the pipeline it is
    opened for (None: a workdir named alone, whose run records only are read)."""

    def __init__(self, local: Path, remote: ObjectPath | None = None, settings: Settings | None = None,
                 pipeline: Any = None) -> None:
        self.local, self.remote, self.settings, self.pipeline = local, remote, settings, pipeline
        self._catalog: Catalog | None = None

    @classmethod
    def of(cls, pipeline) -> Workspace:
        """The pipeline's workdir, as its file names it."""
        return cls(pipeline.workdir, pipeline.remote, pipeline.store if pipeline.remote is not None else None,
                   pipeline)

    @classmethod
    def named(cls, workdir: str) -> Workspace:
        """A workdir named alone (`hybridflow runs -w ...`): a folder here, or an object-storage URI
        reached with its store's standard variables."""
        from ..data.storage import is_object_uri, object_path, settings_for
        from ..definition.config import local_cache

        if not is_object_uri(workdir):
            return cls(Path(workdir))
        remote = object_path(workdir)
        settings = settings_for(remote)
        return cls(local_cache(remote, os.environ, settings.endpoint), remote, settings)

    @functools.cached_property
    def objects(self) -> ObjectStore:
        """The one store client of a workdir in object storage, made when first needed."""
        return self.settings.objects()

    @property
    def shared_folder(self) -> Path | None:
        """The folder a cluster on other hosts must see: a local workdir (None in object storage, which
        the cluster's workers reach themselves)."""
        return self.local if self.remote is None else None

    @property
    def home(self) -> Path:
        """The pipeline's folder on this machine: its datasets, or its cache of them; its runs' logs."""
        return self.local / self.pipeline.name

    def catalog(self) -> Catalog:
        """The pipeline's datasets: in its local workdir, or in its workdir in object storage (one
        catalog per workspace: its commits and their journal are the run's)."""
        if self._catalog is None:
            self._catalog = Catalog(self.home) if self.remote is None else \
                ObjectCatalog(self.home, self.remote / self.pipeline.name, self.objects, gc_grace(self.pipeline))
        return self._catalog

    def locate(self, dataset: str) -> Location:
        """Where `dataset` is read from now: an external input's path, or the current version published
        (in object storage, a read of CURRENT: a run keeps what it located until it commits there)."""
        if self.pipeline.is_external(dataset):
            path = self.pipeline.external_path(dataset)
            return locations.external(dataset, path, self.pipeline.store_of(path))
        return locations.published(dataset, self.catalog().current(dataset))

    def lock(self) -> PipelineLock:
        """The pipeline's run lock: the kernel lock here, and the lease in object storage."""
        lease = None if self.remote is None else Lease(self.objects, self.remote / self.pipeline.name / LEASE)
        return PipelineLock(RunLock(self.home / "run.lock"), lease)

    def cluster_records(self) -> LocalRecords | ObjectRecords:
        if self.remote is None:
            return LocalRecords(self.home / FOLDER, self.pipeline.redact)
        return ObjectRecords(self.objects, self.remote / self.pipeline.name / FOLDER, self.pipeline.redact)

    def fingerprint_key(self) -> tuple[Path, Callable[[str], str] | None]:
        """Where this machine keeps the key that fingerprints secret params, and, for a workdir in
        object storage, how it is agreed with every other machine: <workdir>/.fingerprint-key there,
        made by the first machine that needs one (create-only), so their fingerprints agree."""
        if self.remote is None:
            return self.local / KEY, None

        def agree(mine: str) -> str:
            from ..data.objectstore import Conflict

            found, _ = self.objects.read_json(self.remote / KEY)
            if found is None:
                try:
                    self.objects.write_json(self.remote / KEY, {"key": mine}, create_only=True)
                    return mine
                except Conflict:
                    found, _ = self.objects.read_json(self.remote / KEY)
            return found["key"]

        return self.local / KEY, agree

    def local_run_store(self) -> RunStore:
        """The runs.db on this machine alone: nothing is read from object storage for it."""
        return RunStore(self.local / "runs.db")

    def run_store(self, newest: int = 1) -> RunStore:
        """The workdir's runs.db, with the records in object storage added (the `newest` of the
        pipeline's that this machine has not seen finished; older ones when asked for)."""
        store = self.local_run_store()
        if self.remote is not None:
            records = runsync.RemoteRecords(store, self.objects, self.remote, self.local)
            records.pull(newest, self.pipeline.name if self.pipeline is not None else None)
            store.fetch_missing = records.fetch_matching
        return store

    def recorded_runs(self, newest: int = 1) -> RunStore | None:
        """The run store, or None where no run was ever recorded: a local workdir without a runs.db
        (opening one would make the workdir)."""
        if self.remote is None and not (self.local / "runs.db").exists():
            return None
        return self.run_store(newest)

    def require_trusted(self) -> None:
        """A workdir in object storage is used only once its store is known to honour conditional
        writes (storecheck.py); a local one has nothing to check."""
        if self.remote is not None:
            from .storecheck import require_trusted

            require_trusted(self.objects, self.remote)

    def push(self, store: RunStore, run_id: str, run_dir: Path | None = None) -> None:
        """A run's record (and its directory of logs and report, when given) into the workdir in
        object storage; nothing to do for a local one."""
        if self.remote is not None:
            runsync.push(self.objects, self.remote, store, self.pipeline.name, run_id, run_dir)

    def fetch_run_dir(self, run: dict) -> None:
        """A run's logs and report from the workdir in object storage into this machine's cache,
        where the run was made on another machine; a local workdir has them already."""
        if self.remote is not None:
            runsync.fetch_run_dir(self.objects, self.remote, run)

    def published_by(self, run: dict) -> Catalog | None:
        """The catalog a recorded run published to, for its report (None: its local workdir's)."""
        if self.remote is None:
            return None
        return ObjectCatalog(Path(run["run_dir"]).parent.parent, self.remote / run["pipeline"], self.objects)
