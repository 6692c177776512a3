"""Azure Blob Storage as a store (az://), against a real emulator (Azurite on 127.0.0.1, an account and
key made for the run): Put Blob's conditions refuse a second create-only write and a stale
compare-and-swap, a write whose answer was lost on the way back is recognised as ours when the
library's retry meets it, trees of files go up, down and are listed, copied and deleted, the store
check trusts it and keeps its answer, a missing or wrong key is one line with exit 74 that shows no
secret, Spark (no connector for az://) reads and writes it through copies on this machine, and a Spark
cluster there is refused at its line (exit 78). The pipeline suite on every engine runs on it too
(test_s3_workdir.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.data.objectstore import Conflict
from hybridflow.data.storage import object_path, settings_for
from tests.support.s3proxy import S3Proxy, conditional_put
from tests.support.s3stores import start_store

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def az(tmp_path_factory):
    server = start_store("azurite", tmp_path_factory.mktemp("azurite"))  # skips, saying why, where it is not installed
    try:
        server.bucket("lake")
        yield server
    finally:
        server.stop()


@pytest.fixture
def objects(az, monkeypatch):
    for name, value in az.env().items():
        monkeypatch.setenv(name, value)
    return settings_for("az://lake").objects()


def test_put_blob_conditions_refuse_a_second_create_and_a_stale_swap(objects):
    path = object_path("az://lake/conditions/CURRENT")
    first = objects.write_json(path, {"v": 1}, create_only=True)
    with pytest.raises(Conflict):
        objects.write_json(path, {"v": 2}, create_only=True)
    second = objects.write_json(path, {"v": 3}, if_match=first)
    assert second != first
    with pytest.raises(Conflict):
        objects.write_json(path, {"v": 4}, if_match=first)  # stale: written since
    with pytest.raises(Conflict):
        objects.write_json(object_path("az://lake/conditions/never"), {"v": 5}, if_match=second)  # gone
    with pytest.raises(Conflict):
        objects.delete(path, if_match=first)
    assert objects.read_json(path) == ({"v": 3}, second)
    objects.delete(path, if_match=second)
    assert objects.read_json(path) == (None, None)


def test_conditional_writes_whose_answers_were_lost_are_taken_as_ours(az, monkeypatch):
    # the store acts, the answer never arrives, the library sends the same write again and its
    # condition fails against the write it made itself
    proxy = S3Proxy(az.endpoint).start()
    try:
        created = proxy.drop_answer(lambda m, p, h: conditional_put("/lost/LEASE")(m, p, h) and "if-none-match" in h)
        swapped = proxy.drop_answer(lambda m, p, h: conditional_put("/lost/LEASE")(m, p, h) and "if-match" in h)
        proxied = az.connection_string.replace(az.endpoint, f"{proxy.endpoint}/{az.account}")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", proxied)
        objects = settings_for("az://lake").objects()
        path = object_path("az://lake/lost/LEASE")
        made = objects.write_json(path, {"holder": "run-1"}, create_only=True)
        again = objects.write_json(path, {"holder": "run-1", "n": 2}, if_match=made)
        with pytest.raises(Conflict):  # another writer's bytes are still a lost race
            objects.write_json(path, {"holder": "run-2"}, create_only=True)
    finally:
        proxy.stop()
    assert len(created.dropped) == 1 and len(swapped.dropped) == 1
    assert len(proxy.requested("PUT", "/lost/LEASE")) == 5  # each dropped write was sent twice
    assert objects.read_json(path) == ({"holder": "run-1", "n": 2}, again)


def test_trees_go_up_and_down_and_are_listed_copied_and_deleted(objects, tmp_path):
    local = tmp_path / "tree"
    (local / "part=a").mkdir(parents=True)
    (local / "part=a" / "f.bin").write_bytes(b"x" * 3000)
    (local / "top.txt").write_text("hello")
    remote = object_path("az://lake/trees/v1")
    objects.upload(local, remote)

    listed = objects.listing(remote)
    assert [(str(p), size) for p, size, _ in listed] == [("lake/trees/v1/part=a/f.bin", 3000),
                                                          ("lake/trees/v1/top.txt", 5)]
    assert all(p.uri.startswith("az://lake/trees/v1/") and tag for p, _, tag in listed)
    assert objects.children(remote) == ["part=a", "top.txt"]
    assert objects.text(remote / "top.txt") == "hello" and objects.text(remote / "nothing") is None
    assert objects.age(remote / "top.txt") >= 0 and objects.seconds_since_written(remote) >= 0
    assert objects.age(remote / "nothing") is None and objects.seconds_since_written(remote / "none") is None

    copied = object_path("az://lake/trees/v2")
    objects.copy([(p, copied / p.relative_to(remote).as_posix()) for p in objects.files(remote)], copied)
    back = tmp_path / "back"
    objects.download(objects.files(copied), copied, back)
    assert (back / "part=a" / "f.bin").read_bytes() == b"x" * 3000 and (back / "top.txt").read_text() == "hello"

    objects.delete_tree(remote)
    assert objects.files(remote) == [] and not objects.exists(remote / "top.txt")
    assert len(objects.files(copied)) == 2


def test_a_container_that_does_not_exist_is_one_line_naming_it(objects):
    from hybridflow.errors import DataError

    with pytest.raises(DataError, match="the container 'nowhere' of az://nowhere/x does not exist"):
        objects.files(object_path("az://nowhere/x"))


def test_the_store_check_trusts_azure_and_keeps_its_answer_in_the_workdir(objects, az):
    from hybridflow.store import storecheck

    workdir = object_path("az://lake/checked")
    assert storecheck.probe(objects, workdir) == []
    storecheck.require_trusted(objects, workdir)
    kept = json.loads(az.get_bytes("lake/checked/.hybridflow/store-check.json"))
    assert kept[az.endpoint]["honoured"] is True
    assert [k for k in az.keys("lake/checked/") if "store-probe" in k] == []


def test_engines_refused_the_key_are_one_line_naming_azures_variables(az, monkeypatch):
    # pyarrow's AzureFileSystem, which python stages, Ray, footers and DuckDB read through
    from hybridflow.data import storage
    from hybridflow.errors import ExitCode, StorageError

    wrong = az.connection_string.replace(az.secret_key, "d3Jvbmcta2V5")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    az.put_bytes("lake/engines/x", b"1")
    with pytest.raises(StorageError) as raised:
        storage.size_of(object_path("az://lake/engines/x"), settings_for("az://lake").arrow_filesystem())
    line = raised.value.one_line()
    assert raised.value.exit_code == ExitCode.IO_ERROR and "refused access to az://lake/engines/x" in line, line
    assert "AZURE_STORAGE_CONNECTION_STRING" in line and "d3Jvbmcta2V5" not in line, line


PIPELINE = '''
name: keyed
workdir: az://lake/keyed
stages:
  make: {run: "mypkg.steps:make", backend: python, outputs: [a]}
'''


def run(project, tmp_path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    """`hybridflow run` with Azure reached only as `environ` says (none of this machine's own variables)."""
    own = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_STORAGE_")}
    environ = {**own, **environ, "HYBRIDFLOW_CACHE": str(tmp_path / "cache"), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                          env=environ, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("credentials", ["wrong key", "no key", "malformed key"])
def test_a_wrong_or_missing_key_is_one_line_with_exit_74_and_no_secret(project, az, tmp_path, credentials):
    project.stages("import pandas as pd\n\n\ndef make():\n    return pd.DataFrame({\"a\": [1, 2]})\n")
    project.pipeline(PIPELINE)
    # base64 of no key Azurite holds; a key pasted with its end cut off (not base64)
    wrong = {"wrong key": "d3Jvbmcta2V5LXRoYXQtbXVzdC1uZXZlci1zaG93LXVw", "malformed key": "d3Jvbmcta2V5LXRo!"}.get(
        credentials, "")
    connection = az.connection_string.replace(az.secret_key, wrong) if wrong else \
        az.connection_string.replace(f"AccountKey={az.secret_key};", "")
    done = run(project, tmp_path, {"AZURE_STORAGE_CONNECTION_STRING": connection})
    output = done.stdout + done.stderr
    assert done.returncode == 74, output
    expected = {"wrong key": "refused access to az://lake/keyed",
                "no key": f"no key or shared access signature for the Azure storage account '{az.account}'",
                "malformed key": f"the key of the Azure storage account '{az.account}' is not base64"}[credentials]
    assert expected in output and "AZURE_STORAGE_CONNECTION_STRING" in output, output
    assert "Traceback" not in output and az.secret_key not in output, output
    assert not wrong or wrong not in output, output
    records = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] if (tmp_path / "cache").exists() else []
    secrets = [secret.encode() for secret in (wrong, az.secret_key) if secret]
    assert not [p for p in records if any(secret in p.read_bytes() for secret in secrets)]


SIGNED_PIPELINE = '''
name: signed
workdir: az://lake/signed
backends:
  dask: {n_workers: 1, threads_per_worker: 1}
stages:
  make: {run: "mypkg.steps:make", backend: python, outputs: [a]}
  on_duckdb: {run: "mypkg.steps:on_duckdb", backend: duckdb, inputs: [a], outputs: [b]}
  on_polars: {run: "mypkg.steps:on_polars", backend: polars, inputs: [b], outputs: [c]}
  on_dask: {run: "mypkg.steps:on_dask", backend: dask, inputs: [c], outputs: [d]}
'''
SIGNED_STAGES = '''
import pandas as pd


def make():
    return pd.DataFrame({"a": [1, 2, 3]})


def on_duckdb(a):
    return a.project("a, a * 10 AS b")


def on_polars(b):
    import polars as pl

    return b.with_columns(c=pl.col("b") + 1)


def on_dask(c):
    return c.assign(d=c["c"] * 2)
'''


@pytest.mark.parametrize("given", ["in the connection string", "in AZURE_STORAGE_SAS_TOKEN"])
def test_a_shared_access_signature_reaches_the_store_on_every_engine_and_is_shown_nowhere(project, az, tmp_path,
                                                                                           monkeypatch, given):
    """An account SAS made for the run (no account key anywhere): the commits, the lease and each engine's
    own reads and writes go through it; no output, record or log holds it."""
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    import hybridflow

    allowed = AccountSasPermissions(read=True, write=True, delete=True, list=True, add=True, create=True)
    resources = ResourceTypes(service=True, container=True, object=True)
    signature = generate_account_sas(az.account, az.secret_key, resources, allowed,
                                     expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    environ = {"AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={az.endpoint};SharedAccessSignature={signature}",
               "AZURE_STORAGE_ACCOUNT": "", "AZURE_STORAGE_KEY": "", "AZURE_STORAGE_SAS_TOKEN": ""}
    text = SIGNED_PIPELINE
    if given == "in AZURE_STORAGE_SAS_TOKEN":
        environ.update(AZURE_STORAGE_CONNECTION_STRING="", AZURE_STORAGE_ACCOUNT=az.account,
                       AZURE_STORAGE_SAS_TOKEN=f"?{signature}")
        text = text.replace("stages:\n", f"storage:\n  endpoint: http://{az.host}:{az.port}\nstages:\n", 1)
    project.stages(SIGNED_STAGES)
    file = project.pipeline(text)
    done = run(project, tmp_path, environ)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    got = hybridflow.read(file, "d", engine="pandas").sort_values("a").to_dict("list")
    assert got == {"a": [1, 2, 3], "b": [10, 20, 30], "c": [11, 21, 31], "d": [22, 42, 62]}
    assert [k for k in az.keys("lake/signed/") if "/datasets/d/versions/" in k and k.endswith(".parquet")]
    sig = signature.split("sig=")[1].split("&")[0]  # the signing part, however the token is quoted
    assert sig not in output and az.secret_key not in output, output
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and sig.encode() in p.read_bytes()]
    stored = [k for k in az.keys("lake/signed/") if not k.endswith(".parquet") and sig.encode() in az.get_bytes(k)]
    assert kept == [] and stored == []  # nor in the run records, logs and reports kept here or in the store


SPARK_PIPELINE = '''
name: sparky
workdir: az://lake/sparky
backends:
  spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: 2}}
datasets:
  orders:
    path: az://lake/sparky-in/orders
    partition_by: [week]
    schema: {customer: string, amount: double, week: string}
    checks:
      - not_null: [customer]
  totals:
    checks:
      - unique: [customer, week]
      - row_count: {min: 1}
stages:
  totals: {run: "mypkg.steps:totals", backend: spark, inputs: [orders], outputs: [totals]}
  ranked: {run: "mypkg.steps:ranked", inputs: [totals], outputs: [ranked]}
  best: {run: "mypkg.steps:best", backend: spark, inputs: [ranked], outputs: [best]}
'''
SPARK_STAGES = '''
def totals(orders):
    from pyspark.sql import functions as F

    return orders.groupBy("customer", "week").agg(F.sum("amount").alias("total"), F.count("*").alias("orders"))


def ranked(totals):
    return totals.sort_values(["week", "total", "customer"], ascending=[True, False, True]).reset_index(drop=True)


def best(ranked):
    from pyspark.sql import functions as F

    return ranked.groupBy("week").agg(F.max("total").alias("best"))
'''


def put_orders(az, week: str, rows: int):
    """A week of orders delivered into the input's partition folder; the rows as a pandas frame."""
    import pandas as pd
    import pyarrow as pa

    orders = pd.DataFrame({"customer": [f"c{i % 7}" for i in range(rows)], "amount": [i * 0.25 for i in range(rows)]})
    table = pa.Table.from_pandas(orders, preserve_index=False)
    az.put_table(f"lake/sparky-in/orders/week={week}/part-0.parquet", table)
    return orders.assign(week=week)


def test_a_spark_stage_reads_and_writes_az_through_copies_on_this_machine_and_a_rerun_skips(project, az, tmp_path,
                                                                                           monkeypatch):
    """Spark has no connector for az://: on this machine it reads an external input and a published
    version from copies hybridflow downloads, and its outputs are uploaded from local staging and
    checked there; the results equal pandas', the next run skips, a new delivery replaces the copy."""
    import pandas as pd

    import hybridflow
    from tests.objectstore.test_s3_workdir import statuses

    orders = pd.concat([put_orders(az, "2026-11-02", 300), put_orders(az, "2026-11-09", 200)])
    project.stages(SPARK_STAGES)
    file = project.pipeline(SPARK_PIPELINE)
    cache = tmp_path / "cache"
    for name, value in az.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(cache))

    def expected(orders: pd.DataFrame) -> pd.DataFrame:
        totals = orders.groupby(["customer", "week"], as_index=False).agg(total=("amount", "sum"))
        return totals.groupby("week", as_index=False).agg(best=("total", "max"))

    done = run(project, tmp_path, az.env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert statuses(done.stdout) == {"totals": "done", "ranked": "done", "best": "done"}, done.stdout
    written = [key for key in az.keys("lake/sparky/") if "/datasets/best/" in key and key.endswith(".parquet")]
    assert written, az.keys("lake/sparky/")  # uploaded into the store
    got = hybridflow.read(file, "best", engine="pandas").sort_values("week").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected(orders), check_dtype=False)
    assert az.secret_key not in done.stdout + done.stderr

    again = run(project, tmp_path, az.env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert statuses(again.stdout) == {"totals": "skipped", "ranked": "skipped", "best": "skipped"}, again.stdout

    orders = pd.concat([orders, put_orders(az, "2026-11-16", 100)])  # a new week is delivered
    newer = run(project, tmp_path, az.env())
    assert newer.returncode == 0, newer.stdout + newer.stderr
    assert statuses(newer.stdout) == {"totals": "done", "ranked": "done", "best": "done"}, newer.stdout
    got = hybridflow.read(file, "best", engine="pandas").sort_values("week").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected(orders), check_dtype=False)
    copies = [p for p in cache.rglob("copies/orders/external/*") if p.is_dir()]
    assert len(copies) == 1, copies  # the earlier delivery's copy is gone

    checked = subprocess.run([sys.executable, "-m", "hybridflow.cli", "doctor", "pipeline.yaml"], cwd=project.root,
                             env={**os.environ, "COLUMNS": "400"}, capture_output=True, text=True, timeout=120)
    assert "spark and az://" in checked.stdout and "through copies on this machine" in checked.stdout, checked.stdout


