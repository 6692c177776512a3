"""A stage try's publication: the versions it prepared go when the try ends before their commit began,
and stay once it began (the catalog's journal finishes or undoes a commit, never the publication)."""

from __future__ import annotations

import logging

import pandas as pd

from hybridflow import backends
from hybridflow.definition.config import load_pipeline
from hybridflow.execution.publisher import Publisher
from hybridflow.execution.runner import Runner
from hybridflow.execution.stageerrors import StageErrors
from hybridflow.execution.stopping import SignalState
from hybridflow.results import StageResult

PIPELINE = """
name: pub
stages:
  make: {run: mypkg.steps:make, outputs: [numbers, notes]}
datasets:
  notes: {kind: files}
"""


def test_versions_prepared_but_never_committed_are_discarded_and_committed_ones_kept(project, tmp_path):
    project.stages("def make():\n    return None\n")
    pipeline = load_pipeline(project.pipeline(PIPELINE))
    session = Runner(pipeline).session
    publisher = Publisher(pipeline, session.catalog, session.inputs,
                          StageErrors(pipeline, session.inputs, session.home), SignalState())
    backend = backends.create("python", None, tmp_path)

    def prepared(run_id: str):
        publication = publisher.begin(run_id, StageResult("make", "python"), backend, logging.getLogger("test"),
                                      session.planner.decide("make"))
        (publication.files_dirs["notes"] / "note.txt").write_text("a note")  # as the stage fills it
        publication.prepare({"numbers": pd.DataFrame({"id": [1, 2, 3]})})
        return publication

    def versions(dataset: str) -> list[str]:
        folder = session.catalog.dataset_dir(dataset) / "versions"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []

    stopped = prepared("run-1")
    assert len(versions("numbers")) == len(versions("notes")) == 1
    stopped.discard()  # the try ended after prepare, before its commit began
    assert versions("numbers") == versions("notes") == []
    assert session.catalog.current("numbers") is None

    committed = prepared("run-2")
    committed.commit()
    committed.discard()  # too late: the commit began, and made them current
    assert versions("numbers") == [session.catalog.current("numbers").id]
    assert session.catalog.current("numbers").rows == 3
    assert versions("notes") == [session.catalog.current("notes").id]
