"""A loaded, checked pipeline: the spec plus everything resolved against the file system."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path, PurePath
from typing import Any

from ..data.storage import ObjectPath, is_object_uri, object_path, settings_for
from ..data.stores import Settings
from . import runvalues
from .dag import Dag
from .model import DatasetSpec, PipelineSpec, StageSpec
from .yamlsource import SourceMap

REDACTED = "***"


@dataclass
class Pipeline:
    spec: PipelineSpec
    file: Path  # absolute path of the YAML file
    root: Path  # absolute; relative paths and stage modules resolve against it
    workdir: Path  # absolute
    source: SourceMap
    secrets: frozenset[str] = frozenset()  # values that came from ${env:...}: never printed or stored
    overrides: dict[str, Any] = field(default_factory=dict)  # --param key=value
    stage_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # --param stage.key=value
    param_args: tuple[str, ...] = ()  # the --param strings as given: what a run records for --resume
    # a workdir in object storage (bucket/prefix): the truth of versions, pointers, run records and the
    # lease; `workdir` is then this machine's cache of it (logs, staging, a copy of the run records)
    remote: ObjectPath | None = None
    # the time the run is for (set by the run; None: now, to the minute) and what its calendar noted:
    # the ticks it caught up or that were missed (ops/calendar.py)
    scheduled_for: datetime | None = None
    calendar: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def stages(self) -> dict[str, StageSpec]:
        return self.spec.stages

    @property
    def zone(self) -> str:
        """The time zone the pipeline's calendar is in: its schedule's, else UTC."""
        return self.spec.schedule.timezone if self.spec.schedule is not None else "UTC"

    def run_moment(self) -> datetime:
        return self.scheduled_for or runvalues.this_minute(self.zone)

    @property
    def run_values(self) -> dict[str, str]:
        """What ${run.NAME} stands for in params and dataset paths."""
        return runvalues.values(self.run_moment())

    @cached_property
    def dag(self) -> Dag:
        return Dag({n: s.inputs for n, s in self.stages.items()}, {n: s.outputs for n, s in self.stages.items()})

    def engine_settings(self, engine: str):
        """The pipeline's `backends.<engine>` section, as the engine's settings model made it (every
        registered engine has one, set or defaulted); None for a name no engine is registered under."""
        return getattr(self.spec.backends, engine, None)

    def dataset(self, name: str) -> DatasetSpec:
        """A dataset's declaration; undeclared datasets are parquet tables in the workdir."""
        return self.spec.datasets.get(name) or DatasetSpec()

    def is_external(self, name: str) -> bool:
        return name not in self.dag.producer

    def external_path(self, name: str) -> PurePath:
        """Where an external input lives: a local path (relative ones under root), or an ObjectPath
        for an s3:// URI."""
        path = runvalues.substitute(self.dataset(name).path or "", self.run_values)
        return object_path(path) if is_object_uri(path) else (self.root / path).resolve()

    @cached_property
    def store(self) -> Settings:
        """How this pipeline reaches object storage: the store its workdir (else its first input in
        object storage) names, with its storage: section over that store's standard variables."""
        section = self.spec.storage.model_dump(exclude_none=True) if self.spec.storage else None
        settings = settings_for(self.store_uri, section)
        settings.adopt_checksum_policy()  # before any engine starts its workers (they inherit it)
        return settings

    @property
    def store_uri(self) -> str:
        """The object-storage URI whose store the pipeline reaches (s3:// when it names none)."""
        named = [ds.path for ds in self.spec.datasets.values() if is_object_uri(ds.path)]
        return self.remote.uri if self.remote is not None else named[0] if named else "s3://"

    @property
    def uses_object_storage(self) -> bool:
        """The workdir, or an input a stage reads, is in object storage."""
        return self.remote is not None or any(is_object_uri(ds.path) for ds in self.spec.datasets.values())

    def store_of(self, path: PurePath) -> Settings | None:
        """How to reach `path`: None for a local path."""
        return self.store if isinstance(path, ObjectPath) else None

    def filesystem_of(self, path: PurePath):
        """pyarrow's filesystem to reach `path` with: None for a local path."""
        return self.store.arrow_filesystem() if isinstance(path, ObjectPath) else None

    @property
    def shown_file(self) -> str:
        """The pipeline file as a command line should name it: relative to the current directory when
        it is under it (what `hybridflow run ... --resume` and the hints print)."""
        try:
            return str(self.file.relative_to(Path.cwd()))
        except ValueError:
            return str(self.file)

    def params_for(self, stage: str) -> dict[str, Any]:
        """Pipeline params < stage params < --param key=value < --param stage.key=value."""
        params = {**self.spec.params, **self.stages[stage].params, **self.overrides,
                  **self.stage_overrides.get(stage, {})}
        return runvalues.substitute(params, self.run_values) if "${run." in repr(params) else params

    def secret_sources(self, environ) -> dict[str, str]:
        """Each secret -> the name of an environment variable that holds it in `environ`, one the
        pipeline file refers to as ${env:NAME} first (two variables may hold the same value)."""
        try:
            named = set(re.findall(r"\$\{env:(\w+)\}", self.file.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            named = set()
        sources: dict[str, str] = {}
        for name, value in sorted(environ.items(), key=lambda item: (item[0] not in named, item[0])):
            if value in self.secrets:
                sources.setdefault(value, name)
        return sources

    def redact(self, text: str) -> str:
        return self.redact_with(self.secrets)(text)

    @staticmethod
    def redact_with(secrets):
        # each secret as written, and as JSON spells it inside a string (a value dumped before it is
        # redacted: quotes, backslashes and non-ASCII escaped)
        spelled = {form for secret in secrets if secret
                   for form in (secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1])}
        ordered = sorted(spelled, key=len, reverse=True)  # a secret containing another goes first

        def redact(text: str) -> str:
            for secret in ordered:
                text = text.replace(secret, REDACTED)
            return text

        return redact
