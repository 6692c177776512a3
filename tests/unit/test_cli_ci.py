"""The README's test command is CI's (.ci/run), it fails when it should, and no skip goes unexplained."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def quickstart_commands() -> list[str]:
    section = REPO.joinpath("README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)]


def test_the_readme_quickstart_is_two_commands_and_its_tests_are_what_ci_runs():
    install_and_run, test = quickstart_commands()
    assert "\n" not in install_and_run and "hybridflow run configs/weekly_retrain.yaml" in install_and_run
    assert test == "bash .ci/run"  # one command for people and for CI: they cannot drift apart
    script = REPO / ".ci" / "run"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=60)


def fake_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """.ci/run in a directory whose .venv python only records what it was asked, and pytest exits with
    $FAKE_PYTEST_EXIT; on a PATH with no apt-get and no python3 (so nothing is installed or created)."""
    root = tmp_path / "checkout"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "run", root / ".ci" / "run")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(textwrap.dedent("""\
        #!/bin/sh
        echo "$*" >> "$(dirname "$0")/calls"
        [ "$2" = pytest ] && exit "$FAKE_PYTEST_EXIT"
        exit 0
        """))
    python.chmod(0o755)
    (python.parent / "activate").write_text(f'PATH="{python.parent}:$PATH"\nexport PATH\n')  # as venv's does
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("id", "dirname", "sh", "cat", "rm", "nice"):
        os.symlink(shutil.which(tool), tools / tool)
    return root, {"PATH": str(tools), "HOME": str(tmp_path)}


def test_ci_run_passes_on_arguments_and_fails_when_pytest_fails_or_collects_nothing(tmp_path):
    root, env = fake_checkout(tmp_path)
    script = str(root / ".ci" / "run")
    for pytest_exit in (0, 1, 2, 5):
        done = subprocess.run(["/bin/bash", script, "-m", "not cron"], capture_output=True, text=True,
                              env={**env, "FAKE_PYTEST_EXIT": str(pytest_exit)}, timeout=120)
        assert done.returncode == pytest_exit, (pytest_exit, done.stderr)
        if pytest_exit == 5:
            assert "pytest collected no tests (arguments: -m not cron)" in done.stderr
    calls = (root / ".venv" / "bin" / "calls").read_text().splitlines()
    # the existing virtualenv is reused (no python3 on PATH to make another); pip runs every time, from its
    # cache, and so do the fetchers of Spark's connectors, the builds of versitygw and fake-gcs-server and the
    # install of Azurite (no-ops once cached)
    assert calls[:7] == ["-m pip install --disable-pip-version-check --quiet -e .[test]",
                         "-m hybridflow.backends.spark_s3_jars", "-m hybridflow.backends.spark_lineage_jar",
                         "-m hybridflow.backends.spark_gcs_jar", "-m tests.support.versitygw",
                         "-m tests.support.gcsserver", "-m tests.support.azurite"]
    # every tier, in four lanes side by side, each one test at a time
    assert sorted(calls[7:11]) == ["-m pytest tests -n 0 --lane crontab --durations=10 -m not cron",
                                   "-m pytest tests -n 0 --lane engines --durations=30 -m not cron",
                                   "-m pytest tests -n 0 --lane light --durations=10 -m not cron",
                                   "-m pytest tests -n 0 --lane stores --durations=20 -m not cron"]
    assert len(calls) == 4 * 11  # the same eleven calls, in each of the four runs


def test_ci_run_fails_when_any_lane_fails_and_when_none_has_a_test(tmp_path):
    root, env = fake_checkout(tmp_path)
    python = root / ".venv" / "bin" / "python"
    # each lane's pytest says it ran, and exits with $FAKE_<LANE>_EXIT
    python.write_text(python.read_text().replace(
        '[ "$2" = pytest ] && exit "$FAKE_PYTEST_EXIT"',
        'lane="${*#*--lane }"; lane="${lane%% *}"\n'
        '[ "$2" = pytest ] && echo "the $lane lane ran" && eval exit "\\$FAKE_${lane}_EXIT"'))
    outcomes = {(0, 0, 0, 0): 0, (0, 1, 0, 0): 1, (0, 0, 2, 0): 2, (1, 0, 0, 0): 1, (2, 1, 0, 0): 2, (0, 0, 0, 1): 1,
                (5, 0, 0, 0): 0, (0, 5, 5, 5): 0, (5, 5, 1, 5): 1, (5, 1, 5, 5): 1, (1, 5, 5, 5): 1, (5, 5, 5, 2): 2,
                (5, 5, 5, 5): 5}
    for (engines, crontab, light, stores), expected in outcomes.items():
        done = subprocess.run(["/bin/bash", str(root / ".ci" / "run")], capture_output=True, text=True, timeout=120,
                              env={**env, "FAKE_engines_EXIT": str(engines), "FAKE_crontab_EXIT": str(crontab),
                                   "FAKE_light_EXIT": str(light), "FAKE_stores_EXIT": str(stores)})
        assert done.returncode == expected, (engines, crontab, light, stores, done.stderr)
        for lane in ("engines", "stores", "crontab", "light"):  # every lane's output is shown
            assert f"the {lane} lane ran" in done.stdout, done.stdout
        assert ("pytest collected no tests" in done.stderr) == (expected == 5), done.stderr


def test_ci_run_runs_only_the_tests_named_where_a_path_or_node_id_is_given(tmp_path):
    root, env = fake_checkout(tmp_path)
    (root / "tests" / "unit").mkdir(parents=True)
    (root / "tests" / "unit" / "test_one.py").write_text("")
    for given in (["tests/unit"], ["-x", "tests/unit/test_one.py::test_it"]):
        done = subprocess.run(["/bin/bash", str(root / ".ci" / "run"), *given], capture_output=True, text=True,
                              env={**env, "FAKE_PYTEST_EXIT": "0"}, timeout=120, cwd=root)
        assert done.returncode == 0, done.stderr
    calls = [c for c in (root / ".venv" / "bin" / "calls").read_text().splitlines() if c.startswith("-m pytest")]
    lanes = [f"-m pytest -n 0 --lane {lane} --durations={shown}"
             for lane, shown in (("crontab", 10), ("light", 10), ("stores", 20), ("engines", 30))]
    assert sorted(calls) == sorted([f"{lane} tests/unit" for lane in lanes] +
                                   [f"{lane} -x tests/unit/test_one.py::test_it" for lane in lanes])


def test_the_session_ends_with_every_skipped_test_and_why(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_terminal_summary  # noqa: F401\n")
    (tmp_path / "test_some.py").write_text(textwrap.dedent("""\
        import pytest

        @pytest.fixture
        def crontab():
            pytest.skip("the crontab command is not installed (apt-get install cron)")

        def test_runs():
            pass

        def test_schedule(crontab):
            pass

        def test_cron_line(crontab):
            pass

        @pytest.mark.skip(reason="needs a GPU")
        def test_gpu():
            pass
        """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.split("3 tests skipped, not run", 1)[1]
    assert ("the crontab command is not installed (apt-get install cron):\n"
            "  test_some.py::test_schedule\n  test_some.py::test_cron_line\n"
            "needs a GPU:\n  test_some.py::test_gpu\n") in summary, done.stdout


def test_every_fetch_command_ci_runs_is_a_module_with_an_entry_point():
    """`.ci/run` fetches Spark's jars with `python -m hybridflow...`: each such module imports, and its
    command is its `main` (a module that cannot import stops the whole run before any test)."""
    import importlib

    modules = re.findall(r"^python -m (hybridflow\.[\w.]+)", (REPO / ".ci" / "run").read_text(), re.M)
    assert len(modules) == 3
    for name in modules:
        assert callable(importlib.import_module(name).main), name
