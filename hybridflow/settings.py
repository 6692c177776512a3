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


class CommandCluster(Section):
    """A cluster brought up for each run by the team's own commands (see hybridflow.provisioning)."""

    provider: Literal["command"] = Field(description="command: the team's own up and down commands")
    up: str = Field(description="brings the cluster up; its last line of output is JSON: "
                                '{"address": "tcp://10.0.0.5:8786", ...}')
    down: str = Field(description="takes it down; HYBRIDFLOW_CLUSTER holds the JSON up printed")
    up_timeout: float = Field(600, gt=0, description="seconds `up` may take")
    down_timeout: float = Field(120, gt=0, description="seconds `down` may take before it is killed")


class EngineSection(Section):
    """What every engine's `backends.<engine>` section has, besides its own settings."""

    target_file_size: ByteSize | None = Field(
        None, gt=0, description="bytes of Parquet per output file for this engine's stages (default 128MB)")
    cluster: CommandCluster | None = Field(
        None, description="bring the engine's cluster up for each run, and take it down once no stage needs it")

    # the setting a brought-up cluster's address fills (address:, master:); None: an engine that runs in
    # hybridflow's own process, with no cluster to bring up
    cluster_address_field: ClassVar[str | None] = None

    @model_validator(mode="after")
    def _one_way_to_a_cluster(self):
        field = self.cluster_address_field
        if self.cluster is not None and field is None:
            raise ValueError("cluster: this engine runs in hybridflow's own process and has no cluster to bring up")
        if self.cluster is not None and getattr(self, field, None):
            raise ValueError(f"cluster: brings a cluster up for each run and {field}: attaches to one already "
                             f"running: keep one of them")
        return self

    def attached_to(self, address: str):
        """These settings, attached to the cluster at `address` (one brought up for the run)."""
        return self.model_copy(update={self.cluster_address_field: address, "cluster": None})
