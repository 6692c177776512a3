"""The engines' backends: one module each (python, dask, ray, duckdb, polars; spark a package of its
own), each a Backend (base.py) that starts its engine and moves data, imported only when a run creates
one. What hybridflow knows of an engine before that (its declaration, settings, the registry) is
hybridflow.engines; its names are re-exported here, where an engine plugin's module imports them:

    [project.entry-points."hybridflow.backends"]
    duckdb = "hybridflow_duckdb.engine"   # a module with ENGINE = hybridflow.backends.Engine(...)
"""

from __future__ import annotations

import importlib

from ..engines import (  # noqa: F401 - the registry's interface, as engines and plugins import it
    BUILT_IN,
    COPIES,
    DEFAULT,
    ENTRY_POINTS,
    ITSELF,
    ClusterLaunch,
    Engine,
    GpuPlugin,
    engine,
    engines,
    missing,
    register,
    require,
    require_all,
)
from ..errors import UnavailableError


def create(name: str, settings, log_dir, gpu=None, secrets=(), store=None, lineage=None):
    """A new, not yet started, backend instance of the engine `name`, made by its backend module;
    `gpu` (a gpu.EngineGpu) starts it with GPU resources; `secrets`: the pipeline's ${env:...} values,
    for engines that must be told to redact them; `store` (a data.stores.Settings): the object store the
    pipeline reads or writes, which the engine reaches itself or through local copies (Engine.way_to);
    `lineage` (definition.lineageids.LineageTarget): where the engine's own lineage events go, or None."""
    require(name)
    declared = engine(name)
    way = declared.way_to(store.scheme, settings) if store is not None else ITSELF
    if way is None:
        raise UnavailableError(f"{name} on a cluster does not reach {store.scheme}:// paths",
                               hint=f"run {name} on this machine, or the stage on another engine")
    backend = importlib.import_module(declared.module).create(settings, log_dir)
    backend.place(gpu=gpu, secrets=tuple(secrets), store=store, copies=way == COPIES,
                  target_file_size=getattr(settings, "target_file_size", None), lineage=lineage)
    return backend
