"""A stage's inputs: where each comes from (the workspace locates it), read as the
engine's frame, counted (rows and bytes, from manifests and footers, never the data), and named by
the version the stage used (what its outputs' manifests record)."""

from __future__ import annotations

import shutil
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from ..data import storage
from ..data.contract import check_schema, declared_schema
from ..data.copies import Copy
from ..data.footers import Footers, read_footers
from ..data.tables import TableSource, parquet_files
from ..data.textfiles import input_schema, text_files
from ..definition.datachecks import dataset_checks
from ..definition.pipeline import Pipeline
from ..errors import DataError, HybridflowError, first_line
from ..store.incremental import partition_key, schema_types
from ..store.locations import Location
from .stopping import Terminated

if TYPE_CHECKING:
    from ..store.workspace import Workspace


class StageInputs:
    """The inputs of a run's stages, each read from where the workspace locates it. A location is
    looked up once (for a published input in object storage, a read of CURRENT) until a stage of
    this run commits that dataset: the version a stage counts, reads and records is one. External
    Parquet footers are read once per run: a stage counts its rows from them before it reads the
    input, and several stages may read one input."""

    def __init__(self, workspace: Workspace, planner) -> None:
        self.workspace = workspace
        self.pipeline: Pipeline = workspace.pipeline
        self.planner = planner  # for the content digest of an external input
        self._footers: dict[str, Footers] = {}
        self._located: dict[str, Location] = {}

    def forget(self) -> None:
        """A new run: external inputs may have changed since the last one, and so may what is published."""
        self._footers.clear()
        self._located.clear()

    def committed(self, datasets) -> None:
        """These datasets' versions may have changed (a commit of this run, whole or not): located again."""
        for dataset in datasets:
            self._located.pop(dataset, None)

    def locate(self, dataset: str) -> Location:
        if dataset not in self._located:
            self._located[dataset] = self.workspace.locate(dataset)
        return self._located[dataset]

    def read(self, dataset: str, backend, partitions: set[str] | None = None) -> Any:
        """An input as the engine's frame; `partitions`: read only these (incremental stages). The
        engine reads the files itself: only footers and first blocks are read here."""
        location = self.locate(dataset)
        if self.pipeline.dataset(dataset).kind == "files":
            # a folder: an external one in object storage as its URI (for the stage's own client), a
            # published one also from object storage (downloaded once)
            if location.external:
                return location.path if location.store is None else location.uri
            return self.workspace.catalog().local_copy(location.version)
        source = self.table_for(dataset, backend, partitions)
        try:
            return backend.read(source)
        except (KeyboardInterrupt, Terminated, HybridflowError):
            raise
        except Exception as exc:
            raise DataError(f"{backend.name} cannot read input '{dataset}': {first_line(exc)}") from exc

    def table_for(self, dataset: str, backend, partitions: set[str] | None = None) -> TableSource:
        """A located table as `backend` reads it (`partitions`: only these): where the engine has no
        way of its own to the store, from a copy on this machine (of the whole input: one copy per
        content, whichever partitions a stage reads)."""
        location = self.locate(dataset)
        copied = backend.local_copies and location.store is not None
        if location.external and not copied:
            return self.external_source(dataset, partitions)
        source = self.external_source(dataset) if location.external else location.version.source()
        if copied:
            source = self._copied(location, source)
        return source if partitions is None else only_partitions(source, partitions)

    def _copied(self, location: Location, source: TableSource) -> TableSource:
        """`source` as a copy on this machine. Only the newest is kept: a copy of a version replaces the
        copies of the dataset's earlier versions (gc removes those of versions it deletes), a copy of a
        new delivery of an external input the copies of its earlier ones."""
        copy = Copy(source, listed=location.external)
        copies = self.workspace.catalog().home / "copies" / location.dataset
        folder = copies / "external" / copy.name() if location.external else \
            copies / location.version.id / copy.name()
        if not folder.is_dir():
            for older in folder.parent.parent.glob("[!.]*"):  # never another process's partial copy
                if older != folder.parent:
                    shutil.rmtree(older, ignore_errors=True)
            for older in folder.parent.glob("[!.]*"):
                shutil.rmtree(older, ignore_errors=True)
        return copy.into(folder)

    def external_source(self, dataset: str, partitions: set[str] | None = None) -> TableSource:
        """An external table as engines read it, checked against its declared schema from what
        costs no data: Parquet footers, the first block of each text file."""
        import pyarrow as pa

        ds = self.pipeline.dataset(dataset)
        location = self.locate(dataset)
        path, store, filesystem = location.path, location.store, location.filesystem
        declared = declared_schema(ds.schema_)
        schema = pa.schema(list(declared.items())) if declared else None
        if ds.format == "parquet":
            footers = self.external_footers(dataset)  # one clear error for a bad file, whichever engine reads
            if declared:
                # partition columns live in the paths: the footers answer for the others
                in_files = pa.schema([f for f in footers.schema if f.name not in ds.partition_by])
                check_schema(dataset, {k: v for k, v in declared.items() if k not in ds.partition_by}, in_files)
            source = TableSource(dataset, (path,), ds.format, schema, tuple(ds.partition_by), path, store)
            if partitions is not None:
                source = only_partitions(source, partitions, [f for f in storage.files_under(path, filesystem)
                                                              if f.suffix == ".parquet"])
            return source
        files = text_files(path, ds.format, filesystem)
        schema = input_schema(dataset, files, ds.format, schema, filesystem)
        return TableSource(dataset, tuple(files), ds.format, schema, (), path, store)

    def size(self, datasets: list[str]) -> tuple[int | None, int | None]:
        """Rows and bytes a stage reads: from manifests; an external input counts its bytes only."""
        rows, size = 0, 0
        for dataset in datasets:
            location = self.locate(dataset)
            if location.external:
                filesystem = location.filesystem
                size += sum(storage.size_of(f, filesystem) for f in storage.files_under(location.path, filesystem))
                ds = self.pipeline.dataset(dataset)
                countable = ds.kind == "table" and ds.format == "parquet"
                rows = None if rows is None or not countable else rows + self.external_footers(dataset).rows
            else:
                size += location.version.bytes
                rows = None if rows is None or location.version.rows is None else rows + location.version.rows
        return rows, size

    def external_footers(self, dataset: str) -> Footers:
        """An external Parquet input's footers, checked; read once per run (a stage counts its rows
        from them before it reads the input, and several stages may read one input)."""
        if dataset not in self._footers:
            location = self.locate(dataset)
            files = parquet_files(TableSource(dataset, (location.path,), store=location.store))
            # the newest values freshness checks ask for, where the statistics tell them (footerchecks)
            newest = [c.columns[0] for c in dataset_checks(self.pipeline, dataset) if c.kind == "freshness"]
            self._footers[dataset] = read_footers(dataset, files, location.filesystem, newest)
        return self._footers[dataset]

    def version_of(self, dataset: str) -> str:
        """The version a stage read, as its outputs' manifests record it: an external input's content
        digest (the one the stage's fingerprint used)."""
        location = self.locate(dataset)
        if location.external:
            return f"external:{self.planner.input_digest(dataset)[:16]}"
        return location.version.id if location.version else "unknown"

    def paths(self, dataset: str) -> list[PurePath]:
        location = self.locate(dataset)
        return [location.path] if location.found else []


def only_partitions(source: TableSource, partitions: set[str], files: list[PurePath] | None = None) -> TableSource:
    """The same dataset restricted to some of its partitions (by partition key, e.g. 'week=2026-11-16')."""
    base = source.base or source.files[0]
    types = schema_types(source.schema)
    chosen = tuple(f for f in (files if files is not None else source.files)
                   if partition_key(f.relative_to(base), source.partition_by, types) in partitions)
    return TableSource(source.name, chosen, source.format, source.schema, source.partition_by, base,
                       source.store)
