import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.tables import read_arrow, write_arrow
from hybridflow.errors import DataError
from hybridflow.store.catalog import MANIFEST, Catalog

TABLE = pa.table({"id": pa.array([1, None, 3], pa.int64()), "name": ["a", "b", None]})


def publish(catalog: Catalog, table: pa.Table, run_id: str = "run1", **kwargs):
    staging = catalog.new_staging(run_id, "things")
    write_arrow(table, staging)
    return catalog.publish("things", staging, kind="table", stage="make", run_id=run_id, inputs={}, **kwargs)


def test_publish_then_read_back_through_the_manifest(tmp_path):
    catalog = Catalog(tmp_path / "home")
    version = publish(catalog, TABLE)
    current = catalog.current("things")
    assert current.id == version.id
    assert current.rows == 3 and current.manifest["stage"] == "make" and current.manifest["run_id"] == "run1"
    assert current.manifest["schema"] == {"id": "int64", "name": "string"}
    for entry in current.manifest["files"]:
        assert (current.directory / entry["path"]).stat().st_size == entry["size"]
        assert len(entry["sha256"]) == 64
    assert read_arrow(current.source()).equals(TABLE)
    assert not (catalog.staging_root() / "run1" / "things").exists()


def test_new_version_replaces_pointer_and_keeps_old_files(tmp_path):
    catalog = Catalog(tmp_path / "home")
    first = publish(catalog, TABLE, "run1")
    second = publish(catalog, TABLE.slice(0, 1), "run2")
    assert catalog.current("things").id == second.id != first.id
    assert (first.directory / MANIFEST).exists()  # immutable old version is untouched
    assert read_arrow(catalog.current("things").source()).num_rows == 1


def test_schema_mismatch_publishes_nothing(tmp_path):
    catalog = Catalog(tmp_path / "home")
    first = publish(catalog, TABLE, "run1")
    with pytest.raises(DataError) as info:
        publish(catalog, TABLE, "run2", declared={"id": pa.int32(), "missing": pa.string()})
    message = str(info.value)
    assert "column 'id': expected int32, got int64" in message
    assert "column 'missing' is missing" in message
    assert "column 'name' (string) is not in the declared schema" in message
    assert catalog.current("things").id == first.id


def test_string_flavours_satisfy_a_string_contract(tmp_path):
    catalog = Catalog(tmp_path / "home")
    table = pa.table({"s": pa.array(["x"], pa.large_string()), "d": pa.array(["y"]).dictionary_encode()})
    publish(catalog, table, declared={"s": pa.string(), "d": pa.string()})


def test_nanosecond_timestamps_are_stored_as_microseconds_and_never_truncated(tmp_path):
    catalog = Catalog(tmp_path / "home")
    exact = pa.table({"ts": pa.array([1_000_000_000_000_000], pa.timestamp("ns", "UTC"))})
    version = publish(catalog, exact)
    assert pq.read_schema(version.files[0]).field("ts").type == pa.timestamp("us", "UTC")
    lossy = pa.table({"ts": pa.array([1_000_000_000_000_001], pa.timestamp("ns", "UTC"))})
    with pytest.raises(pa.ArrowInvalid, match="would lose data"):
        publish(catalog, lossy, "run2")


def test_files_output_is_published_with_hashes(tmp_path):
    catalog = Catalog(tmp_path / "home")
    staging = catalog.new_staging("run1", "model")
    (staging / "sub").mkdir()
    (staging / "sub" / "weights.bin").write_bytes(b"\x00" * 10)
    version = catalog.publish("model", staging, kind="files", stage="train", run_id="run1", inputs={})
    assert [f["path"] for f in version.manifest["files"]] == ["sub/weights.bin"]
    assert "rows" not in version.manifest
    assert (catalog.current("model").directory / "sub" / "weights.bin").read_bytes() == b"\x00" * 10


def test_corrupt_parquet_is_refused(tmp_path):
    catalog = Catalog(tmp_path / "home")
    staging = catalog.new_staging("run1", "things")
    (staging / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        catalog.publish("things", staging, kind="table", stage="s", run_id="run1", inputs={})
    assert catalog.current("things") is None


@pytest.mark.parametrize("name", ["", ".", "..", "../../etc", "/etc", "a/b"])
def test_names_that_are_not_one_path_component_are_refused(tmp_path, name):
    catalog = Catalog(tmp_path / "home")
    with pytest.raises(DataError, match="refusing"):
        catalog.dataset_dir(name)
    with pytest.raises(DataError, match="refusing"):
        catalog.new_staging(name, "things")
    with pytest.raises(DataError, match="refusing"):
        catalog.discard_staging(name) if name else catalog.new_staging("run1", name)


def test_corrupt_pointer_is_a_data_error(tmp_path):
    catalog = Catalog(tmp_path / "home")
    publish(catalog, TABLE)
    (catalog.dataset_dir("things") / "CURRENT").write_text("{not json")
    with pytest.raises(DataError, match="corrupt"):
        catalog.current("things")


def prepare(catalog: Catalog, name: str, table: pa.Table, run_id: str):
    staging = catalog.new_staging(run_id, name)
    write_arrow(table, staging)
    return catalog.prepare(name, staging, kind="table", stage="make", run_id=run_id, inputs={})


def test_a_stage_commit_cut_short_reads_as_done_and_is_finished_by_recover(tmp_path):
    catalog = Catalog(tmp_path / "home")
    catalog.commit_together([prepare(catalog, "a", TABLE, "run1"), prepare(catalog, "b", TABLE, "run1")])
    new = [prepare(catalog, "a", TABLE.slice(0, 1), "run2"), prepare(catalog, "b", TABLE.slice(0, 2), "run2")]
    # a crash right after the first pointer: the journal names both, the second pointer is still old
    (catalog.home / "COMMITTING").write_text('{"a": "%s", "b": "%s"}' % (new[0].id, new[1].id))
    catalog.commit(new[0])
    assert (catalog.dataset_dir("b") / "CURRENT").read_text().find(new[1].id) == -1
    assert catalog.current("a").id == new[0].id and catalog.current("b").id == new[1].id  # readers: both new
    assert catalog.recover() == ["a", "b"]
    assert not (catalog.home / "COMMITTING").exists()
    assert new[1].id in (catalog.dataset_dir("b") / "CURRENT").read_text()
    assert catalog.recover() == []


def test_gc_removes_versions_that_were_prepared_but_never_made_current(tmp_path):
    catalog = Catalog(tmp_path / "home")
    publish(catalog, TABLE, "run1")
    kept = publish(catalog, TABLE.slice(0, 1), "run2")
    orphan = prepare(catalog, "things", TABLE.slice(0, 2), "run3")  # the stage's other output then failed
    assert catalog.collect_garbage(keep=5, dry_run=True) == [("things", orphan.id)]
    catalog.collect_garbage(keep=5)
    assert catalog.versions("things")[-1] == kept.id and not orphan.directory.exists()
    assert catalog.current("things").id == kept.id
