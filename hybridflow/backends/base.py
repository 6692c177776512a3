"""The one interface every engine implements. It moves data and manages a lifecycle; it never
abstracts DataFrame operations: stage code is written against the engine's own API."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..tables import TableSource


class Backend(ABC):
    name: str
    frame_types: str  # what stages on this engine return, in words, for error messages

    @abstractmethod
    def start(self) -> None:
        """Start the engine, or attach to the cluster the settings name. Called once, on first use."""

    @abstractmethod
    def read(self, source: TableSource) -> Any:
        """A dataset as this engine's native frame."""

    @abstractmethod
    def write(self, frame: Any, directory: Path) -> pa.Schema:
        """Write a native frame as Parquet files into an empty staging directory; returns its Arrow schema."""

    def is_frame(self, value: Any) -> bool:
        """Whether a stage's return value is a frame this engine can write."""
        return True

    def handles(self) -> dict[str, Any]:
        """Engine objects exposed on ctx (ctx.spark, ctx.dask, ctx.ray)."""
        return {}

    def stop(self) -> None:
        """Stop what this backend started (never an attached cluster). Safe to call twice."""
