"""A workdir or dataset path with a mistyped or unsupported scheme is a config error at file:line with
a did-you-mean, never a local folder named `S3:` (two cron hosts would each take a lock of their own)."""

from __future__ import annotations

import pytest

from hybridflow.definition.config import check_file, load_pipeline
from hybridflow.errors import ConfigError, ExitCode

PIPELINE = """name: p
workdir: "{workdir}"
datasets:
  raw: {{path: "{path}"}}
stages:
  a: {{run: "m:f", inputs: [raw], outputs: [b]}}
"""


def write(tmp_path, workdir: str = ".hf", path: str = "s3://lake/raw"):
    (tmp_path / "m.py").write_text("def f(raw):\n    return raw\n")
    file = tmp_path / "pipeline.yaml"
    file.write_text(PIPELINE.format(workdir=workdir, path=path))
    return file


@pytest.mark.parametrize(("given", "hint"), [
    ("S3://team-bucket/wd", "did you mean 's3://team-bucket/wd'?"),
    ("s3:/team-bucket/wd", "did you mean 's3://team-bucket/wd'?"),
    ("s3a://team-bucket/wd", "did you mean 's3://team-bucket/wd'?"),
    ("s3:team-bucket/wd", "did you mean 's3://team-bucket/wd'?"),
    ("file:/srv/wd", "did you mean '/srv/wd'?"),
    ("gcs://team-bucket/wd", "did you mean 'gs://team-bucket/wd'?"),
    ("GS://team-bucket/wd", "did you mean 'gs://team-bucket/wd'?"),
    ("abfs://team-bucket@acct.dfs.core.windows.net/wd", "did you mean 'az://team-bucket/wd'?"),
    ("wasbs://team-bucket@acct.blob.core.windows.net/wd", "did you mean 'az://team-bucket/wd'?"),
    ("AZ://team-bucket/wd", "did you mean 'az://team-bucket/wd'?"),
    ("ftp://team-bucket/wd", "ftp:// is not supported"),
])
def test_a_workdir_with_a_wrong_scheme_is_a_located_config_error(tmp_path, given, hint):
    with pytest.raises(ConfigError) as raised:
        load_pipeline(write(tmp_path, workdir=given), environ={})
    line = raised.value.one_line()
    assert line.startswith(f"{tmp_path / 'pipeline.yaml'}:2:10: error: workdir:") and hint in line, line
    assert raised.value.exit_code == ExitCode.CONFIG
    assert not (tmp_path / given.split(":")[0]).exists()


def test_the_workdir_variable_is_checked_too(tmp_path):
    with pytest.raises(ConfigError) as raised:
        load_pipeline(write(tmp_path), environ={"HYBRIDFLOW_WORKDIR": "S3://b/wd"})
    assert "HYBRIDFLOW_WORKDIR" in raised.value.one_line() and "did you mean 's3://b/wd'?" in raised.value.one_line()


@pytest.mark.parametrize(("given", "hint"), [("S3://lake/raw", "did you mean 's3://lake/raw'?"),
                                             ("abfss://lake/raw", "did you mean 'az://lake/raw'?"),
                                             ("hdfs://lake/raw", "hdfs:// is not supported")])
def test_a_dataset_path_with_a_wrong_scheme_is_a_located_config_error(tmp_path, given, hint):
    _, problems = check_file(write(tmp_path, path=given), environ={})
    errors = [str(p) for p in problems if p.severity == "error"]
    assert len(errors) == 1 and ":4:" in errors[0] and hint in errors[0], errors


def test_local_paths_and_s3_uris_are_still_taken(tmp_path):
    pipeline = load_pipeline(write(tmp_path, workdir="s3://team-bucket/wd", path="data/raw:2024"), environ={})
    assert pipeline.remote is not None and str(pipeline.remote) == "team-bucket/wd"


