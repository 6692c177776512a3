"""The pipeline file's `lineage:` and `mlflow:` sections, and a dataset's `mlflow:`: where a run's
OpenLineage events and its MLflow runs go (hybridflow/tracking sends them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..settings import Section


def http_url(value: str | None, example: str) -> str | None:
    """`value` stripped, when it is an http(s) URL with a host; a ValueError showing `example` otherwise."""
    from urllib.parse import urlsplit

    if value is None:
        return value
    parts = urlsplit(value.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        got = f"scheme '{parts.scheme}'" if parts.scheme else "no scheme"
        raise ValueError(f"must be an http:// or https:// URL with a host ({got}), e.g. {example}")
    return value.strip()

LINEAGE_TIMEOUT = 5.0  # seconds for each event sent over HTTP


class LineageSpec(Section):
    """OpenLineage events for every run: the pipeline run is the parent of one run per stage."""

    transport: Literal["http", "file"] = Field("http", description="http: POST each event to url; file: append "
                                                                  "each event as one JSON line to path")
    url: str | None = Field(None, description="http: the OpenLineage endpoint's base URL (events are POSTed to "
                                              "<url>/api/v1/lineage); may hold ${env:NAME}")
    endpoint: str = Field("api/v1/lineage", description="http: the path under url events are POSTed to")
    api_key: str | None = Field(None, description="http: sent as a Bearer token; write ${env:NAME}, never the key")
    path: str | None = Field(None, description="file: the JSON-lines file, relative to root")
    namespace: str | None = Field(None, description="the jobs' namespace (default: OPENLINEAGE_NAMESPACE, "
                                                    "else hybridflow)")
    timeout: float = Field(LINEAGE_TIMEOUT, gt=0, le=60, description="seconds for each event sent over HTTP")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return http_url(value, "http://marquez:5000")

    @model_validator(mode="after")
    def _where(self) -> "LineageSpec":
        if self.transport == "http" and not self.url:
            raise ValueError("transport: http needs a url (e.g. http://marquez:5000)")
        if self.transport == "file" and not self.path:
            raise ValueError("transport: file needs a path (a JSON-lines file, e.g. lineage/events.jsonl)")
        return self


class MlflowSpec(Section):
    """Each run recorded as an MLflow run, with a nested run for each stage that did work."""

    tracking_uri: str | None = Field(None, description="the MLflow tracking server (default: MLFLOW_TRACKING_URI)")
    experiment: str | None = Field(None, description="default: the pipeline's name")


class DatasetMlflowSpec(Section):
    """A `kind: files` output logged to MLflow as the run's model and registered under `model`."""

    model: str = Field(min_length=1, description="the registered model a new version is created in, e.g. churn")
