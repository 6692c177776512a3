"""The pieces every part of the pipeline file's model is made of: sections that refuse unknown keys,
GPU modes, free mappings. Engines declare their `backends.<engine>` settings with these, in their
own backend module (see backends.Engine); spec.py builds the whole file's model from them."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator


class Section(BaseModel):
    # Unknown keys are errors: a misspelt key silently ignored is the worst kind of bug.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def gpu_mode(value: Any) -> bool | str:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    raise ValueError(f"must be true, false or auto, not {value!r}")


def none_as_empty(empty):
    """An empty YAML section (`params:` with nothing under it) means 'none', not an error."""
    return BeforeValidator(lambda v: empty() if v is None else v)


GpuMode = Annotated[bool | Literal["auto"], BeforeValidator(gpu_mode)]
Params = Annotated[dict[str, Any], none_as_empty(dict)]
Names = Annotated[list[str], none_as_empty(list)]


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_count(value: int | str) -> int:
    """'128MB', '512MiB', 1000000 -> bytes (the spellings dask and RMM accept)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"'{value}' is not a size in bytes (write e.g. 128MB, 512MiB or a number of bytes)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


ByteSize = Annotated[int, BeforeValidator(byte_count)]
TARGET_FILE_SIZE = 128 * 10**6  # bytes of Parquet per file, when neither a dataset nor its engine says


class ClusterHost(Section):
    host: str = Field(description="the address (or name) SSH reaches it by; its engine processes bind to it")
    head: bool = Field(False, description="runs the scheduler, master or head (default: the first host)")


class ClusterSection(Section):
    """backends.<engine>.cluster: how a cluster is brought up for each run (see hybridflow.execution.provisioning)."""

    provider: Literal["command", "ssh"] = Field(
        description="command: the team's own up and down commands; ssh: the engine's own cluster processes "
                    "started on your hosts over SSH")
    # provider: command
    up: str | None = Field(None, description="brings the cluster up; its last line of output is JSON: "
                                             '{"address": "tcp://10.0.0.5:8786", ...}')
    down: str | None = Field(None, description="takes it down; HYBRIDFLOW_CLUSTER holds the JSON up printed")
    # provider: ssh
    hosts: list[ClusterHost] | None = Field(None, description="the hosts: one head, the others run workers")
    user: str | None = Field(None, description="the SSH user (default: ssh's own)")
    key_file: str | None = Field(None, description="the SSH private key (default: ssh's own)")
    port: int = Field(22, ge=1, le=65535, description="the SSH port")
    ssh_options: Names = Field(default_factory=list, description="more ssh arguments, e.g. [-o, "
                                                                 "UserKnownHostsFile=/etc/hybridflow/known_hosts]")
    python: str | None = Field(None, description="the Python on the hosts (default: this one's path)")
    head_port: int | None = Field(None, ge=1, le=65535, description="the scheduler's, master's or head's port "
                                                                     "(default: the engine's own)")
    head_args: Names = Field(default_factory=list, description="more arguments for the head process")
    worker_args: Names = Field(default_factory=list, description="more arguments for each worker process")
    env: dict[str, str] = Field(default_factory=dict, description="environment of the cluster's processes "
                                "(credentials from ${env:...}); sent over SSH's input, never on a command line")
    idle_timeout: float = Field(3600, gt=0, description="seconds a cluster may sit idle before it ends itself, "
                                                        "where the engine offers a timer (Dask's scheduler)")
    # both
    up_timeout: float = Field(600, gt=0, description="seconds bringing the cluster up may take")
    down_timeout: float = Field(120, gt=0, description="seconds taking it down may take before it is killed")

    @model_validator(mode="after")
    def _provider_keys(self):
        mine = {"command": {"up", "down"}, "ssh": {"hosts"}}
        missing = sorted(k for k in mine[self.provider] if not getattr(self, k))
        if missing:
            raise ValueError(f"provider: {self.provider} needs {', '.join(missing)}")
        others = sorted(k for k in mine["ssh" if self.provider == "command" else "command"] if getattr(self, k))
        if others:
            raise ValueError(f"{', '.join(others)}: not for provider: {self.provider}")
        if self.hosts and sum(h.head for h in self.hosts) > 1:
            raise ValueError("hosts: only one may be the head")
        return self

    @property
    def head(self) -> str:
        return next((h.host for h in self.hosts if h.head), self.hosts[0].host)

    @property
    def workers(self) -> list[str]:
        """The hosts that run workers: all but the head (the head too, when it is the only one)."""
        return [h.host for h in self.hosts if h.host != self.head] or [self.head]


class EngineSection(Section):
    """What every engine's `backends.<engine>` section has, besides its own settings."""

    target_file_size: ByteSize | None = Field(
        None, gt=0, description="bytes of Parquet per output file for this engine's stages (default 128MB)")
    cluster: ClusterSection | None = Field(
        None, description="bring the engine's cluster up for each run, and take it down once no stage needs it")

    # the setting a brought-up cluster's address fills (address:, master:); None: an engine that runs in
    # hybridflow's own process, with no cluster to bring up
    cluster_address_field: ClassVar[str | None] = None

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        """Editors and the reference offer `cluster:` only on engines that have a cluster to bring up."""
        schema = handler(core_schema)
        if cls.cluster_address_field is None:
            handler.resolve_ref_schema(schema).get("properties", {}).pop("cluster", None)
        return schema

    @model_validator(mode="after")
    def _one_way_to_a_cluster(self):
        field = self.cluster_address_field
        if self.cluster is not None and field is None:
            raise ValueError("cluster: this engine runs in hybridflow's own process and has no cluster to bring up")
        if self.cluster is not None and getattr(self, field, None):
            raise ValueError(f"cluster: brings a cluster up for each run and {field}: attaches to one already "
                             f"running: keep one of them")
        return self

    def attached_to(self, address: str, **credentials: Any):
        """These settings, attached to the cluster at `address` (one brought up for the run) with
        `credentials` (the run's own: settings of the engine, by name)."""
        return self.model_copy(update={self.cluster_address_field: address, "cluster": None, **credentials})
