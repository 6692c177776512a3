"""Engines that run stages. Each lives in its own module, imported only when a stage needs it."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Iterable

from ..errors import UnavailableError

# backend -> (pip extra, the module that extra provides); python needs nothing extra
BACKEND_EXTRAS: dict[str, tuple[str, str]] = {
    "spark": ("spark", "pyspark"),
    "dask": ("dask", "distributed"),
    "ray": ("ray", "ray"),
}


def missing(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """The backends among `names` whose engine package is not installed: name -> (pip extra, module)."""
    found: dict[str, tuple[str, str]] = {}
    for name in dict.fromkeys(names):  # each once, in the order given
        extra, module = BACKEND_EXTRAS.get(name, (None, None))
        if module and importlib.util.find_spec(module) is None:  # finds, never imports
            found[name] = (extra, module)
    return found


def require_all(names: Iterable[str]) -> None:
    """Fail before any stage starts if any of `names` cannot run here: one error naming every missing
    engine and the one pip command that installs them all."""
    absent = missing(names)
    if not absent:
        return
    needs = [f"backend '{name}' needs {module}" for name, (_, module) in absent.items()]
    listed = needs[0] if len(needs) == 1 else f"{', '.join(needs[:-1])} and {needs[-1]}"
    extras = ",".join(extra for extra, _ in absent.values())
    raise UnavailableError(f"{listed}, which {'is' if len(needs) == 1 else 'are'} not installed",
                           hint=f"pip install 'hybridflow[{extras}]'")


def require(name: str) -> None:
    """Fail before any stage starts if `name` cannot run here, saying how to fix it."""
    require_all([name])


def create(name: str, settings, log_dir, gpu=None, secrets=()):
    """A new, not yet started, backend instance; `gpu` (a gpu.EngineGpu) starts it with GPU resources;
    `secrets`: the pipeline's ${env:...} values, for engines that must be told to redact them."""
    require(name)
    module = importlib.import_module(f"hybridflow.backends.{name}")
    engine = module.create(settings, log_dir)
    engine.gpu = gpu
    engine.secrets = tuple(secrets)
    return engine
