"""hybridflow: one YAML pipeline, each stage on the engine that suits it.

Importing this package is cheap on purpose: engines (pyspark, dask, ray, cudf)
are imported only by the backend module that runs a stage on them.
"""

__version__ = "0.1.0"
