"""The pieces every part of the pipeline file's model is made of: sections that refuse unknown keys,
GPU modes, free mappings. Engines declare their `backends.<engine>` settings with these, in their
own backend module (see backends.Engine); spec.py builds the whole file's model from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict


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
