"""A corpus of malformed pipeline files, each with the problems `hybridflow validate` must report.

Every file in tests/corpus/invalid/ starts with comment lines that state what is expected:

    # expect-line: 7                       an error is reported at exactly this line ...
    # expect-message: unknown key 'ouputs' ... whose message contains this text (case-sensitive)
    # expect-file: broken.py               (optional, before a line/message pair) the problem's file
                                           ends with this name instead of being the pipeline file
    # expect-absent: did you mean          no error reported for the file contains this text

The pipelines set `root: ..` so that root is tests/corpus, and their stages point at the small
package tests/corpus/stages/ (which validate reads with `ast`, never imports).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridflow.cli import app

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
INVALID = CORPUS / "invalid"
VALID = CORPUS / "valid"
EXIT_CONFIG = 78

# Case 05 carries a `!!python/object/apply:os.system` tag that would create this file if executed.
TAG_MARKER = Path("/tmp/hybridflow_corpus_tag_marker")
# Case 46 refers to ${env:...} of this variable, which must not be set while the tests run.
UNSET_VARIABLE = "HYBRIDFLOW_CORPUS_UNSET_VAR_7Q"

@dataclass
class Expectation:
    line: int
    message: str
    file: str | None = None  # the reported file ends with this; None: the pipeline file itself


@dataclass
class Case:
    path: Path
    expected: list[Expectation]
    absent: list[str]


def read_case(path: Path) -> Case:
    expected: list[Expectation] = []
    absent: list[str] = []
    line: int | None = None
    file: str | None = None
    for text in path.read_text(encoding="utf-8").splitlines():
        if not text.startswith("#"):
            break
        key, _, value = text.lstrip("# ").partition(":")
        value = value.strip()
        if key == "expect-file":
            file = value
        elif key == "expect-line":
            line = int(value)
        elif key == "expect-message":
            assert line is not None, f"{path.name}: expect-message without an expect-line before it"
            expected.append(Expectation(line, value, file))
            line, file = None, None
        elif key == "expect-absent":
            absent.append(value)
    assert expected, f"{path.name} has no '# expect-line:' / '# expect-message:' header"
    assert line is None and file is None, f"{path.name}: an expect-line or expect-file without a message"
    return Case(path, expected, absent)


CASE_FILES = sorted(INVALID.glob("*.yaml"))


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    monkeypatch.delenv(UNSET_VARIABLE, raising=False)
    TAG_MARKER.unlink(missing_ok=True)
    yield
    assert not TAG_MARKER.exists(), "a YAML tag in the corpus was executed"


def validate(*paths: Path):
    result = CliRunner().invoke(app, ["validate", "--format", "json", *map(str, paths)])
    try:
        report = json.loads(result.output)
    except json.JSONDecodeError:
        pytest.fail(f"validate printed no JSON (exit {result.exit_code}):\n{result.output}")
    return result.exit_code, report


def _same_file(reported: str, path: Path) -> bool:
    return Path(reported).resolve() == path.resolve()


def _in_case(problem: dict, case: Case, expectation: Expectation) -> bool:
    if expectation.file is not None:
        return problem["file"].endswith(expectation.file)
    return _same_file(problem["file"], case.path)


def _show(problems: list[dict]) -> str:
    return "\n".join(f"  {p['file']}:{p['line']}:{p['col']}: {p['severity']}: {p['message']}"
                     for p in problems) or "  (none)"


def test_corpus_is_big_enough():
    assert len(CASE_FILES) >= 30
    assert len({p.stem.split("_")[0] for p in CASE_FILES}) == len(CASE_FILES), "case numbers repeat"


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.stem)
def test_invalid_pipeline(path: Path):
    case = read_case(path)
    exit_code, report = validate(path)
    problems = report["problems"]
    assert exit_code == EXIT_CONFIG, f"exit {exit_code}, problems:\n{_show(problems)}"
    assert report["valid"] is False
    errors = [p for p in problems if p["severity"] == "error"]
    for want in case.expected:
        matching = [p for p in errors if _in_case(p, case, want) and p["line"] == want.line
                    and want.message in p["message"]]
        assert matching, (f"expected an error at line {want.line} containing {want.message!r}"
                          f"{f' in a file ending with {want.file}' if want.file else ''}; "
                          f"reported:\n{_show(problems)}")
    for text in case.absent:
        unwanted = [p for p in errors if text in p["message"]]
        assert not unwanted, f"no error should contain {text!r}; reported:\n{_show(unwanted)}"


def test_whole_directory_in_one_pass():
    """Every case gets at least one error when the directory is validated at once."""
    exit_code, report = validate(INVALID)
    assert exit_code == EXIT_CONFIG
    assert report["valid"] is False
    assert sorted(Path(f).resolve() for f in report["files"]) == [p.resolve() for p in CASE_FILES]
    errors = [p for p in report["problems"] if p["severity"] == "error"]
    without = []
    for path in CASE_FILES:
        case = read_case(path)
        # Problems in another file (a stage module) are found through that case's expect-file.
        elsewhere = {e.file for e in case.expected if e.file}
        if not any(_same_file(p["file"], path) or any(p["file"].endswith(f) for f in elsewhere)
                   for p in errors):
            without.append(path.name)
    assert not without, f"no error reported for: {', '.join(without)}"


def test_python_tag_is_never_executed():
    exit_code, report = validate(INVALID / "05_python_tag.yaml")
    assert exit_code == EXIT_CONFIG
    assert not TAG_MARKER.exists()


def test_unset_variable_is_unset():
    assert UNSET_VARIABLE not in os.environ


def test_valid_pipeline():
    exit_code, report = validate(VALID / "ok.yaml")
    assert exit_code == 0, _show(report["problems"])
    assert report["valid"] is True
    assert [p for p in report["problems"] if p["severity"] == "error"] == []
