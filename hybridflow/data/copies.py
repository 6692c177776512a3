"""Local copies of tables in object storage, for an engine with no way of its own to the store (Spark
and az://): the files are downloaded once into a folder whose name says which content it holds (a
published version's id, an external input's content digest), and the engine reads them there as
from a local workdir."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePath

from .tables import TableSource, parquet_files


def local_source(source: TableSource, folder: Path) -> TableSource:
    """`source` read from `folder`, its files downloaded there first unless a copy is there already;
    the same relative layout (partition folders) under it."""
    files = parquet_files(source) if source.format == "parquet" else list(source.files)
    base = source.base or source.files[0]
    if any(file == base for file in files):  # a file named alone: its folder holds it
        base = base.parent
    if not folder.is_dir():
        _download(source, files, base, folder)
    local = tuple(folder / file.relative_to(base).as_posix() for file in files)
    return TableSource(source.name, local, source.format, source.schema, source.partition_by, folder)


def _download(source: TableSource, files: list[PurePath], base: PurePath, folder: Path) -> None:
    """The files into `folder`, whole or not at all: a copy cut short is never read as one."""
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        source.store.objects().download(files, base, partial)
        os.rename(partial, folder)
    except OSError:
        if not folder.is_dir():  # another process's copy, made meanwhile, is as good
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
