"""Incremental stages: call the stage only for the input partitions (datums) that are new or changed,
and keep the output partitions of the unchanged ones.

A datum is one Hive-style partition of the stage's partitioned input, named by its path
("week=2026-11-16"), with a digest of its files' contents. The stage's table outputs are partitioned
by the same columns, so each output partition belongs to exactly one datum: re-processed datums
replace theirs, vanished datums lose theirs, and every other output partition is carried over.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Callable

from ..data import storage
from ..data.arrow_types import parse_arrow_type, printed_name
from ..data.hashing import HashCache, digest_of
from ..data.tables import HIVE_NULL, partition_values
from ..errors import DataError, counted
from .catalog import data_digest

if TYPE_CHECKING:  # imported where used: a skipped run never loads it
    import pyarrow as pa

# each partition column's type: a pyarrow type, or its name as a schema: declares it
Types = dict[str, "pa.DataType | str"]


def partition_key(relative: PurePosixPath | Path, partition_by: tuple[str, ...],
                  types: Types | None = None) -> str | None:
    """'week=2026-11-16' for week=2026-11-16/part-0.parquet; None for a file outside the partitions
    (the schema-only file an empty output has). Values are read in their column's type and written
    one way, so engines that spell a directory differently (month=01 or 1, f=1 or 1.0) agree."""
    values = partition_values(Path("/") / relative, Path("/"), partition_by)
    if set(values) != set(partition_by):
        return None
    return "/".join(f"{c}={_canonical(values[c], (types or {}).get(c))}" for c in partition_by)


def _canonical(raw: str | None, kind: pa.DataType | str | None) -> str:
    if raw is None or raw == "":
        return HIVE_NULL
    name = printed_name(kind) if isinstance(kind, str) else str(kind)
    if kind is None or name in ("string", "large_string"):
        return raw
    try:
        value = _parsed(raw, kind, name)
    except (ValueError, NotImplementedError):  # pyarrow's ArrowInvalid, ArrowNotImplementedError
        return raw
    return value.isoformat() if hasattr(value, "isoformat") else repr(value)


ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
INTEGER = re.compile(r"-?\d{1,18}")
SIGNED_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def _parsed(raw: str, kind: pa.DataType | str, name: str | None):
    """`raw` as a value of `kind` (`name`: what pyarrow prints for it), as pyarrow's cast reads it. The
    usual partition types (dates, integers) are read by Python where pyarrow would agree: pyarrow's
    cast imports pyarrow and pyarrow.compute, most of the time a no-op rerun of an incremental stage
    would take."""
    if name == "date32[day]" and ISO_DATE.fullmatch(raw):
        with contextlib.suppress(ValueError):
            return dt.date.fromisoformat(raw)
    bits = SIGNED_BITS.get(name)
    if bits and INTEGER.fullmatch(raw):
        value = int(raw)
        if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return value
    import pyarrow as pa

    arrow_type = parse_arrow_type(kind) if isinstance(kind, str) else kind
    return pa.array([raw], pa.string()).cast(arrow_type)[0].as_py()


def schema_types(schema: pa.Schema | None) -> Types:
    return dict(zip(schema.names, schema.types)) if schema is not None else {}


def external_datums(path: PurePath, partition_by: tuple[str, ...], cache: HashCache,
                    types: Types | None = None, filesystem=None) -> dict[str, str]:
    """{partition key: digest} of an external partitioned parquet directory (local, or a prefix in
    object storage reached through `filesystem`)."""
    groups: dict[str, list] = {}
    for file in storage.files_under(path, filesystem):
        if file.suffix != ".parquet":
            continue
        key = partition_key(file.relative_to(path), partition_by, types)
        if key is not None:  # names left out: engines pick them at random
            groups.setdefault(key, []).append(("", cache.content(file, filesystem)))
    return {key: digest_of(files) for key, files in groups.items()}


def version_datums(manifest: dict, partition_by: tuple[str, ...], types: Types | None = None) -> dict[str, str]:
    """{partition key: digest} of a published version, from the hashes its manifest holds."""
    groups: dict[str, list] = {}
    for entry in manifest["files"]:
        relative = PurePosixPath(entry["path"])
        key = partition_key(relative, partition_by, types)
        if key is not None and relative.suffix == ".parquet":
            groups.setdefault(key, []).append(("", data_digest(entry)))
    return {key: digest_of(files) for key, files in groups.items()}


@dataclass(frozen=True)
class DatumChanges:
    changed: tuple[str, ...]  # new or with different content: the stage is called for these
    removed: tuple[str, ...]  # gone from the input: their output partitions are dropped
    unchanged: tuple[str, ...]  # their output partitions are carried over

    @property
    def any(self) -> bool:
        return bool(self.changed or self.removed)

    def describe(self, dataset: str) -> str:
        total = len(self.changed) + len(self.unchanged)
        parts = []
        if self.changed:
            shown = ", ".join(self.changed[:3]) + (", ..." if len(self.changed) > 3 else "")
            parts.append(f"{len(self.changed)} of {counted(total, 'partition')} of {dataset} new or changed ({shown})")
        if self.removed:
            parts.append(f"{counted(len(self.removed), 'partition')} of {dataset} removed")
        return "; ".join(parts) or f"no partition of {dataset} changed"


def compare(previous: dict[str, str], current: dict[str, str]) -> DatumChanges:
    changed = tuple(sorted(k for k, v in current.items() if previous.get(k) != v))
    removed = tuple(sorted(k for k in previous if k not in current))
    unchanged = tuple(sorted(k for k, v in current.items() if previous.get(k) == v))
    return DatumChanges(changed, removed, unchanged)


def carry_over(output: str, staging: PurePath, previous_manifest: dict, changes: DatumChanges,
               partition_by: tuple[str, ...], types: Types, bring: Callable[[list[PurePosixPath], PurePath], None],
               filesystem=None) -> None:
    """Complete a staged incremental output with the previous version's partitions of unchanged datums.

    `staging` is local, or a prefix in object storage reached through `filesystem`; `bring(relative_paths,
    staging)` puts those files of the previous version there: the workdir's layout knows how (a local
    one hard-links its immutable files, an object store copies them without moving the data)."""
    def staged() -> list[PurePosixPath]:
        return [PurePosixPath(f.relative_to(staging).as_posix())
                for f in storage.files_under(staging, filesystem) if f.suffix == ".parquet"]

    processed = set(changes.changed)
    for relative in staged():
        key = partition_key(relative, partition_by, types)
        if key is not None and key not in processed:
            raise DataError(f"incremental output '{output}' has partition {key}, which is not one of the input "
                            f"partitions this run processed ({', '.join(sorted(processed)) or 'none'})",
                            hint="an incremental stage must write each row into the partition of the input "
                                 "partition it came from")
    keep = set(changes.unchanged)
    kept = [PurePosixPath(entry["path"]) for entry in previous_manifest["files"]
            if partition_key(PurePosixPath(entry["path"]), partition_by, types) in keep]
    bring(kept, staging)
    files = staged()
    if any(partition_key(f, partition_by, types) for f in files):
        # the schema-only file of an empty write is not needed beside real partitions
        for relative in files:
            if len(relative.parts) == 1:
                storage.remove_file(staging / relative.as_posix(), filesystem)
