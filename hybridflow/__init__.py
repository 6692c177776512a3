"""hybridflow: one YAML pipeline, each stage on the engine that suits it.

The Python API (see hybridflow.api and the README's "From Python"):

    import hybridflow

    result = hybridflow.run("pipeline.yaml")        # a RunResult; result.raise_for_status()
    hybridflow.plan("pipeline.yaml").to_run          # what a run would do, and why
    hybridflow.read("pipeline.yaml", "features")     # a published dataset as a pandas DataFrame
    hybridflow.runs("pipeline.yaml")                 # run records, newest first
    hybridflow.watch("pipeline.yaml")                # run again on each save, engines kept warm

Importing this package is cheap on purpose: the API is imported on first use, and engines (pyspark,
dask, ray, cudf) only by the backend module that runs a stage on them.
"""

__version__ = "0.1.0"

_API = ("load", "run", "watch", "plan", "read", "runs", "report", "collect_garbage", "Plan", "validate", "graph",
        "schema", "run_record", "stage_logs", "diagnose", "init", "install_schedule", "schedules", "remove_schedule",
        "is_due", "clusters", "reap_clusters")
_RESULTS = ("RunResult", "StageResult", "Listener")  # from hybridflow.results
_ERRORS = ("HybridflowError", "ConfigError", "DataError", "StageError", "StageTimeout", "StorageError",
           "UnavailableError", "LockedError", "UsageError", "InterruptedRun", "ExitCode")

__all__ = ["__version__", *_API, *_RESULTS, *_ERRORS]


def __getattr__(name: str):
    import importlib

    for module, names in (("api", _API), ("results", _RESULTS), ("errors", _ERRORS)):
        if name in names:
            value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
            globals()[name] = value
            return value
    raise AttributeError(f"module 'hybridflow' has no attribute '{name}'")