def test_a_spark_cluster_stage_on_an_az_workdir_is_refused_at_its_line_before_anything_runs(project, az, tmp_path):
    project.stages("import pandas as pd\n\n\ndef make():\n    return pd.DataFrame({\"a\": [1, 2]})\n")
    project.pipeline('''
name: clustered
workdir: az://lake/clustered
backends:
  spark: {master: "spark://127.0.0.1:7077"}
stages:
  make: {run: "mypkg.steps:make", backend: spark, outputs: [a]}
''')
    done = run(project, tmp_path, az.env())
    assert done.returncode == 78, done.stdout + done.stderr  # the pipeline file's error, at the stage's line
    assert "pipeline.yaml:6:" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "stage 'make' runs on a spark cluster, which does not reach az:// paths" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not Path(project.root / ".hybridflow").exists()


def test_the_filesystem_engines_ship_to_their_workers_carries_no_key(objects, az):  # objects: the variables set
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem = settings_for("az://lake").arrow_filesystem()
    shipped = pickle.dumps(filesystem)
    assert az.secret_key.encode() not in shipped
    # and in the worker, made again from its environment, it reaches the same account
    az.put_table("lake/shipped/t.parquet", pa.table({"a": [1, 2]}))
    assert pq.read_table("lake/shipped/t.parquet", filesystem=pickle.loads(shipped)).to_pydict() == {"a": [1, 2]}
    wrapped = pickle.dumps(settings_for("az://lake").fsspec_filesystem())
    assert az.secret_key.encode() not in wrapped
