"""The workspace decides once where a workdir lives and hands out what lives there: in object storage
every piece shares its one store client; on this machine none is made. The layout stays as it was."""

from __future__ import annotations

from hybridflow.data.localcache import VARIABLE
from hybridflow.definition.config import load_pipeline
from hybridflow.store.catalog import Catalog
from hybridflow.store.clusterrecords import LocalRecords, ObjectRecords
from hybridflow.store.objectcatalog import ObjectCatalog
from hybridflow.store.workspace import Workspace

PIPELINE = """name: p
workdir: {workdir}
stages:
  a: {{run: "m:f", outputs: [b]}}
"""


def loaded(tmp_path, workdir: str):
    (tmp_path / "m.py").write_text("def f():\n    return None\n")
    file = tmp_path / "pipeline.yaml"
    file.write_text(PIPELINE.format(workdir=workdir))
    return load_pipeline(file, environ={VARIABLE: str(tmp_path / "cache")})


def test_a_workdir_in_object_storage_has_one_store_client_for_everything(tmp_path):
    pipeline = loaded(tmp_path, "s3://team-bucket/wd")
    workspace = Workspace.of(pipeline)
    catalog, lock, records = workspace.catalog(), workspace.lock(), workspace.cluster_records()
    assert isinstance(catalog, ObjectCatalog) and isinstance(records, ObjectRecords)
    assert catalog.objects is lock.lease.objects is records.objects is workspace.objects
    assert catalog.objects.settings is pipeline.store
    # the bucket's layout, and this machine's cache of it, as before
    assert (str(catalog.remote), str(lock.lease.path), str(records.prefix)) == \
        ("team-bucket/wd/p", "team-bucket/wd/p/LEASE", "team-bucket/wd/p/clusters")
    assert catalog.home == pipeline.workdir / "p" and lock.local.path == pipeline.workdir / "p" / "run.lock"
    assert str(pipeline.workdir).startswith(str(tmp_path / "cache"))


def test_a_local_workdir_makes_no_store_client(tmp_path):
    pipeline = loaded(tmp_path, str(tmp_path / "wd"))
    workspace = Workspace.of(pipeline)
    catalog, lock, records = workspace.catalog(), workspace.lock(), workspace.cluster_records()
    assert type(catalog) is Catalog and catalog.home == tmp_path / "wd" / "p"
    assert lock.lease is None and lock.local.path == tmp_path / "wd" / "p" / "run.lock"
    assert isinstance(records, LocalRecords) and records.folder == tmp_path / "wd" / "p" / "clusters"
    assert workspace.published_by({"run_dir": str(tmp_path / "wd" / "p" / "runs" / "r1"), "pipeline": "p"}) is None
    assert workspace.recorded_runs() is None and not (tmp_path / "wd").exists()  # nothing recorded: nothing made
    assert "objects" not in vars(workspace)  # never asked for: no client made


def test_a_workdir_named_by_its_uri_alone_reads_its_runs_through_the_same_client(tmp_path, monkeypatch):
    monkeypatch.setenv(VARIABLE, str(tmp_path / "cache"))
    workspace = Workspace.named("s3://team-bucket/wd")
    assert str(workspace.remote) == "team-bucket/wd" and workspace.pipeline is None
    assert str(workspace.local).startswith(str(tmp_path / "cache"))
    run = {"run_dir": str(workspace.local / "q" / "runs" / "r1"), "pipeline": "q"}
    published = workspace.published_by(run)  # a recorded run's catalog, for its report
    assert str(published.remote) == "team-bucket/wd/q" and published.objects is workspace.objects


EXTERNAL = """name: p
workdir: {workdir}
datasets:
  raw: {{path: data/raw}}
stages:
  a: {{run: "m:f", inputs: [raw], outputs: [b]}}
  c: {{run: "m:f", inputs: [b], outputs: [d]}}
"""


def test_a_dataset_is_located_the_same_way_published_or_external(tmp_path):
    import pyarrow as pa

    from hybridflow.data.tables import write_arrow
    from hybridflow.execution.inputs import StageInputs
    from hybridflow.execution.planner import Planner

    (tmp_path / "m.py").write_text("def f(**inputs):\n    return None\n")
    (tmp_path / "data" / "raw").mkdir(parents=True)
    write_arrow(pa.table({"x": [1, 2, 3]}), tmp_path / "data" / "raw")
    file = tmp_path / "pipeline.yaml"
    file.write_text(EXTERNAL.format(workdir=tmp_path / "wd"))
    pipeline = load_pipeline(file, environ={VARIABLE: str(tmp_path / "cache")})
    workspace = Workspace.of(pipeline)
    assert workspace.catalog() is workspace.catalog()  # one catalog: the run's commits and their journal

    raw = workspace.locate("raw")
    assert raw.external and raw.found and raw.path == tmp_path / "data" / "raw" and raw.version is None
    assert raw.store is None and raw.filesystem is None and raw.uri == str(tmp_path / "data" / "raw")
    assert not workspace.locate("b").found and not workspace.locate("b").external  # not published yet

    inputs = StageInputs(workspace, Planner(pipeline, workspace, False))
    (tmp_path / "wd").mkdir()  # as a run's store makes it
    assert inputs.paths("b") == [] and inputs.version_of("b") == "unknown"
    staging = workspace.catalog().new_staging("run1", "b")
    write_arrow(pa.table({"y": [1.0, 2.0]}), staging)
    version = workspace.catalog().publish("b", staging, kind="table", stage="a", run_id="run1", inputs={})
    assert inputs.paths("b") == []  # what this run located stays until it commits there
    inputs.committed(["b"])
    b = workspace.locate("b")
    assert (b.version.id, b.path, b.external) == (version.id, version.directory, False)
    assert inputs.paths("b") == [version.directory] and inputs.version_of("b") == version.id
    assert inputs.version_of("raw").startswith("external:") and inputs.paths("raw") == [raw.path]
    rows, size = inputs.size(["raw", "b"])
    assert rows == 3 + 2 and size == version.bytes + sum(f.stat().st_size for f in raw.path.iterdir())
