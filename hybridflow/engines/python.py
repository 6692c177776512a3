"""How hybridflow knows the python engine: stages in hybridflow's own process, before starting it: its settings
(backends.python in the pipeline file), the stage `hybridflow init` writes for it, and its Engine
declaration. Light to import: the backend, hybridflow.backends.python, is imported when a run creates one."""

from __future__ import annotations

from pydantic import Field

from ..settings import EngineSection, GpuMode
from . import Engine


class PythonSettings(EngineSection):
    gpu: GpuMode = Field(False, description="the default GPU mode of python stages")
    rmm_pool_size: str | None = Field(None, description="an RMM memory pool for GPU stages, e.g. 8GB")


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Cleaning on the python backend: a pandas DataFrame in, a pandas DataFrame out."""

import pandas as pd


def clean({input}: pd.DataFrame, min_amount: float) -> pd.DataFrame:
    """Keep purchases of at least `min_amount` (a param in pipeline.yaml)."""
    kept = {input}[({input}["kind"] == "purchase") & ({input}["amount"] >= min_amount)]
    return kept.reset_index(drop=True)
'''

ENGINE = Engine(
    name="python", module="hybridflow.backends.python", example=(EXAMPLE_STAGE, "clean"),
    settings=PythonSettings, description="stages in hybridflow's own process",
    frame_types="pandas DataFrames or pyarrow Tables (or cuDF DataFrames on the GPU)", starts=False,
    gpu=True, gpu_packages=("cudf",),
)
