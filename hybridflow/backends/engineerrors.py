"""An engine's exceptions told apart from the user's own, and the user's found inside the engine's
wrappers (a Spark PythonException, Ray's RayTaskError)."""

from __future__ import annotations

ENGINE_PACKAGES = ("ray", "pyspark", "py4j", "distributed", "dask", "org.apache", "java.")


ENGINE_WRAPPERS = ("PythonException", "Py4JJavaError", "UserCodeException", "RayTaskError", "TaskError")


def is_engine_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(ENGINE_PACKAGES)


def unwrap_error(exc: BaseException) -> BaseException:
    """The user's own exception inside an engine's wrappers (Ray's RayTaskError carries it as .cause,
    Ray Data's UserCodeException as __cause__)."""
    for _ in range(10):
        if not is_engine_error(exc):
            break
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc
