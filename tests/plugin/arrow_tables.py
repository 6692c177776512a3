"""A tiny third-party engine, as a package outside hybridflow would write one: stages get and return
pyarrow Tables, in hybridflow's own process. Registered through the `hybridflow.backends` entry point
group by tests/runs/test_engine_plugin.py, exactly as an installed package would be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import Field

from hybridflow.backends import Engine
from hybridflow.backends.base import Backend
from hybridflow.data.tables import TableSource, read_arrow, write_arrow
from hybridflow.settings import Section


class ArrowSettings(Section):
    threads: int = Field(1, ge=1, description="how many threads pyarrow may use")


ENGINE = Engine(name="arrow", module=__name__, settings=ArrowSettings, frame_types="pyarrow.Table",
                description="pyarrow Tables in hybridflow's process", starts=False,
                result_settings=lambda settings: {"arrow_threads": settings.threads})


class ArrowBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types

    def __init__(self, settings: ArrowSettings | None) -> None:
        self.settings = settings or ArrowSettings()

    def start(self, code=()) -> None:
        pa.set_cpu_count(self.settings.threads)

    def read(self, source: TableSource) -> pa.Table:
        return read_arrow(source)

    def is_frame(self, value: Any) -> bool:
        return isinstance(value, pa.Table)

    def write_files(self, frame: pa.Table, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        return write_arrow(frame, directory, partition_by, target_file_size)


def create(settings, log_dir: Path) -> ArrowBackend:
    return ArrowBackend(settings)
