"""The installed libraries a stage runs on, and their versions: an upgrade of one (xgboost 3.1.0 ->
3.2.0) may change what the stage computes, though none of its code, params or inputs changed.

A stage's libraries are the distributions that provide the modules its code imports (found by
codereach, which reads the code and imports nothing) and those its engine declares
(Engine.distributions). The standard library and hybridflow itself are left out. Versions are those
of the environment this process runs in, which is the one the stage's code is imported in.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from typing import Iterable

OWN = "hybridflow"
SHOWN = 3  # upgrades named in a reason before "+N more"


class Libraries:
    """Which installed distributions provide a top-level module, read once (from each distribution's
    top_level.txt, else the first part of each path in its RECORD: a tenth of the time
    importlib.metadata.packages_distributions() takes, which parses every path); one per plan or run,
    so a long watch session sees what was upgraded meanwhile."""

    def __init__(self) -> None:
        self._providers: dict[str, list[metadata.Distribution]] | None = None
        self._named: dict[str, metadata.Distribution | None] = {}  # an engine's distributions, by name
        self._read: dict[metadata.Distribution, tuple[str, str]] = {}  # its name and version, read once

    def versions(self, modules: Iterable[str], distributions: Iterable[str] = ()) -> dict[str, str]:
        """Distribution name -> version, for the distributions providing `modules` (top-level
        names) and the named `distributions` (an engine's); those not installed are left out."""
        found: dict[str, str] = {}
        for module in sorted(set(modules) - set(sys.stdlib_module_names) - {OWN}):
            for dist in self._provider_map().get(module, ()):
                self._add(found, dist)
        for name in distributions:
            if name not in self._named:
                try:
                    self._named[name] = metadata.distribution(name)
                except metadata.PackageNotFoundError:
                    self._named[name] = None
            if self._named[name] is not None:
                self._add(found, self._named[name])
        return dict(sorted(found.items(), key=lambda item: item[0].lower()))

    def _add(self, found: dict[str, str], dist: metadata.Distribution) -> None:
        """The first of a name on sys.path is the one imported; a copy further down is not."""
        if dist not in self._read:
            self._read[dist] = (dist.metadata["Name"] or "", dist.version or "")
        name, version = self._read[dist]
        if name and version and _normal(name) != OWN and not any(_normal(n) == _normal(name) for n in found):
            found[name] = version

    def _provider_map(self) -> dict[str, list[metadata.Distribution]]:
        if self._providers is None:
            providers: dict[str, list[metadata.Distribution]] = {}
            for dist in metadata.distributions():  # in sys.path order: the one imported comes first
                for module in _top_level(dist):
                    providers.setdefault(module, []).append(dist)
            self._providers = providers
        return self._providers


def _top_level(dist: metadata.Distribution) -> set[str]:
    declared = dist.read_text("top_level.txt")
    if declared:
        return set(declared.split())
    # junk such as "foo-1.0.dist-info" or ".." is harmless: no module is named so
    return {line.split(",", 1)[0].split("/", 1)[0].removesuffix(".py")
            for line in (dist.read_text("RECORD") or "").splitlines()}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def upgrades(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """'xgboost 3.1.0 -> 3.2.0' for each distribution whose version changed. One that appears or
    goes is not an upgrade: the code that imports it changed too, or the stage cannot import it."""
    return [f"{name} {before[name]} -> {version}" for name, version in after.items()
            if name in before and before[name] != version]


def describe(changes: list[str]) -> str:
    """The upgrades in one reason, the first few named: 'a 1 -> 2, b 3 -> 4 +2 more since the last run'."""
    more = f" +{len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
    return f"{', '.join(changes[:SHOWN])}{more} since the last run"
