"""`lineage:`, `mlflow:` and a dataset's `mlflow:` in the pipeline file: what is refused and how it
is said; validating such a pipeline imports neither tracker's client, nor Arrow, pandas or numpy."""

from __future__ import annotations

import pytest

from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ConfigError
from tests.unit.test_imports import DATA_LIBRARIES, loaded_after

BASE = """
name: demo
datasets:
  model: {kind: files, mlflow: {model: churn}}
stages:
  train: {run: 'mypkg.steps:train', outputs: [model]}
"""

STEPS = "def train(ctx):\n    (ctx.output_path('model') / 'm.txt').write_text('m')\n"


def pipeline_file(project, extra: str):
    project.stages(STEPS)
    return project.pipeline(BASE + extra)


@pytest.mark.parametrize("extra, says", [
    ("lineage: {transport: http}\n", "transport: http needs a url"),
    ("lineage: {transport: file}\n", "transport: file needs a path"),
    ("lineage: {url: 'ftp://host/x'}\n", "must be an http:// or https:// URL"),
    ("lineage: {url: 'http://h', apikey: x}\n", "apikey"),
    ("mlflow: {tracking: 'http://h'}\n", "tracking"),
])
def test_a_wrong_tracker_section_is_a_clear_error(project, extra, says):
    with pytest.raises(ConfigError) as raised:
        load_pipeline(pipeline_file(project, extra))
    assert says in str(raised.value)


def test_a_registered_model_must_be_a_files_output(project):
    project.stages(STEPS)
    path = project.pipeline(BASE.replace("{kind: files, mlflow: {model: churn}}", "{mlflow: {model: churn}}"))
    with pytest.raises(ConfigError) as raised:
        load_pipeline(path)
    assert "mlflow: {model: ...} needs kind: files" in str(raised.value)


def test_tracker_sections_load_without_their_clients(project):
    path = pipeline_file(project, "lineage: {url: 'http://marquez:5000', namespace: ml}\n"
                                  "mlflow: {experiment: churn}\n")
    pipeline = load_pipeline(path)
    assert pipeline.spec.lineage.url == "http://marquez:5000" and pipeline.spec.mlflow.experiment == "churn"
    assert pipeline.dataset("model").mlflow.model == "churn"
    watched = ("openlineage", "mlflow", *DATA_LIBRARIES)
    assert loaded_after(["validate", str(path)], watched=watched) == ""
