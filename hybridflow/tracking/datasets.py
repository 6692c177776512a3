"""A dataset as trackers name it: where it lives (a namespace and a name, by OpenLineage's naming:
`file` and the absolute path, or `s3://bucket` and the key), the version a stage read or wrote, and
its Arrow schema, rows and bytes when it is a published table."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePath

from ..data.storage import ObjectPath
from ..definition.datachecks import quarantine_of
from ..store.catalog import data_digest


@dataclass(frozen=True)
class TrackedDataset:
    dataset: str  # the pipeline's name for it
    namespace: str
    name: str
    version: str | None = None  # hybridflow's version id (content-derived); None for an external input
    fields: tuple[tuple[str, str], ...] = ()  # (column, Arrow type) of a table
    rows: int | None = None
    bytes: int | None = None
    kind: str = "table"
    digest: str | None = None  # of the version's data: the sha256 of its files' data digests (32 hex)
    checks: tuple[dict, ...] = ()  # the outcomes of the dataset's data checks on this version

    @property
    def uri(self) -> str:
        return f"{self.namespace}/{self.name.lstrip('/')}" if self.namespace != "file" else f"file://{self.name}"


def location(path: PurePath) -> tuple[str, str]:
    """(namespace, name) of a local path or an object in object storage."""
    if isinstance(path, ObjectPath):
        return f"{path.scheme}://{path.bucket}", "/".join(path.parts[1:]) or "/"
    return "file", str(path)


def tracked(pipeline, catalog, dataset: str, version_id: str | None = None) -> TrackedDataset:
    """`dataset` as a tracker sees it: a published one at `version_id` (default: its current version),
    an external input at its path."""
    if pipeline.is_external(dataset) and not quarantine_of(pipeline, dataset):
        namespace, name = location(pipeline.external_path(dataset))
        return TrackedDataset(dataset, namespace, name, kind=pipeline.dataset(dataset).kind)
    version = catalog.version(dataset, version_id) if version_id else catalog.current(dataset)
    if version is None:
        return unpublished(pipeline, catalog, dataset)
    namespace, name = location(version.directory.parent.parent)  # <datasets>/<name>/versions/<id>
    kind = version.manifest.get("kind", "table")
    schema = version.schema if kind == "table" else None
    fields = tuple((f.name, str(f.type)) for f in schema) if schema is not None else ()
    digest = hashlib.sha256("".join(data_digest(f) for f in version.manifest["files"]).encode()).hexdigest()[:32]
    # a quarantine's manifest repeats its dataset's checks: they judged that dataset, not the rejected rows
    checks = () if quarantine_of(pipeline, dataset) else tuple(version.manifest.get("checks") or ())
    return TrackedDataset(dataset, namespace, name, version.id, fields, version.rows, version.bytes, kind, digest,
                          checks)


def unpublished(pipeline, catalog, dataset: str) -> TrackedDataset:
    """A produced dataset at its place, with no version (a stage that failed published none)."""
    namespace, name = location(catalog.dataset_dir(dataset))
    return TrackedDataset(dataset, namespace, name, kind=pipeline.dataset(dataset).kind)


def read_versions(catalog, output_versions: dict[str, str]) -> dict[str, str]:
    """The input versions behind a stage's outputs, as their manifests recorded them."""
    found: dict[str, str] = {}
    for name, version_id in output_versions.items():
        try:
            found.update(catalog.version(name, version_id).manifest.get("inputs") or {})
        except Exception:  # noqa: BLE001 - a version collected meanwhile: the current one is named instead
            continue
    return found
