"""Local copies of tables in object storage, for an engine with no way of its own to the store (Spark
and az://): the files are downloaded once into a folder whose name says which content it holds (a
published version's id, or what a listing says of an external input's files: their paths, sizes and
tags), and the engine reads them there as from a local workdir."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path, PurePath

from ..errors import DataError
from .storage import uri_of
from .tables import TableSource, parquet_files


class Copy:
    """What a copy of `source` holds: its files (the data files of a folder named as its input), the
    folder they are relative to, and, for an external input, what the store says of each now."""

    def __init__(self, source: TableSource, listed: bool, objects=None) -> None:
        """listed: what the store says of each file now is part of the copy's name (an external
        input's); objects: the store client to download with (by default one made for `source`)."""
        self.source = source
        self.files = parquet_files(source) if source.format == "parquet" else list(source.files)
        base = source.base or source.files[0]
        self.base = base.parent if any(file == base for file in self.files) else base  # a file named alone
        self.objects = objects or source.store.objects()
        self.sizes: dict[PurePath, int] | None = None
        self.tags: list[str] = []
        if listed:
            described = {path: (size, tag) for path, size, tag in self.objects.listing(self.base)}
            self.sizes = {file: described.get(file, (None, None))[0] for file in self.files}
            self.tags = [f"{uri_of(file)} {described.get(file)}" for file in self.files]

    def name(self) -> str:
        """A digest of the files and, when listed, their sizes and tags: other content, another name."""
        return hashlib.sha256("\n".join(self.tags or [uri_of(f) for f in self.files]).encode()).hexdigest()[:16]

    def into(self, folder: Path) -> TableSource:
        """The source read from `folder`, its files downloaded there first unless a copy is there already."""
        if not folder.is_dir():
            self._download(folder)
        local = tuple(folder / file.relative_to(self.base).as_posix() for file in self.files)
        return TableSource(self.source.name, local, self.source.format, self.source.schema,
                           self.source.partition_by, folder)

    def _download(self, folder: Path) -> None:
        """The files into `folder`, whole or not at all: a copy cut short, or whose files changed while
        it was made, is never read as one."""
        partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            self.objects.download(self.files, self.base, partial)
            for file in self.files:
                got = partial / file.relative_to(self.base).as_posix()
                expected = self.sizes.get(file) if self.sizes is not None else None
                if not got.is_file() or (expected is not None and got.stat().st_size != expected):
                    raise DataError(f"{uri_of(file)} changed while it was copied to this machine",
                                    hint="run again once the delivery is complete")
            try:
                os.rename(partial, folder)
            except OSError:
                if not folder.is_dir():  # another process's whole copy of the same content is as good
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
