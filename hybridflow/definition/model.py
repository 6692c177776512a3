"""The pipeline file's model: every key a user may write, its type and its default.

This is the user-facing contract (and the source of `hybridflow schema`). Checks
that need the whole file (the graph, names, stage functions) live in `checks`.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from ..diagnostics import did_you_mean
from ..engines import DEFAULT as DEFAULT_ENGINE
from ..settings import ByteSize, GpuMode, Names, Params, Section, none_as_empty
from .tracking import DatasetMlflowSpec, LineageSpec, MlflowSpec, http_url

PIPELINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SQL_FILE = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[^:]+\.sql$")  # relative, never out of root with ..
RUN_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> float | None:
    """`90`, `90s`, `30m`, `1h30m`, `2d` -> seconds. Bare numbers are seconds."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like 30m, 1h30m")
    if isinstance(value, (int, float)) or (isinstance(value, str) and value.strip().isdigit()):
        seconds = float(value)
    else:
        text = str(value).strip().replace(" ", "")
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"'{value}' is not a duration: write e.g. 90s, 30m, 1h30m or 2d")
        seconds = sum(float(n) * _DURATION_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError("a duration must be greater than zero")
    return seconds


_DURATION_TEXT = r"^(\d+(\.\d+)?\s*(ms|s|m|h|d)\s*)+$"
Duration = Annotated[float | None, BeforeValidator(parse_duration),
                     WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string", "pattern": _DURATION_TEXT},
                                               {"type": "null"}], "description": "seconds, or e.g. 90s, 30m, 1h30m"})]
class FreeSettings(Section):
    """backends.<engine> of an engine that declares no settings model: any keys, passed on as they are."""

    model_config = ConfigDict(extra="allow")


def _registered(value: str) -> str:
    """A stage's `backend:` names the engine it runs on: a registered one (reported like any other choice
    of values)."""
    from pydantic_core import PydanticCustomError

    from ..engines import engines

    known = list(engines())
    if value not in known:
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": ", ".join(f"'{name}'" for name in known)})
    return value


EngineName = Annotated[str, AfterValidator(_registered)]


class DatasetSpec(Section):
    path: str | None = Field(None, description="external input only: where it lives, relative to root, or an "
                                               "s3:// URI (s3://BUCKET/PREFIX)")
    format: Literal["parquet", "csv", "json"] = "parquet"
    kind: Literal["table", "files"] = "table"
    schema_: Params | None = Field(None, alias="schema", description="column -> Arrow type name")
    partition_by: Names = Field(default_factory=list, description="Hive-style partition columns, e.g. [week]")
    target_file_size: ByteSize | None = Field(None, gt=0, description="bytes of Parquet per file of each version "
                                                                  "(default: the engine's setting, else 128MB)")
    checks: Annotated[list[Any], none_as_empty(list)] = Field(
        default_factory=list, description="data checks on the dataset's values, each e.g. `- not_null: [id]`, "
                                          "`- row_count: {min: 1}` with on_fail: error | warn | drop (see the guide)")
    description: str | None = None
    mlflow: DatasetMlflowSpec | None = Field(None, description="kind: files only: logged as the run's MLflow model "
                                                               "and registered (with the pipeline's mlflow:)")

    @model_validator(mode="after")
    def _mlflow_model_is_files(self) -> "DatasetSpec":
        if self.mlflow is not None and self.kind != "files":
            raise ValueError("mlflow: {model: ...} needs kind: files (the directory a stage writes its model into)")
        return self


class StorageSpec(Section):
    """How to reach object storage (s3:// paths), over the standard AWS variables and profile;
    credentials always come from those, never from the pipeline file."""

    endpoint: str | None = Field(None, pattern=r"^https?://[^/\s]+/?$",
                                 description="an S3-compatible store's URL, e.g. http://127.0.0.1:9000 "
                                             "(default: AWS_ENDPOINT_URL, else AWS S3)")
    region: str | None = Field(None, description="default: AWS_REGION")
    path_style: bool | None = Field(None, description="bucket in the URL's path, not its host name (default: "
                                                      "true with an endpoint, false for AWS S3)")


class StageSpec(Section):
    run: str = Field(description="module:function, importable from root; or a .sql file under root (a SQL "
                                 "stage, on an engine that runs SQL)")
    backend: EngineName = DEFAULT_ENGINE  # the YAML key stays `backend:`
    inputs: Names = Field(default_factory=list)
    outputs: Names = Field(default_factory=list)
    params: Params = Field(default_factory=dict)
    gpu: GpuMode = False
    retries: int = Field(0, ge=0, le=100, description="re-run a failed stage up to this many times")
    retry_delay: Duration = Field(10.0, description="wait before the first retry; doubled for each "
                                                    "further one (at most 10 minutes)")
    timeout: Duration = Field(None, description="stop the stage (cancelling its engine work) after this long")
    incremental: bool = Field(False, description="call the stage only for the new or changed partitions of its "
                                                 "partitioned input, keeping the output partitions of the others")
    description: str | None = None

    @field_validator("run")
    @classmethod
    def _run_target(cls, value: str) -> str:
        if SQL_FILE.match(value):
            return value
        if not RUN_TARGET.match(value):
            raise ValueError(f"'{value}' is not a module:function reference (write e.g. stages.etl:clean) "
                             "nor a .sql file under root (e.g. sql/orders.sql)")
        return value


