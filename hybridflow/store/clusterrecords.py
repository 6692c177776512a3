"""The clusters a pipeline's runs brought up, recorded in its workdir before each is brought up and
removed once it is down: what a reaper needs to take down the clusters of a run that died (a kill -9,
an OOM kill) from any machine that reaches the workdir.

Layout: <workdir>/<pipeline>/clusters/<run>-<engine>.json, in a local workdir or in object storage.
A record outlives its run: what is stored holds no value that came from ${env:...} (each store is given
the pipeline's redaction, and every record passes through it).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

FOLDER = "clusters"


class LocalRecords:
    def __init__(self, folder: Path, redact: Callable[[str], str] = lambda text: text) -> None:
        self.folder, self.redact = folder, redact

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(self.redact(json.dumps(record, indent=1, sort_keys=True)))
        os.replace(tmp, self.folder / f"{key}.json")  # a reader sees the old record or the new one

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{key}.json").unlink()

    def age(self, key: str) -> float | None:
        """Seconds since the record was last written; None when it is gone."""
        try:
            return max(0.0, time.time() - (self.folder / f"{key}.json").stat().st_mtime)
        except FileNotFoundError:
            return None

    def all(self) -> dict[str, dict[str, Any]]:
        found = {}
        for file in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):  # removed meanwhile, or damaged by hand
                found[file.stem] = json.loads(file.read_text())
        return found


class ObjectRecords:
    def __init__(self, objects, prefix, redact: Callable[[str], str] = lambda text: text) -> None:
        self.objects, self.prefix = objects, prefix  # an objectstore.ObjectStore, a storage.ObjectPath
        self.redact = redact

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.objects.write_json(self.prefix / f"{key}.json", json.loads(self.redact(json.dumps(record))))

    def delete(self, key: str) -> None:
        self.objects.delete(self.prefix / f"{key}.json")

    def age(self, key: str) -> float | None:
        """Seconds since the record was last written, by the store's clock; None when it cannot tell."""
        return self.objects.age(self.prefix / f"{key}.json")

    def all(self) -> dict[str, dict[str, Any]]:
        found = {}
        for path in self.objects.files(self.prefix):
            record, _ = self.objects.read_json(path)
            if isinstance(record, dict):
                found[path.name.removesuffix(".json")] = record
        return found