def test_the_same_bucket_on_another_store_has_a_cache_of_its_own(tmp_path):
    def cache(environ: dict) -> object:
        return load_pipeline(write(tmp_path, workdir="s3://team-bucket/wd"), environ=environ).workdir

    aws = cache({"HYBRIDFLOW_CACHE": str(tmp_path / "c")})
    minio = cache({"HYBRIDFLOW_CACHE": str(tmp_path / "c"), "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    other = cache({"HYBRIDFLOW_CACHE": str(tmp_path / "c"), "AWS_ENDPOINT_URL": "http://127.0.0.1:9100"})
    assert len({aws, minio, other}) == 3  # run records or staging of one store are never taken for another's
    assert aws == cache({"HYBRIDFLOW_CACHE": str(tmp_path / "c")})  # and each store's is the same every time


def test_a_gs_workdir_is_google_cloud_storage_reached_as_the_emulator_variable_says(tmp_path):
    from hybridflow.data.stores.gcs import GcsPath, GcsSettings
    from hybridflow.engines.polars import storage_options

    pipeline = load_pipeline(write(tmp_path, workdir="gs://team-bucket/wd", path="gs://lake/raw"),
                             environ={"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"})
    assert isinstance(pipeline.remote, GcsPath) and pipeline.remote.uri == "gs://team-bucket/wd"
    assert (pipeline.remote / "p" / "CURRENT").uri == "gs://team-bucket/wd/p/CURRENT"
    assert isinstance(pipeline.external_path("raw"), GcsPath)
    assert GcsSettings.of(None, {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}).endpoint == "http://127.0.0.1:4443"
    assert GcsSettings.of(None, {}).endpoint is None and storage_options(GcsSettings.of(None, {})) == {}
    _, problems = check_file(write(tmp_path, workdir="gs://team-bucket/wd", path="gs://lake/raw"), environ={})
    assert [p for p in problems if p.severity == "error"] == []


AZURITE = ("DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5;"
           "BlobEndpoint=http://127.0.0.1:10000/acct;")


def test_an_az_workdir_is_azure_blob_storage_reached_as_the_standard_variables_say(tmp_path):
    from hybridflow.data.stores.azure import AzurePath, AzureSettings

    pipeline = load_pipeline(write(tmp_path, workdir="az://team/wd", path="az://lake/raw"),
                             environ={"AZURE_STORAGE_CONNECTION_STRING": AZURITE})
    assert isinstance(pipeline.remote, AzurePath) and (pipeline.remote / "CURRENT").uri == "az://team/wd/CURRENT"
    assert isinstance(pipeline.external_path("raw"), AzurePath)
    # a connection string names the account and its endpoint; the key stays out of the settings
    emulated = AzureSettings.of(None, {"AZURE_STORAGE_CONNECTION_STRING": AZURITE})
    assert (emulated.account, emulated.endpoint) == ("acct", "http://127.0.0.1:10000/acct")
    assert "a2V5" not in repr(emulated) and "a2V5" not in str(emulated.reached({"AZURE_STORAGE_CONNECTION_STRING":
                                                                                 AZURITE}))
    cloud = AzureSettings.of(None, {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "a2V5"})
    assert (cloud.account, cloud.endpoint) == ("acct", "https://acct.blob.core.windows.net")
    other = AzureSettings.of(None, {"AZURE_STORAGE_ACCOUNT": "other"})
    china = AzureSettings.of(None, {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=cn;AccountKey=a2V5;"
                                                                       "EndpointSuffix=core.chinacloudapi.cn"})
    assert china.endpoint == "https://cn.blob.core.chinacloudapi.cn"
    # the same container in two accounts: two workdirs, each with its own cache on this machine
    assert len({load_pipeline(write(tmp_path, workdir="az://team/wd", path="az://lake/raw"),
                              environ={"AZURE_STORAGE_ACCOUNT": name}).workdir for name in ("acct", "other")}) == 2
    assert other.endpoint != cloud.endpoint
    # storage: endpoint as an emulator's address alone: the account is its URL's first segment
    section = AzureSettings.of({"endpoint": "http://127.0.0.1:10000"}, {"AZURE_STORAGE_ACCOUNT": "acct"})
    assert section.endpoint == "http://127.0.0.1:10000/acct"
    named = AzureSettings.of({"endpoint": "http://127.0.0.1:10000/acct"}, {"AZURE_STORAGE_KEY": "a2V5"})
    assert (named.account, named.endpoint) == ("acct", "http://127.0.0.1:10000/acct")
    development = AzureSettings.of(None, {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"})
    assert development.endpoint == "http://127.0.0.1:10000/devstoreaccount1"
    _, problems = check_file(write(tmp_path, workdir="az://team/wd", path="az://lake/raw"), environ={})
    assert [p for p in problems if p.severity == "error"] == []


def test_an_azure_key_or_shared_access_signature_is_found_where_azure_puts_it_and_shown_nowhere():
    from hybridflow.data.stores.azure import AzureSettings, credential_of

    signed = "BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2024&sig=c2lnbg%3D%3D"
    # a connection string with a signature and Azure's own endpoint: the account is the endpoint's host's
    assert (AzureSettings.of(None, {"AZURE_STORAGE_CONNECTION_STRING": signed}).account) == "acct"
    found = {name: credential_of(environ) for name, environ in {
        "connection string's key": {"AZURE_STORAGE_CONNECTION_STRING": AZURITE, "AZURE_STORAGE_SAS_TOKEN": "sv=x"},
        "connection string's signature": {"AZURE_STORAGE_CONNECTION_STRING": signed},
        "variable key": {"AZURE_STORAGE_KEY": "a2V5", "AZURE_STORAGE_SAS_TOKEN": "sv=x"},
        "variable signature": {"AZURE_STORAGE_SAS_TOKEN": "?sv=2024&sig=c2lnbg%3D%3D"},
        "none": {"AZURE_STORAGE_ACCOUNT": "acct"}}.items()}
    sas = ("sas", "sv=2024&sig=c2lnbg%3D%3D")
    assert {name: found and (found.kind, found.secret) for name, found in found.items()} == {
        "connection string's key": ("key", "a2V5"), "connection string's signature": sas,
        "variable key": ("key", "a2V5"), "variable signature": sas, "none": None}
    assert "c2lnbg" not in repr(found["variable signature"])
    reached = AzureSettings.of(None, {"AZURE_STORAGE_ACCOUNT": "acct"}).reached(
        {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=2024&sig=c2lnbg%3D%3D"})
    assert reached["credentials"] == "AZURE_STORAGE_SAS_TOKEN" and "c2lnbg" not in str(reached)


def test_an_input_in_another_store_than_the_workdirs_is_a_located_config_error(tmp_path):
    _, problems = check_file(write(tmp_path, workdir="s3://team-bucket/wd", path="gs://lake/raw"), environ={})
    errors = [str(p) for p in problems if p.severity == "error"]
    assert len(errors) == 1 and ":4:" in errors[0], errors
    assert "a pipeline reaches one object store, and this one's is s3://" in errors[0], errors


def test_a_gs_path_survives_pickling_to_workers_as_a_gs_path():
    import pickle

    from hybridflow.data.storage import object_path

    path = pickle.loads(pickle.dumps(object_path("gs://lake/a/b.parquet").parent))
    assert path.uri == "gs://lake/a" and object_path("s3://lake/a").uri == "s3://lake/a"


def test_an_az_workdir_without_the_azure_extra_is_told_how_to_install_it(monkeypatch):
    import sys

    from hybridflow.data.stores.azure import AzureSettings
    from hybridflow.data.stores.azureobjects import AzureObjectStore
    from hybridflow.errors import UnavailableError

    monkeypatch.setitem(sys.modules, "azure.storage.blob", None)  # as if azure-storage-blob were not installed
    with pytest.raises(UnavailableError, match="needs azure-storage-blob") as raised:
        AzureObjectStore(AzureSettings("teamlake", "http://127.0.0.1:1/teamlake"))
    assert "azure" in (raised.value.hint or "")


@pytest.mark.parametrize(("workdir", "master", "refused"), [
    ("az://team/wd", "spark://10.0.0.5:7077", True), ("az://team/wd", "local[2]", False),
    ("gs://team/wd", "spark://10.0.0.5:7077", False), ("s3://team/wd", "spark://10.0.0.5:7077", False)])
def test_a_spark_cluster_stage_on_a_store_spark_cannot_reach_is_refused_at_its_backend_line(tmp_path, workdir, master,
                                                                                            refused):
    """Spark on this machine reaches az:// through local copies; a Spark cluster's workers could not read them."""
    file = write(tmp_path, workdir=workdir, path=f"{workdir.split('://')[0]}://lake/raw")
    file.write_text(file.read_text().replace("{run:", "{backend: spark, run:") +
                    f"backends:\n  spark: {{master: \"{master}\"}}\n")
    _, problems = check_file(file, environ={})
    errors = [str(p) for p in problems if p.severity == "error"]
    if not refused:
        assert errors == []
        return
    assert len(errors) == 1 and "pipeline.yaml:6:" in errors[0], errors
    assert "stage 'a' runs on a spark cluster, which does not reach az:// paths: run it on spark on this " \
           "machine, or on" in errors[0], errors
    assert "duckdb" in errors[0] and "spark" not in errors[0].split("machine, or on")[1], errors