class ScheduleSpec(Section):
    cron: str
    timezone: str = "UTC"
    catchup: Literal["latest", "all", "none"] = Field(
        "latest", description="ticks missed since the last scheduled run (the machine was off, cron stopped): "
                              "latest runs once for the newest, all runs each in order, none runs none")
    on_failure: Literal["continue", "hold"] = Field(
        "continue", description="hold: after a scheduled run fails, later ticks are held (recorded and "
                                "notified, not run) until a resume succeeds or `schedule release`")

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        from croniter import croniter  # only needed when a schedule is declared

        if not croniter.is_valid(value):
            raise ValueError(f"'{value}' is not a valid cron expression (five fields: minute hour "
                             "day-of-month month day-of-week, e.g. '0 3 * * 1')")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            hint = did_you_mean(value, zoneinfo.available_timezones())
            raise ValueError(f"unknown time zone '{value}'{hint} "
                             "(use an IANA name such as UTC or Europe/Paris)") from None
        return value


NOTIFY_TIMEOUT = 10.0  # seconds, for each POST attempt and for the command


class NotifySpec(Section):
    """Who to tell when a run ends: a JSON summary POSTed to a URL and/or piped to a command's stdin."""

    on: list[Literal["failure", "success"]] = Field(
        default_factory=lambda: ["failure"], min_length=1,
        description="when to notify: failure (the default; interrupted runs count as failures) and/or success")
    url: str | None = Field(None, description="http(s) URL the JSON summary is POSTed to; may hold ${env:NAME}, "
                                              "which is never printed or stored")
    command: list[str] | str | None = Field(
        None, description="argv list, or a string split like a shell would (but run without one); the JSON "
                          "summary is on its stdin, HYBRIDFLOW_RUN_ID, HYBRIDFLOW_STATUS and HYBRIDFLOW_PIPELINE "
                          "in its environment; runs in the pipeline's root")
    timeout: Duration = Field(NOTIFY_TIMEOUT, description="per delivery attempt; default 10s")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return http_url(value, "https://hooks.example.com/${env:HOOK_TOKEN}")

    @field_validator("command")
    @classmethod
    def _argv(cls, value: list[str] | str | None) -> list[str] | str | None:
        import shlex

        if value is None:
            return value
        try:
            argv = shlex.split(value) if isinstance(value, str) else value
        except ValueError as exc:  # an unclosed quote
            raise ValueError(f"cannot split the command: {exc}") from None
        if not argv or not argv[0]:
            raise ValueError("the command is empty: write a program and its arguments, "
                             "e.g. [page-me, --team, ml]")
        return value

    @model_validator(mode="after")
    def _somewhere(self) -> "NotifySpec":
        if self.url is None and self.command is None:
            raise ValueError("needs a url, a command, or both")
        return self

    @property
    def argv(self) -> list[str]:
        """The command as an argv list; a string is split with shlex and never given to a shell."""
        import shlex

        if self.command is None:
            return []
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)


class PipelineSpec(Section):
    name: str = Field(pattern=PIPELINE_NAME.pattern, description="letters, digits, - and _")
    description: str | None = None
    root: str | None = Field(None, description="relative to this file's directory; default: that directory")
    workdir: str = Field(".hybridflow", description="relative to root")
    keep_versions: int = Field(5, ge=1, description="published versions kept per dataset (older ones are "
                                                    "removed unless the current versions' lineage needs them)")
    report: bool = Field(True, description="write report.html (timeline, stages, datasets) into each run's "
                                           "directory when the run ends")
    rerun_on_library_upgrade: bool = Field(
        True, description="run a stage again when a library its code imports, or its engine, has a new version "
                          "(xgboost 3.1.0 -> 3.2.0); false: the versions are recorded and shown, never a "
                          "reason to run (for teams that pin their environment)")
    params: Params = Field(default_factory=dict)
    # each registered engine's settings model, as pipeline_model() puts it together
    backends: Any = Field(None, description="settings per engine: backends.<engine>")
    storage: StorageSpec | None = Field(None, description="how s3:// paths are reached (endpoint, region)")
    datasets: Annotated[dict[str, DatasetSpec], none_as_empty(dict)] = Field(default_factory=dict)
    stages: dict[str, StageSpec] = Field(min_length=1)
    schedule: ScheduleSpec | None = None
    notify: NotifySpec | None = None
    lineage: LineageSpec | None = Field(None, description="OpenLineage events for each run (default: the "
                                                          "OPENLINEAGE_URL or OPENLINEAGE_CONFIG environment)")
    mlflow: MlflowSpec | None = Field(None, description="record each run in MLflow: params, datasets, metrics, models")


def pipeline_model() -> type[PipelineSpec]:
    """The pipeline file's model with `backends:` made of every registered engine's settings (built
    on first use: the engines register themselves, and a third-party one through an entry point);
    made again when the registry changes (an engine registered at run time)."""
    from ..engines import engines

    return _model_of(tuple((name, engine.settings, engine.description) for name, engine in sorted(engines().items())))


@functools.cache
def _model_of(engines: tuple[tuple[str, type | None, str], ...]) -> type[PipelineSpec]:
    sections = {}
    for name, settings, description in engines:
        model = settings or FreeSettings
        sections[name] = (Annotated[model, none_as_empty(model)],
                          Field(default_factory=model, description=description or None))
    backends = create_model("BackendSettings", __base__=Section, **sections)
    return create_model("PipelineSpec", __base__=PipelineSpec,
                        backends=(Annotated[backends, none_as_empty(backends)], Field(default_factory=backends)))


def json_schema() -> dict:
    schema = pipeline_model().model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hybridflow pipeline"
    return schema
