"""Fixtures every tier shares, and the tiers themselves: a test's tier is the folder it lives in."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from tests.support.projects import Project

# pytest-xdist's workers start with COLUMNS=80 in their environment, which the CLI's tables (and the
# runs the tests start) would be folded to: the tests see what a pipe or a log gets, as in one process
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


@pytest.fixture
def saved_crontab():
    """For tests that touch the real crontab: its bytes before the test (or None), put back afterwards."""
    import shutil

    from tests.support.crontabs import crontab_bytes, set_crontab

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



# Test tiers: a test's tier is the first folder under tests/ it lives in, and that folder's marker is
# set on it here, so `-m` selects tiers as paths do. A plain `pytest` runs tests/unit (pyproject's
# testpaths); `bash .ci/run` runs every tier. A test module outside these folders is refused.
TIERS = {
    "unit": ("unit",),  # no engine, no server, no pipeline run through the CLI: the tier run on every save
    "runs": ("runs",),  # whole runs on the in-process engines (python, the plugin engine), through the CLI
    "engines": ("engine",),  # starts an engine (Spark, Dask, Ray embedded; DuckDB, Polars): tests/engines/<engine>
    "clusters": ("engine", "cluster"),  # a Spark master, Dask scheduler, Ray head or Connect server, attached to
    "objectstore": ("engine", "objectstore"),  # an S3 server (moto) and the engines reading and writing it
    "cron": ("cron",),  # the real cron daemon and a scheduled run (up to about 2 minutes; needs root)
    "docs": ("docs",),  # the documentation site built strict, every example of it run, and opened in Chromium
}
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups set here
def pytest_collection_modifyitems(config, items):
    strays = set()
    for item in items:
        tier = _tier(item)
        if tier not in TIERS:
            strays.add(item.nodeid.split("::")[0])
            continue
        for marker in TIERS[tier]:
            item.add_marker(marker)
        item.add_marker(pytest.mark.xdist_group(_side_by_side_group(item, tier)))
    if strays:
        raise pytest.UsageError(f"test modules outside a tier folder: {', '.join(sorted(strays))}; move each into "
                                f"the folder of what it needs: {', '.join(f'tests/{t}/' for t in TIERS)}")
    _in_lane(config, items)


def _side_by_side_group(item, tier: str) -> str:
    """The tests pytest-xdist's workers (-n 2, `--dist loadgroup`) run one after another, in one worker:
    those that share what a machine has one of (the user's crontab and the cron daemon; the network
    namespaces' bridge and subnet of the cluster tier), and each module's own tests, so that a
    module's fixtures (an S3 server, started engines) are made once."""
    if tier == "cron" or "saved_crontab" in getattr(item, "fixturenames", ()) or item.get_closest_marker("crontab"):
        return "crontab"
    if tier == "clusters":
        return "network-namespaces"
    return item.nodeid.split("::")[0]


# `bash .ci/run` runs the suite in four pytest processes side by side (`--lane`), each one test at a time:
# - crontab: the "crontab" group, in the background: its tests mostly wait for the cron daemon's minute
#   ticks, and what they share (the user's crontab, the cron daemon) is then never used by two at once;
# - light: the tiers that start no engine, server or cluster (unit, runs, docs), in the background at a
#   lower CPU priority, on what the two heavy lanes leave idle;
# - engines and stores: the engine tests in one, the object-store then cluster tests in the other; each
#   heavy lane runs one test at a time, so at most two engine or cluster starts meet (a start starved
#   by more is what made those flaky), and the cluster tier comes last, once the light lane is likely done.
LANES = {"crontab": ("cron",), "light": ("unit", "runs", "docs"), "engines": ("engines",),
         "stores": ("objectstore", "clusters")}
BACKGROUND_LANES = ("crontab", "light", "stores")


def pytest_addoption(parser):
    parser.addoption("--lane", choices=tuple(LANES), default=None,
                     help="run only one lane of `bash .ci/run`: crontab (the tests that touch the crontab or the "
                          "cron daemon), light (the other tests of tests/unit, tests/runs, tests/docs), engines "
                          "(the other tests of tests/engines) or stores (the other tests of tests/objectstore, "
                          "then tests/clusters)")


def pytest_configure(config):
    config.addinivalue_line("markers", "crontab: uses the user's crontab or the cron daemon (or what doctor takes "
                                       "for it): runs in the crontab group and lane, never beside another such test")
    if config.getoption("lane") in BACKGROUND_LANES:
        # a background job of a script starts with SIGINT ignored, and so would every process its tests
        # start: Ctrl-C (or .ci/run's SIGTERM when it is stopped) ends the lane as Ctrl-C ends a pytest
        # in the foreground, once, its fixtures then stopping what they started (a cron daemon)
        signal.signal(signal.SIGINT, _interrupted)
        signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the fixtures' teardown short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _lane(item) -> str:
    tier = _tier(item)
    if _side_by_side_group(item, tier) == "crontab":
        return "crontab"
    return next(lane for lane, tiers in LANES.items() if tier in tiers)


def _in_lane(config, items) -> None:
    """Only the tests of `--lane`, if given; in the stores lane the cluster tier last (a stable sort: each
    module's tests stay together, so its fixtures are made once)."""
    lane = config.getoption("lane")
    if lane is None:
        return
    kept = [item for item in items if _lane(item) == lane]
    config.hook.pytest_deselected(items=[item for item in items if _lane(item) != lane])
    items[:] = sorted(kept, key=lambda item: LANES[lane].index(_tier(item)) if _tier(item) in LANES[lane] else -1)


def _tier(item) -> str:
    return Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
