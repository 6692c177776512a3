"""OpenLineage events of a run whose workdir is in object storage (a real S3 server, moto, on
127.0.0.1): its datasets are named by the store's bucket and key, at the versions its pointer holds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.objectstore.test_s3_workdir import current_versions
from tests.support.openlineage import LineageReceiver, validate
from tests.support.s3server import S3Server
from tests.unit.test_runner import STAGES

PIPELINE = """
name: tracked
workdir: s3://lineage-wd/team
stages:
  make: {{run: 'mypkg.steps:make', outputs: [numbers, meta]}}
  sink: {{run: 'mypkg.steps:empty', inputs: [numbers], outputs: [nothing]}}
lineage:
  url: {url}
"""


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log").start()
    try:
        yield server
    finally:
        server.stop()


def test_datasets_in_object_storage_are_named_by_bucket_and_key(project, s3, tmp_path):
    s3.bucket("lineage-wd")
    receiver = LineageReceiver()
    try:
        project.stages(STAGES)
        path = project.pipeline(PIPELINE.format(url=receiver.url))
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
        done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(path)], cwd=project.root,
                              env={**environ, **s3.env(), "HYBRIDFLOW_CACHE": str(tmp_path / "cache")},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        events = receiver.events
    finally:
        receiver.close()
    for event in events:
        validate(event)
    versions = current_versions(s3, "lineage-wd/team/tracked")
    [sink_end] = [e for e in events if e["job"]["name"] == "tracked.sink" and e["eventType"] == "COMPLETE"]
    [numbers] = sink_end["inputs"]
    assert numbers["namespace"] == "s3://lineage-wd" and numbers["name"] == "team/tracked/datasets/numbers"
    assert numbers["facets"]["version"]["datasetVersion"] == versions["numbers"]
    [nothing] = sink_end["outputs"]
    assert (nothing["namespace"], nothing["name"]) == ("s3://lineage-wd", "team/tracked/datasets/nothing")
    assert nothing["outputFacets"]["outputStatistics"]["rowCount"] == 0
    assert nothing["facets"]["version"]["datasetVersion"] == versions["nothing"]
