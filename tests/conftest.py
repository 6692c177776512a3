"""Shared helpers: small throwaway projects (a pipeline file plus its stage module) in tmp_path."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    def pipeline(self, text: str, name: str = "pipeline.yaml") -> Path:
        return self.write(name, text)

    def stages(self, code: str, module: str = "steps") -> Path:
        self.write("mypkg/__init__.py", "")
        return self.write(f"mypkg/{module}.py", code)

    def home(self, pipeline: str) -> Path:
        return self.root / ".hybridflow" / pipeline


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


def last_run_record(workdir: Path) -> tuple[dict, dict[str, dict]]:
    """The newest run in <workdir>/runs.db and its stages by name."""
    from hybridflow.state import RunStore

    store = RunStore(workdir / "runs.db")
    [run] = store.runs(limit=1)
    return run, {s["stage"]: s for s in store.stages(run["run_id"])}


@pytest.fixture
def saved_crontab():
    """For tests that touch the real crontab: its bytes before the test (or None), put back afterwards."""
    import shutil

    from .crontabs import crontab_bytes, set_crontab

    if shutil.which("crontab") is None:
        pytest.skip("the crontab command is not installed (apt-get install cron)")
    saved = crontab_bytes()
    try:
        yield saved
    finally:
        set_crontab(saved)


def pytest_terminal_summary(terminalreporter):
    """At the end of the session, every skipped test by name with its reason. A skip is never silent:
    -ra's summary names the line that raised the skip (often a fixture here), not the tests it cost."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    by_reason: dict[str, list[str]] = {}
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        by_reason.setdefault(reason.removeprefix("Skipped: ") or "no reason given", []).append(report.nodeid)
    count = f"{len(skipped)} test{'s' * (len(skipped) != 1)}"
    terminalreporter.section(f"{count} skipped, not run", sep="=", yellow=True, bold=True)
    for reason, tests in by_reason.items():
        terminalreporter.line(f"{reason}:", yellow=True)
        for nodeid in tests:
            terminalreporter.line(f"  {nodeid}")


@pytest.fixture
def fake_crontab(tmp_path, monkeypatch) -> Path:
    """A `crontab` command first on PATH that keeps the table in a file: the real crontab is never touched."""
    table = tmp_path / "crontab.txt"
    command = tmp_path / "bin" / "crontab"
    command.parent.mkdir()
    command.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          -l) [ -f "{table}" ] && exec cat "{table}"; echo "no crontab for $(id -un)" >&2; exit 1 ;;
          -) exec cat > "{table}" ;;
          *) echo "fake crontab: $*" >&2; exit 2 ;;
        esac
        """))
    command.chmod(0o755)
    monkeypatch.setenv("PATH", f"{command.parent}:/usr/bin:/bin")
    return table



# Test tiers (markers registered in pyproject.toml). `pytest -m "not engine and not cluster and not cron"`
# is the fast tier a contributor runs on every change; CI runs everything.
# a Spark master, Dask scheduler or Ray head
CLUSTER_MODULES = {"test_attach", "test_multihost", "test_cluster_provisioning", "test_ssh_clusters"}
# modules whose tests run the real engines, or the examples that use them, throughout
ENGINE_MODULES = {"test_backends", "test_engine_lifecycle", "test_everyday_frames", "test_three_engines",
                  "test_weekly_retrain", "test_cli_retrain", "test_stopping", "test_secret_engines", "test_bad_inputs",
                  "test_engine_chatter"}
ENGINE_NAMED = re.compile(r"spark|dask|ray", re.IGNORECASE)  # a test (or its parameters) naming an engine


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module in CLUSTER_MODULES:
            item.add_marker(pytest.mark.cluster)
        if module in ENGINE_MODULES or module in CLUSTER_MODULES or "engines" in item.fixturenames \
                or ENGINE_NAMED.search(item.name):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def embedded_answer(tmp_path_factory) -> list[tuple]:
    """The multi-host pipeline's answer on embedded engines (tests/test_multihost.py), for the tests
    that run it on clusters on other hosts."""
    from .test_multihost import embedded_run

    return embedded_run(tmp_path_factory)
