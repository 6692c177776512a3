"""An upgrade of a library a stage imports makes it run again, and `plan` and the run say which
(tinylib 1.0 -> 1.1); `rerun_on_library_upgrade: false` only says so. Through the real CLI, with a
tiny distribution installed into a directory on the subprocess's PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog
from tests.runs.test_skipping import plan_rows, statuses
from tests.support.distributions import install

STAGES = '''
import pandas as pd


def make():
    return pd.DataFrame({"x": [1, 2, 3]})


def fit(made):
    import tinylib
    return made.assign(version=tinylib.VERSION)
'''

PIPELINE = '''
name: models
stages:
  make: {run: mypkg.steps:make, outputs: [made]}
  fit: {run: mypkg.steps:fit, inputs: [made], outputs: [fitted]}
'''

UPGRADED = "tinylib 1.0 -> 1.1 since the last run"


def hybridflow(project, *args):
    path = os.pathsep.join([str(project.root.parent / "site"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def setup(project, pipeline=PIPELINE):
    install(project.root.parent / "site", "tinylib", "1.0", "tinylib")
    project.stages(STAGES)
    project.pipeline(pipeline)
    hybridflow(project, "run", "pipeline.yaml")


def fitted_version(project) -> set[str]:
    version = Catalog(project.home("models")).current("fitted")
    return set(read_arrow(version.source()).column("version").to_pylist())


def test_an_upgrade_reruns_the_stages_that_import_it_and_says_so(project):
    setup(project)
    assert fitted_version(project) == {"1.0"}
    assert "0 of 2 stages to run" in hybridflow(project, "plan", "pipeline.yaml").stdout
    install(project.root.parent / "site", "tinylib", "1.1", "tinylib")
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml").stdout)
    assert rows == {"make": ("skip", rows["make"][1]), "fit": ("run", UPGRADED)}
    run = hybridflow(project, "run", "pipeline.yaml")
    assert UPGRADED in run.stdout  # the run's table
    assert statuses(project)["fit"] == ("done", UPGRADED) and statuses(project)["make"][0] == "skipped"
    assert fitted_version(project) == {"1.1"}
    manifest = Catalog(project.home("models")).current("fitted").manifest
    assert manifest["fingerprint"]["libraries"]["tinylib"] == "1.1"
    assert "0 of 2 stages to run" in hybridflow(project, "plan", "pipeline.yaml").stdout


def test_with_the_setting_off_an_upgrade_is_shown_but_reruns_nothing(project):
    setup(project, "rerun_on_library_upgrade: false\n" + PIPELINE)
    install(project.root.parent / "site", "tinylib", "1.1", "tinylib")
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml").stdout)
    assert rows["fit"][0] == "skip" and UPGRADED in rows["fit"][1], rows
    hybridflow(project, "run", "pipeline.yaml")
    status, reason = statuses(project)["fit"]
    assert status == "skipped" and reason.startswith("unchanged since run") and UPGRADED in reason
    assert "rerun_on_library_upgrade is false" in reason
    assert fitted_version(project) == {"1.0"}


def test_outputs_recorded_without_versions_are_not_rerun(project):
    """Outputs published by a hybridflow that kept no versions: unchanged, until the stage next runs."""
    setup(project)
    manifest_file = Catalog(project.home("models")).current("fitted").directory / "_manifest.json"
    manifest_file.chmod(0o644)  # published read-only
    manifest = json.loads(manifest_file.read_text())
    del manifest["fingerprint"]["libraries"]
    manifest_file.write_text(json.dumps(manifest))
    install(project.root.parent / "site", "tinylib", "1.1", "tinylib")
    assert "0 of 2 stages to run" in hybridflow(project, "plan", "pipeline.yaml").stdout
