"""The engines: one module each (python, dask, ray, duckdb, polars; spark a package of its own), each
declaring its `ENGINE` and a Backend (base.py) that starts the engine and moves data. The registry that finds
them, and another package's engine through the `hybridflow.backends` entry point group, is
hybridflow.registry; its names are here too, where an engine's module imports them:

    [project.entry-points."hybridflow.backends"]
    duckdb = "hybridflow_duckdb.engine"   # a module with ENGINE = hybridflow.backends.Engine(...)
"""

from ..registry import (  # noqa: F401 - the registry's interface, as engines and plugins import it
    BACKENDS,
    BUILT_IN,
    DEFAULT,
    ENTRY_POINTS,
    ClusterLaunch,
    Engine,
    GpuPlugin,
    create,
    engine,
    engines,
    missing,
    register,
    require,
    require_all,
)
