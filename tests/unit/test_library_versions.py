"""The libraries a stage runs on: the modules outside the project its code imports (read by codereach,
nothing imported), the installed distributions that provide them and their versions (spec.libraries),
and how an upgrade is worded."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from hybridflow.definition import fingerprint as fp
from hybridflow.definition.codereach import CodeIndex
from hybridflow.definition.libraries import Libraries, describe, upgrades
from hybridflow.engines import engine
from tests.support.distributions import install

STEPS = '''
import json

import pandas as pd

from hybridflow.backends import Engine
from pkg import helpers


def train(frame):
    return helpers.fit(frame)


def unused(frame):
    import notreached
    return notreached.go(frame)
'''

HELPERS = '''
def fit(frame):
    import tinylib
    from tiny_extras.models import Model
    return Model(tinylib.VERSION).fit(frame)
'''


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for relative, text in {"pkg/__init__.py": "", "pkg/steps.py": STEPS, "pkg/helpers.py": HELPERS}.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(textwrap.dedent(text))
    return tmp_path


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """Two distributions first on sys.path: tinylib (its module named in RECORD only) and Tiny-Extras,
    whose module tiny_extras its top_level.txt names; a stale tinylib 0.9 further down."""
    first, later = tmp_path / "site", tmp_path / "later-site"
    install(first, "tinylib", "1.0", "tinylib")
    install(first, "Tiny-Extras", "2.5", "tiny_extras", top_level=True)
    install(later, "tinylib", "0.9", "tinylib")
    monkeypatch.syspath_prepend(str(later))
    monkeypatch.syspath_prepend(str(first))
    return first


def test_the_reached_code_names_the_modules_outside_the_project_it_imports(root):
    # the function's own module runs on import (json, pandas, hybridflow); helpers.fit imports the
    # others inside the function; unused is never reached, nor is the project's own pkg counted
    assert CodeIndex(root).reach("pkg.steps:train").imports == {"json", "pandas", "hybridflow", "tinylib",
                                                                "tiny_extras"}


def test_a_query_imports_nothing(tmp_path):
    (tmp_path / "totals.sql").write_text("select 1 as one\n")
    assert CodeIndex(tmp_path).reach("totals.sql").imports == frozenset()


def test_modules_map_to_the_distributions_that_provide_them_and_their_versions(root, site):
    imports = CodeIndex(root).reach("pkg.steps:train").imports
    # the standard library and hybridflow are left out; the first tinylib on sys.path is the one imported
    assert Libraries().versions(imports) == {"pandas": metadata.version("pandas"), "Tiny-Extras": "2.5",
                                             "tinylib": "1.0"}


def test_an_engine_adds_the_distributions_it_declares(site):
    versions = Libraries().versions({"tinylib"}, engine("dask").distributions)
    assert versions == {"dask": metadata.version("dask"), "distributed": metadata.version("distributed"),
                        "tinylib": "1.0"}
    assert engine("python").distributions == ()
    assert Libraries().versions({"no_such_module"}, ("no-such-distribution",)) == {}


def test_a_new_reading_sees_an_upgrade(site):
    assert Libraries().versions({"tinylib"}) == {"tinylib": "1.0"}
    install(site, "tinylib", "1.1", "tinylib")
    assert Libraries().versions({"tinylib"}) == {"tinylib": "1.1"}


def test_an_upgrade_is_worded_and_a_few_named():
    assert upgrades({"a": "1", "b": "2", "gone": "1"}, {"a": "1.1", "b": "2", "new": "3"}) == ["a 1 -> 1.1"]
    changes = [f"lib{i} 1.0 -> 1.1" for i in range(5)]
    assert describe(changes[:1]) == "lib0 1.0 -> 1.1 since the last run"
    assert describe(changes) == "lib0 1.0 -> 1.1, lib1 1.0 -> 1.1, lib2 1.0 -> 1.1 +2 more since the last run"


def test_a_record_made_before_versions_were_kept_counts_as_unchanged():
    current = fp.Fingerprint({}, {}, {}, {}, libraries={"tinylib": "1.1"})
    old = {"digest": current.digest}  # no "libraries": made by an older hybridflow
    assert fp.upgrades([old], current) == []
    assert fp.upgrades([old, {"libraries": {"tinylib": "1.0"}}], current) == ["tinylib 1.0 -> 1.1"]
    # versions are kept beside the digest, not in it
    assert fp.Fingerprint({}, {}, {}, {}).digest == current.digest
    assert current.record()["libraries"] == {"tinylib": "1.1"}


def test_the_standard_library_is_never_a_library():
    assert Libraries().versions(set(sys.stdlib_module_names) & {"json", "os", "sqlite3", "email"}) == {}
