"""A store is checked before it is trusted, against a real S3 server (moto on 127.0.0.1) and a
fault-injecting proxy in front of it (tests/support/s3proxy.py): a store that ignores conditional
writes is refused (exit 69) before any lease is taken, and the check is kept in the workdir; the
bucket's content is data, never paths outside the cache; incomplete multipart uploads are aborted; a
batch delete that fails for some keys is reported; a fresh machine reads only the run records it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.s3proxy import S3Proxy
from tests.support.s3server import S3Endpoint
from tests.support.s3stores import every_store

pytestmark = pytest.mark.timeout(600)

STEPS = '''
import pandas as pd


def make(rows=3):
    return pd.DataFrame({"a": list(range(rows))})


def fail(a):
    raise RuntimeError("failed on purpose")
'''

PIPELINE = '''
name: small
workdir: s3://{bucket}/{prefix}
stages:
  make: {{run: "mypkg.steps:make", outputs: [a]}}
'''


S3_BUCKETS = ("trust",)
S3_CHECKS_SIGNATURES = False  # moto's: the proxy's edits must reach it (a signed header removed)
# (versitygw always checks them: the tests behind an editing proxy run on moto only)


@pytest.fixture
def proxy(s3, request):
    started = S3Proxy(s3.endpoint, **getattr(request, "param", {})).start()
    try:
        yield started
    finally:
        started.stop()


def hf(project, env: dict, *args: str, cache: Path) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env, "HYBRIDFLOW_CACHE": str(cache), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, env=environ,
                          capture_output=True, text=True, timeout=300)


def small(project, prefix: str, steps: str = STEPS, pipeline: str = PIPELINE) -> None:
    project.stages(steps)
    project.pipeline(pipeline.format(bucket="trust", prefix=prefix))


@pytest.mark.parametrize("proxy", [{"strip_conditions": True}], indirect=True)
def test_a_store_that_ignores_conditional_writes_is_refused_before_any_lease(project, s3, proxy, tmp_path):
    small(project, "stripped")
    done = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 69, done.stdout + done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert proxy.endpoint in line and "If-None-Match" in line and "If-Match" in line, line
    assert "Traceback" not in done.stderr
    assert s3.keys("trust/stripped/") == []  # no lease, no probe left behind, no answer kept
    collected = hf(project, proxy.env(s3), "gc", "pipeline.yaml", cache=tmp_path / "m1")
    assert collected.returncode == 69, collected.stdout + collected.stderr
    doctor = hf(project, proxy.env(s3), "doctor", "pipeline.yaml", cache=tmp_path / "m1")
    assert "ignores If-None-Match" in doctor.stdout + doctor.stderr, doctor.stdout + doctor.stderr


def test_a_store_that_honours_them_is_checked_once_and_the_answer_kept_per_endpoint(project, s3, proxy, tmp_path):
    small(project, "honoured")
    first = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert proxy.requested("PUT", "/.hybridflow/store-probe-")  # probed...
    keys = s3.keys("trust/honoured/.hybridflow/")
    assert keys == ["trust/honoured/.hybridflow/store-check.json"], keys  # ...and the probe deleted
    answer = s3.client().get_object(Bucket="trust", Key="honoured/.hybridflow/store-check.json")
    kept = json.loads(answer["Body"].read())
    assert kept[proxy.endpoint]["honoured"] is True

    proxy.requests.clear()
    again = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m2")  # another machine
    assert again.returncode == 0, again.stdout + again.stderr
    assert not proxy.requested("PUT", "/.hybridflow/store-probe-")  # the kept answer: one GET

    # the same workdir through a gateway that drops the conditions: another endpoint, checked afresh
    stripping = S3Proxy(s3.endpoint, strip_conditions=True).start()
    try:
        refused = hf(project, stripping.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m3")
    finally:
        stripping.stop()
    assert refused.returncode == 69 and stripping.endpoint in refused.stderr, refused.stdout + refused.stderr

    proxy.requests.clear()
    doctor = hf(project, proxy.env(s3), "doctor", "pipeline.yaml", cache=tmp_path / "m2")
    assert "conditional writes" in doctor.stdout and proxy.requested("PUT", "/.hybridflow/store-probe-"), doctor.stdout
    assert s3.keys("trust/honoured/.hybridflow/") == ["trust/honoured/.hybridflow/store-check.json"]


TWO_STAGES = PIPELINE + '''  use: {{run: "mypkg.steps:use", inputs: [a], outputs: [b]}}
'''
USE = STEPS + '''

def use(a):
    return a.assign(b=a["a"] * 2)
'''


def current(s3: S3Endpoint, prefix: str) -> dict[str, str]:
    answer = s3.client().get_object(Bucket="trust", Key=f"{prefix}/small/CURRENT")
    return json.loads(answer["Body"].read())["datasets"]


@pytest.mark.parametrize("proxy", [{"refuse_checksums": True}], indirect=True)
def test_a_store_that_predates_flexible_checksums_takes_every_write_and_delete(project, s3, proxy, tmp_path):
    """boto3 and pyarrow send CRC32 checksums by default (pyarrow's parts in aws-chunked encoding, with a
    trailer) and a DeleteObjects without Content-MD5, which stores that predate those checksums refuse.
    On a store other than AWS, hybridflow sends only the checksums the S3 API requires, and Content-MD5
    with a batch delete: in its own process and in the engines' worker processes (Dask's here)."""
    on_dask = TWO_STAGES.replace("outputs: [b]}}", "outputs: [b], backend: dask}}")
    small(project, "checksums", USE, on_dask + "backends: {{dask: {{n_workers: 1, processes: true}}}}\n")
    for machine in ("m1", "m2"):  # the second run replaces every version: gc then has some to delete
        done = hf(project, proxy.env(s3), "run", "pipeline.yaml", "--force", cache=tmp_path / machine)
        assert done.returncode == 0, done.stdout + done.stderr + str(proxy.refused)
    collected = hf(project, proxy.env(s3), "gc", "pipeline.yaml", "--keep", "1", cache=tmp_path / "m2")
    assert collected.returncode == 0 and "b@" in collected.stdout, collected.stdout + collected.stderr
    assert proxy.refused == []
    assert proxy.requested("PUT", "/checksums/small/datasets/b/")  # written by a Dask worker process
    assert [r for r in proxy.requests if r[0] == "POST" and r[2].startswith("delete")]  # the batch deletes


@every_store
def test_a_manifest_naming_a_path_outside_its_version_is_refused(project, s3, tmp_path):
    small(project, "manifest", USE, TWO_STAGES)
    done = hf(project, s3.env(), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    key = f"manifest/small/datasets/a/versions/{current(s3, 'manifest')['a']}/_manifest.json"
    manifest = json.loads(s3.client().get_object(Bucket="trust", Key=key)["Body"].read())
    manifest["files"][0]["path"] = "../../../../../../escaped.parquet"
    s3.client().put_object(Bucket="trust", Key=key, Body=json.dumps(manifest).encode())

    again = hf(project, s3.env(), "run", "pipeline.yaml", "--force", "use", cache=tmp_path / "m2")
    said = again.stdout + again.stderr
    assert again.returncode == 65, said
    assert "../../../../../../escaped.parquet" in said and "refused" in said and "Traceback" not in said
    assert not list(tmp_path.rglob("escaped.parquet")) and not list(project.root.rglob("escaped.parquet"))


def test_a_listed_key_holding_dotdot_is_never_downloaded_outside_the_folder(s3, tmp_path, monkeypatch):
    from hybridflow.data.storage import ObjectPath
    from hybridflow.data.stores.s3 import S3Settings
    from hybridflow.data.stores.s3objects import S3ObjectStore
    from hybridflow.data.untrusted import UntrustedValue

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    s3.put_bytes("trust/dl/run/logs/../../../../../escaped.txt", b"x")
    assert [k for k in s3.keys("trust/dl/") if "/../" in k]  # the store keeps the key as it was written
    objects, prefix = S3ObjectStore(S3Settings.of()), ObjectPath("trust/dl/run")
    with pytest.raises(UntrustedValue):
        objects.download(objects.files(prefix), prefix, tmp_path / "cache" / "a" / "b")
    assert not list(tmp_path.rglob("escaped.txt"))


@every_store
def test_a_run_record_whose_run_id_is_a_path_is_not_imported(project, s3, tmp_path):
    small(project, "records")
    done = hf(project, s3.env(), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    [key] = [k.split("/", 1)[1] for k in s3.keys("trust/records/runs/")]
    record = json.loads(s3.client().get_object(Bucket="trust", Key=key)["Body"].read())
    record["run"]["run_id"] = "../../../../evil-run"
    s3.client().put_object(Bucket="trust", Key="records/runs/29990101T000000Z-evil.json", Body=json.dumps(record))

    listed = hf(project, s3.env(), "runs", "-w", "s3://trust/records", cache=tmp_path / "m2")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "evil-run" not in listed.stdout and "refused" in listed.stderr, listed.stdout + listed.stderr
    assert "success" in listed.stdout  # the genuine record still is


@every_store
def test_a_cluster_record_whose_host_is_an_ssh_option_is_not_run(project, s3, tmp_path):
    small(project, "clusters", pipeline=PIPELINE + '''backends:
  dask:
    cluster: {{provider: ssh, hosts: [{{host: 127.0.0.1, head: true}}]}}
''')
    pwned = tmp_path / "PWNED"
    run_id = "20260101T000000Z-abcdef"
    record = {"run_id": run_id, "pipeline": "small", "engine": "dask", "provider": "ssh", "state": "up",
              "name": f"hf-small-{run_id}-dask", "created_at": "2026-01-01T00:00:00+00:00",
              "runner": {"host": "elsewhere", "pid": 1}, "cluster": {"hosts": [f"-oProxyCommand=touch {pwned}"]}}
    s3.client().put_object(Bucket="trust", Key=f"clusters/small/clusters/{run_id}-dask.json", Body=json.dumps(record))
    reaped = hf(project, s3.env(), "clusters", "reap", "pipeline.yaml", cache=tmp_path / "m1")
    said = reaped.stdout + reaped.stderr
    assert reaped.returncode != 0 and "-oProxyCommand" in said and "refused" in said, said
    assert not pwned.exists()
    assert s3.keys("trust/clusters/small/clusters/")  # its record stays, for a person to look at


def incomplete_upload(s3: S3Endpoint, key: str) -> None:
    client = s3.client()
    upload = client.create_multipart_upload(Bucket="trust", Key=key)["UploadId"]
    client.upload_part(Bucket="trust", Key=key, UploadId=upload, PartNumber=1, Body=b"x" * 1024)


def uploads(s3: S3Endpoint, prefix: str) -> list[str]:
    return [u["Key"] for u in s3.client().list_multipart_uploads(Bucket="trust", Prefix=prefix).get("Uploads", [])]


def test_gc_aborts_the_incomplete_uploads_a_killed_writer_left(project, s3, tmp_path):
    small(project, "uploads")
    done = hf(project, s3.env(), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    incomplete_upload(s3, "uploads/small/datasets/a/versions/20260101T000000000000Z-dead/part-0.parquet")
    incomplete_upload(s3, "uploads/small/runs/20260101T000000Z-dead/report.html")
    incomplete_upload(s3, "elsewhere/not-the-workdirs.bin")
    assert len(uploads(s3, "uploads/")) == 2
    collected = hf(project, s3.env(), "gc", "pipeline.yaml", cache=tmp_path / "m1")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert uploads(s3, "uploads/") == []  # moto says every upload began in 2010: older than a day
    assert uploads(s3, "elsewhere/") == ["elsewhere/not-the-workdirs.bin"]


@every_store
def test_a_failed_run_aborts_the_uploads_under_its_own_prefixes(s3, tmp_path, monkeypatch):
    from hybridflow.data.storage import ObjectPath
    from hybridflow.data.stores.s3 import S3Settings
    from hybridflow.data.stores.s3objects import S3ObjectStore
    from hybridflow.store.objectcatalog import ObjectCatalog

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    catalog = ObjectCatalog(tmp_path / "cache", ObjectPath("trust/failing/small"), S3ObjectStore(S3Settings.of()))
    staging = catalog.new_staging("run-1", "a", remote=True)  # where an engine writes the output
    incomplete_upload(s3, f"{staging.relative_to('trust')}/part-0.parquet")
    catalog.discard_staging("run-1")  # the run failed
    assert uploads(s3, "failing/") == []


@pytest.mark.parametrize("proxy", [{"refuse_deleting": "keep-me"}], indirect=True)
def test_a_batch_delete_that_fails_for_some_keys_is_reported(s3, proxy, monkeypatch):
    from hybridflow.data.storage import ObjectPath
    from hybridflow.data.stores.s3 import S3Settings
    from hybridflow.data.stores.s3objects import S3ObjectStore
    from hybridflow.errors import StorageError

    for name, value in proxy.env(s3).items():
        monkeypatch.setenv(name, value)
    for name in ("keep-me.parquet", "other.parquet", "more.parquet"):
        s3.put_bytes(f"trust/deleting/v1/{name}", b"x")
    with pytest.raises(StorageError) as raised:
        S3ObjectStore(S3Settings.of()).delete_tree(ObjectPath("trust/deleting/v1"))
    assert "did not delete 1 of 3 objects" in raised.value.message and "keep-me.parquet" in raised.value.message
    assert s3.keys("trust/deleting/") == ["trust/deleting/v1/keep-me.parquet"]


def test_a_fresh_machine_reads_only_the_run_records_it_needs(project, s3, proxy, tmp_path):
    small(project, "many")
    done = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    [key] = [k.split("/", 1)[1] for k in s3.keys("trust/many/runs/")]
    record = json.loads(s3.client().get_object(Bucket="trust", Key=key)["Body"].read())
    for day in range(1, 31):  # a month of older runs
        run_id = f"202001{day:02d}T030000Z-{day:06x}"
        old = {**record, "run": {**record["run"], "run_id": run_id, "started_at": f"2020-01-{day:02d}T03:00:00+00:00"}}
        s3.client().put_object(Bucket="trust", Key=f"many/runs/{run_id}.json", Body=json.dumps(old).encode())

    proxy.requests.clear()
    again = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m2")
    assert again.returncode == 0, again.stdout + again.stderr
    read = [path for method, path, query in proxy.requests if method == "GET" and "/many/runs/" in path]
    assert len(read) <= 2, read  # the newest (the run to compare with, or resume), not all 31

    proxy.requests.clear()
    shown = hf(project, proxy.env(s3), "runs", "-w", "s3://trust/many", "--limit", "5", cache=tmp_path / "m3")
    assert shown.returncode == 0 and shown.stdout.count("success") == 5, shown.stdout + shown.stderr
    assert len([p for m, p, q in proxy.requests if m == "GET" and "/many/runs/" in p]) <= 6
    older = hf(project, proxy.env(s3), "logs", "20200103", "-w", "s3://trust/many", cache=tmp_path / "m3")
    assert "no single run matches" not in older.stdout + older.stderr, older.stdout + older.stderr
