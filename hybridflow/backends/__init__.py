"""Engines that run stages. Each lives in its own module, imported only when a stage needs it."""

from __future__ import annotations

import importlib
import importlib.util

from ..errors import UnavailableError

# backend -> (pip extra, the module that extra provides); python needs nothing extra
BACKEND_EXTRAS: dict[str, tuple[str, str]] = {
    "spark": ("spark", "pyspark"),
    "dask": ("dask", "distributed"),
    "ray": ("ray", "ray"),
}

def require(name: str) -> None:
    """Fail before any stage starts if `name` cannot run here, saying how to fix it."""
    extra, module = BACKEND_EXTRAS.get(name, (None, None))
    if module and importlib.util.find_spec(module) is None:
        raise UnavailableError(f"backend '{name}' needs {module}, which is not installed",
                               hint=f"pip install 'hybridflow[{extra}]'")


def create(name: str, settings, log_dir, gpu=None):
    """A new, not yet started, backend instance; `gpu` (a gpu.EngineGpu) starts it with GPU resources."""
    require(name)
    module = importlib.import_module(f"hybridflow.backends.{name}")
    engine = module.create(settings, log_dir)
    engine.gpu = gpu
    return engine
