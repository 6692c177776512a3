"""Where a dataset is read from, asked the same way for a published dataset (its current version) and
an external input (its path): a Location names the place, how to reach it, and the version when
hybridflow published it. Readers branch on what the data is (a table, a folder of files), not on
who put it there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from ..data import storage

if TYPE_CHECKING:
    from ..data.stores import Settings
    from .catalog import Version


@dataclass(frozen=True)
class Location:
    """`path`: the published version's folder or the external input's path (None: a dataset no run
    has published yet); `store`: how to reach it (None: on this machine); `version`: the version
    published, None for an external input."""

    dataset: str
    path: PurePath | None
    store: Settings | None = None
    version: Version | None = None
    external: bool = False

    @property
    def found(self) -> bool:
        """There is something to read: an external path (checked when read) or a published version."""
        return self.path is not None

    @property
    def filesystem(self):
        """pyarrow's filesystem to reach `path` with: None for a local path."""
        return self.store.arrow_filesystem() if self.store is not None else None

    @property
    def uri(self) -> str:
        return storage.uri_of(self.path) if self.path is not None else ""


def external(dataset: str, path: PurePath, store: Settings | None) -> Location:
    return Location(dataset, path, store, external=True)


def published(dataset: str, version: Version | None) -> Location:
    if version is None:
        return Location(dataset, None)
    return Location(dataset, version.directory, version.store, version)
