"""The code part of a stage's fingerprint: what the stage function reaches, by its parsed code
(hybridflow.definition.codereach), and how fingerprint.explain words a change in it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hybridflow.definition import fingerprint as fp
from hybridflow.definition.codereach import CodeIndex

STEPS = '''
"""Stage functions."""
import pandas as pd

from pkg import helpers
from pkg.rates import rate

SCALE = 2


def make(n):
    return pd.DataFrame({"id": range(n)})


def scale(numbers):
    return numbers.assign(value=numbers["id"] * helpers.weight(SCALE) * rate())


def report(scaled, ctx):
    """Sums the values."""
    return _total(scaled, ctx.params["column"])


def _total(frame, column):
    return frame[[column]].sum().to_frame().T
'''

HELPERS = '''
def weight(factor):
    return factor * 1.0


def unused():
    return 0
'''


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/steps.py", STEPS)
    write(tmp_path, "pkg/helpers.py", HELPERS)
    write(tmp_path, "pkg/rates.py", "def rate():\n    return 0.5\n")
    return tmp_path


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))


def code(root: Path, target: str) -> dict[str, str]:
    return CodeIndex(root).reach(target).digests  # a new index: nothing cached from before an edit


def edit(root: Path, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def reasons(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return fp.explain({"code": old, "params": {}, "settings": {}, "inputs": {}}, fp.Fingerprint(new, {}, {}, {}))


def test_a_stage_reaches_its_function_what_it_calls_and_the_modules_it_imports(root):
    assert sorted(code(root, "pkg.steps:scale")) == [
        "pkg/__init__.py:module-level code",
        "pkg/helpers.py:function weight", "pkg/helpers.py:module-level code",
        "pkg/rates.py:function rate", "pkg/rates.py:module-level code",
        "pkg/steps.py:function scale", "pkg/steps.py:module-level code"]
    # report reaches _total in its own module; it calls nothing in helpers, which is still imported
    assert sorted(code(root, "pkg.steps:report")) == [
        "pkg/__init__.py:module-level code", "pkg/helpers.py:module-level code", "pkg/rates.py:module-level code",
        "pkg/steps.py:function _total", "pkg/steps.py:function report", "pkg/steps.py:module-level code"]


def test_comments_docstrings_and_formatting_never_count(root):
    before = {stage: code(root, f"pkg.steps:{stage}") for stage in ("make", "scale", "report")}
    edit(root, "pkg/steps.py", '    """Sums the values."""\n', '    """Sums every value (a new docstring)."""\n'
                                                                 "    # a comment\n")
    edit(root, "pkg/steps.py", '"""Stage functions."""', '"""Stage functions, documented anew."""\n# header')
    edit(root, "pkg/steps.py", 'frame[[column]].sum().to_frame().T', '(\n        frame[[column]]\n'
                                                                       '        .sum().to_frame().T  # one row\n    )')
    edit(root, "pkg/helpers.py", "    return factor * 1.0", "    return factor*1.0  # in place")
    assert {stage: code(root, f"pkg.steps:{stage}") for stage in before} == before


def test_an_edit_changes_only_the_stages_that_reach_it(root):
    before = {stage: code(root, f"pkg.steps:{stage}") for stage in ("make", "scale", "report")}
    edit(root, "pkg/steps.py", "frame[[column]].sum()", "frame[[column]].mean()")  # _total, reached by report only
    after = {stage: code(root, f"pkg.steps:{stage}") for stage in before}
    assert after["make"] == before["make"] and after["scale"] == before["scale"]
    assert reasons(before["report"], after["report"]) == ["function _total in pkg/steps.py changed"]
    edit(root, "pkg/helpers.py", "factor * 1.0", "factor * 2.0")  # import pkg.helpers, then helpers.weight
    edit(root, "pkg/helpers.py", "return 0", "return 1")  # nobody calls unused
    edit(root, "pkg/rates.py", "0.5", "0.25")  # from pkg.rates import rate
    again = {stage: code(root, f"pkg.steps:{stage}") for stage in before}
    assert again["make"] == after["make"] and again["report"] == after["report"]
    assert reasons(after["scale"], again["scale"]) == ["function weight in pkg/helpers.py changed",
                                                       "function rate in pkg/rates.py changed"]


def test_module_level_code_counts_for_every_stage_of_the_module(root):
    before = {stage: code(root, f"pkg.steps:{stage}") for stage in ("make", "report")}
    edit(root, "pkg/steps.py", "SCALE = 2", "SCALE = 3")
    for stage in before:
        assert reasons(before[stage], code(root, f"pkg.steps:{stage}")) == ["module-level code in pkg/steps.py changed"]
    edit(root, "pkg/helpers.py", "def weight", "LIMIT = 4\n\n\ndef weight")  # runs on import by steps
    assert reasons(before["make"], code(root, "pkg.steps:make")) == [
        "module-level code in pkg/helpers.py changed", "module-level code in pkg/steps.py changed"]


def test_new_and_dropped_dependencies_are_named(root):
    before = code(root, "pkg.steps:make")
    write(root, "pkg/extra.py", "def pad(frame):\n    return frame\n")
    edit(root, "pkg/steps.py", 'return pd.DataFrame({"id": range(n)})',
         'from pkg.extra import pad\n    return pad(pd.DataFrame({"id": range(n)}))')
    after = code(root, "pkg.steps:make")
    assert reasons(before, after) == ["pkg/extra.py is now imported", "function make in pkg/steps.py changed"]
    assert reasons(after, before) == ["pkg/extra.py is no longer imported", "function make in pkg/steps.py changed"]
    scale = code(root, "pkg.steps:scale")
    edit(root, "pkg/steps.py", "helpers.weight(SCALE)", "helpers.unused()")
    assert reasons(scale, code(root, "pkg.steps:scale")) == [
        "function unused in pkg/helpers.py is now used", "function weight in pkg/helpers.py is no longer used",
        "function scale in pkg/steps.py changed"]


def test_what_cannot_be_followed_by_name_reaches_the_whole_module(root):
    write(root, "pkg/dynamic.py", '''
        from pkg import helpers
        from pkg.rates import *


        def pick(name):
            return getattr(helpers, name)()


        def star():
            return rate()


        def by_string(name):
            return globals()[name]()


        def other():
            return 1
    ''')
    assert "pkg/helpers.py:function unused" in code(root, "pkg.dynamic:pick")  # the module handed to getattr
    write(root, "pkg/facade.py", "from pkg.rates import rate\n")
    write(root, "pkg/lookup.py", "from pkg import facade\n\n\ndef pick(name):\n    return getattr(facade, name)()\n")
    assert "pkg/rates.py:function rate" in code(root, "pkg.lookup:pick")  # and what that module re-exports
    assert "pkg/rates.py:function rate" in code(root, "pkg.dynamic:star")  # a star import: all of it
    assert "pkg/dynamic.py:function other" in code(root, "pkg.dynamic:by_string")
    assert "pkg/dynamic.py:function other" not in code(root, "pkg.dynamic:star")


def test_chained_imports_relative_imports_and_classes_are_followed(root):
    write(root, "pkg/sub/__init__.py", "from .models import Model\n")
    write(root, "pkg/sub/models.py", '''
        from ..rates import rate as base_rate


        class Model:
            def fit(self, frame):
                return frame * base_rate()


        def unrelated():
            return 2
    ''')
    write(root, "pkg/chained.py", '''
        import pkg.sub.models
        import pkg.helpers as h


        def chained(frame):
            return pkg.sub.models.Model().fit(frame) + h.weight(1)


        def via_package(frame):
            from pkg.sub import Model
            return Model().fit(frame)
    ''')
    chained = code(root, "pkg.chained:chained")
    assert {"pkg/sub/models.py:class Model", "pkg/rates.py:function rate", "pkg/helpers.py:function weight",
            "pkg/sub/__init__.py:module-level code"} <= set(chained)
    assert "pkg/sub/models.py:function unrelated" not in chained
    via_package = code(root, "pkg.chained:via_package")
    assert "pkg/sub/models.py:class Model" in via_package and "pkg/helpers.py:function weight" not in via_package


def test_a_function_given_to_an_unknown_decorator_counts_as_module_level_code(root):
    write(root, "pkg/registry.py", '''
        import functools

        HANDLERS = {}


        def register(fn):
            HANDLERS[fn.__name__] = fn
            return fn


        @register
        def double(x):
            return x * 2


        @functools.lru_cache
        def cached(x):
            return x


        def dispatch(name, x):
            return HANDLERS[name](x)
    ''')
    before = code(root, "pkg.registry:dispatch")
    assert "pkg/registry.py:function cached" not in before  # lru_cache only wraps
    edit(root, "pkg/registry.py", "x * 2", "x * 3")  # reached through HANDLERS, filled on import
    assert reasons(before, code(root, "pkg.registry:dispatch")) == ["module-level code in pkg/registry.py changed"]


def test_a_file_that_does_not_parse_is_hashed_whole(root):
    write(root, "pkg/broken.py", "def go(x):\n    return x +\n")
    before = code(root, "pkg.broken:go")
    assert sorted(before) == ["pkg/__init__.py:module-level code", "pkg/broken.py:file"]
    assert CodeIndex(root).reach("pkg.broken:go").reads_params  # cannot tell: assume it does
    write(root, "pkg/broken.py", "def go(x):\n    return x -\n")
    assert reasons(before, code(root, "pkg.broken:go")) == ["pkg/broken.py changed"]
    write(root, "pkg/broken.py", "def go(x):\n    return x\n")
    assert reasons(before, code(root, "pkg.broken:go")) == ["pkg/broken.py changed"]


def test_reads_params_only_in_the_code_the_stage_reaches(root):
    index = CodeIndex(root)
    assert index.reach("pkg.steps:report").reads_params
    assert not index.reach("pkg.steps:scale").reads_params  # report reads ctx.params, scale does not reach it


def test_a_fingerprint_of_the_old_per_file_shape_explains_itself():
    old = {"code": {"pkg/steps.py": "ab" * 32}, "params": {"n": 1}, "settings": {}, "inputs": {}}
    new = fp.Fingerprint({"pkg/steps.py:function make": "cd" * 32}, {"n": 2}, {}, {})
    assert fp.explain(old, new) == ["its code was fingerprinted by an older version of hybridflow",
                                    "params.n changed 1 -> 2"]
