"""`mlflow:` with the tracking server's artifact store in object storage (a real S3 server, moto, and a
real `mlflow server`, both on 127.0.0.1): the model a stage writes lands in the bucket and the run's
records name it, whether the server carries the artifacts (its default: the run needs no AWS keys)
or the run writes them itself (`--no-serve-artifacts`: with the standard AWS variables, as the
workdir's engines use them); the keys are never in what the run prints or records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.runs.test_mlflow import PIPELINE, STAGES, TOKEN
from tests.support.mlflowserver import MlflowServer

S3_BUCKETS = ("mlflow-art", "mlflow-wd")


def hybridflow(project, path, env: dict[str, str]) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPENLINEAGE", "AWS_"))}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(path)], cwd=project.root,
                          env={**environ, "ML_TOKEN": TOKEN, **env}, capture_output=True, text=True, timeout=600)


def model_of(server) -> tuple[str, object]:
    """The train stage's MLflow run id and the model version registered from it."""
    client = server.client()
    [version] = client.search_model_versions("name = 'churn'")
    tags = client.get_run(version.run_id).data.tags
    assert (tags["hybridflow.stage"], tags["hybridflow.pipeline"]) == ("train", "churn-demo")
    assert [a.path for a in client.list_artifacts(version.run_id, "model")] == ["model/model.json"]
    return version.run_id, version


def assert_secret_nowhere(secret: str, done, *folders) -> None:
    assert secret not in done.stdout + done.stderr
    for folder in folders:
        for file in (f for f in folder.rglob("*") if f.is_file()):
            assert secret.encode() not in file.read_bytes(), file


def test_the_server_carries_models_into_its_bucket_and_the_run_holds_no_keys(project, s3, tmp_path):
    server = MlflowServer(tmp_path / "mlflow", artifacts="s3://mlflow-art/served", env=s3.env())
    try:
        project.stages(STAGES, module="ml")
        path = project.pipeline(PIPELINE.format(uri=server.uri))
        done = hybridflow(project, path, {})  # no AWS variable: the run talks to the tracking server only
        assert done.returncode == 0, done.stderr
        assert "MLflow" not in done.stderr
        run_id, version = model_of(server)
        [key] = [k for k in s3.keys("mlflow-art/served/") if k.endswith(f"/{run_id}/artifacts/model/model.json")]
        body = s3.client().get_object(Bucket="mlflow-art", Key=key.partition("/")[2])["Body"].read()
        assert json.loads(body) == {"depth": 3, "rows": 10}
        assert version.source in (f"runs:/{run_id}/model", f"models:/{version.model_id}")
        assert_secret_nowhere(s3.secret_key, done, project.root, server.home)
        assert_secret_nowhere(TOKEN, done, project.root, server.home)
    finally:
        server.stop()


def test_a_run_writes_models_to_the_artifact_bucket_itself_with_the_standard_aws_variables(project, s3, tmp_path,
                                                                                         monkeypatch):
    server = MlflowServer(tmp_path / "mlflow", artifacts="s3://mlflow-art/direct", serve=False)
    try:
        project.stages(STAGES, module="ml")
        path = project.pipeline("workdir: s3://mlflow-wd/team\n" + PIPELINE.format(uri=server.uri))
        done = hybridflow(project, path, {**s3.env(), "HYBRIDFLOW_CACHE": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr
        assert "MLflow" not in done.stderr
        for name, value in s3.env().items():  # this test's MLflow client reads the bucket itself, too
            monkeypatch.setenv(name, value)
        run_id, _ = model_of(server)
        assert any(k.endswith(f"/{run_id}/artifacts/model/model.json") for k in s3.keys("mlflow-art/direct/"))
        assert_secret_nowhere(s3.secret_key, done, project.root, server.home, tmp_path / "cache")
        for key in s3.keys("mlflow-wd/team/"):  # the workdir's records and manifests, in the bucket
            body = s3.client().get_object(Bucket="mlflow-wd", Key=key.partition("/")[2])["Body"].read()
            assert s3.secret_key.encode() not in body and TOKEN.encode() not in body, key
    finally:
        server.stop()
