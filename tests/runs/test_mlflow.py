"""`mlflow:` end to end: the real CLI in a subprocess records its runs in a real `mlflow server` on
127.0.0.1 (SQLite backend store, local artifact store), read back through MlflowClient."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from hybridflow.store.catalog import Catalog
from tests.support.mlflowserver import MlflowServer
from tests.support.projects import last_run_record

TOKEN = "mlt-4c1f8e2a9b"  # what ${env:ML_TOKEN} expands to

STAGES = '''
import json
import os
import sys
import time

import pandas as pd


def prepare():
    return pd.DataFrame({"x": list(range(10)), "y": [i % 2 for i in range(10)]})


def train(features, depth, ctx):
    (ctx.output_path("model") / "model.json").write_text(json.dumps({"depth": depth, "rows": len(features)}))
    ctx.mlflow.log_metric("train_rows", len(features))


def evaluate(features, model, ctx):
    held = os.environ.get("ML_EVALUATE_AFTER")  # a file the test makes once the server holds what train sent
    while held and not os.path.exists(held):
        time.sleep(0.05)
    depth = json.loads((model / "model.json").read_text())["depth"]
    auc = 0.5 + depth / 10
    ctx.mlflow.log_metrics({"auc": auc})
    for step in range(3):
        ctx.mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    ctx.mlflow.log_param("threshold", 0.5)
    previous = ctx.previous_output("champion")
    best = json.loads((previous / "score.json").read_text())["auc"] if previous else None
    promote = best is None or auc > best
    ctx.mlflow.set_tag("decision", "promoted" if promote else "kept")
    (ctx.output_path("champion") / "score.json").write_text(json.dumps({"auc": auc if promote else best}))
    if promote:
        ctx.mlflow.set_model_alias("champion")


def untracked(ctx):
    ctx.mlflow.log_metric("anything", 1.0)  # without mlflow: it is sent nowhere
    assert "mlflow" not in sys.modules and "openlineage" not in sys.modules
    return pd.DataFrame({"x": [1]})
'''

PIPELINE = """
name: churn-demo
params: {{seed: 7, token: "${{env:ML_TOKEN}}"}}  # a secret: never in MLflow
datasets:
  model: {{kind: files, mlflow: {{model: churn}}}}
  champion: {{kind: files}}
stages:
  prepare: {{run: 'mypkg.ml:prepare', outputs: [features]}}
  train: {{run: 'mypkg.ml:train', inputs: [features], outputs: [model], params: {{depth: 3}}}}
  evaluate: {{run: 'mypkg.ml:evaluate', inputs: [features, model], outputs: [champion]}}
mlflow:
  tracking_uri: {uri}
  experiment: churn-exp
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    started = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    yield started
    started.stop()


def hybridflow(project, *args) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPENLINEAGE"))}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *map(str, args)], cwd=project.root,
                          env={**environ, "ML_TOKEN": TOKEN}, capture_output=True, text=True, timeout=300)


def git_repository(project) -> str:
    def git(*args):
        return subprocess.run(["git", "-C", str(project.root), "-c", "user.name=t", "-c", "user.email=t@t",
                               *args], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "stages")
    return git("rev-parse", "HEAD")


def runs_of(client, experiment: str, run_id: str):
    [exp] = [e for e in client.search_experiments() if e.name == experiment]
    runs = client.search_runs([exp.experiment_id], f"tags.`hybridflow.run_id` = '{run_id}'")
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    stages = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return parent, stages


def test_a_run_its_stages_datasets_metrics_model_and_alias_are_in_mlflow(project, server):
    project.stages(STAGES, module="ml")
    path = project.pipeline(PIPELINE.format(uri=server.uri))
    commit = git_repository(project)
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    assert "MLflow" not in done.stderr
    run, _ = last_run_record(project.root / ".hybridflow")
    client = server.client()
    parent, stages = runs_of(client, "churn-exp", run["run_id"])
    assert parent.info.status == "FINISHED" and parent.info.run_name == run["run_id"]
    assert parent.data.tags["hybridflow.pipeline"] == "churn-demo"
    assert parent.data.tags["mlflow.source.git.commit"] == commit
    assert parent.data.params == {"seed": "7", "token": "***"}
    assert set(stages) == {"prepare", "train", "evaluate"}
    assert all(r.info.status == "FINISHED" for r in stages.values())
    assert stages["train"].data.params == {"seed": "7", "token": "***", "depth": "3"}
    assert stages["train"].data.metrics == {"train_rows": 10.0}

    catalog = Catalog(project.home("churn-demo"))
    [features] = client.get_run(stages["train"].info.run_id).inputs.dataset_inputs
    assert features.dataset.name == "features" and len(features.dataset.digest) == 32
    source = json.loads(features.dataset.source)
    assert source["hybridflow_version"] == catalog.current("features").id
    assert source["uri"] == f"file://{catalog.current('features').directory.parent.parent}"
    assert [c["name"] for c in json.loads(features.dataset.schema)["mlflow_colspec"]] == ["x", "y"]

    evaluate = stages["evaluate"]
    assert evaluate.data.metrics["auc"] == pytest.approx(0.8)
    assert [m.value for m in client.get_metric_history(evaluate.info.run_id, "loss")] == \
        pytest.approx([1.0, 0.5, 1 / 3])
    assert evaluate.data.params == {"seed": "7", "token": "***", "threshold": "0.5"}
    assert evaluate.data.tags["decision"] == "promoted"
    assert {d.dataset.name for d in client.get_run(evaluate.info.run_id).inputs.dataset_inputs} == \
        {"features", "model"}

    [version] = client.search_model_versions("name = 'churn'")
    assert version.run_id == stages["train"].info.run_id
    assert version.tags["hybridflow.version"] == catalog.current("model").id
    assert [a.path for a in client.list_artifacts(version.run_id, "model")] == ["model/model.json"]
    assert client.get_model_version_by_alias("churn", "champion").version == version.version
    assert not any(TOKEN.encode() in f.read_bytes() for f in server.home.rglob("*") if f.is_file())

    # a worse model: a new version, and the champion alias stays where it was
    done = hybridflow(project, "run", path, "--param", "train.depth=1")
    assert done.returncode == 0, done.stderr
    second, _ = last_run_record(project.root / ".hybridflow")
    _, stages = runs_of(client, "churn-exp", second["run_id"])
    assert set(stages) == {"train", "evaluate"}  # prepare was up to date: no run of its own
    assert stages["evaluate"].data.tags["decision"] == "kept"
    assert sorted(v.version for v in client.search_model_versions("name = 'churn'")) == ["1", "2"]
    assert client.get_model_version_by_alias("churn", "champion").version == version.version


def test_a_failed_stage_is_a_failed_mlflow_run(project, server):
    project.stages(STAGES + "\n\ndef bad(features):\n    raise ValueError('no good')\n", module="ml")
    path = project.pipeline(PIPELINE.format(uri=server.uri).replace("mlflow:\n  tracking_uri",
                            "  bad: {run: 'mypkg.ml:bad', inputs: [features], outputs: [z]}\nmlflow:\n  tracking_uri"))
    done = hybridflow(project, "run", path, "--keep-going")
    assert done.returncode != 0
    run, _ = last_run_record(project.root / ".hybridflow")
    parent, stages = runs_of(server.client(), "churn-exp", run["run_id"])
    assert parent.info.status == "FAILED" and stages["bad"].info.status == "FAILED"
    assert stages["bad"].data.tags["hybridflow.error"].startswith("ValueError: no good")
    assert stages["evaluate"].info.status == "FINISHED"


def test_an_unreachable_tracking_server_is_one_warning_after_the_summary(project):
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{free.getsockname()[1]}"
    project.stages(STAGES, module="ml")
    done = hybridflow(project, "run", project.pipeline(PIPELINE.format(uri=uri)))
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and "MLflow records not delivered" in warnings[0], done.stderr
    assert done.stderr.splitlines()[-1] == warnings[0]


def test_a_pipeline_without_trackers_imports_neither_client(project):
    project.stages(STAGES, module="ml")
    path = project.pipeline("""
        name: plain
        stages:
          only: {run: 'mypkg.ml:untracked', outputs: [x]}
        """)
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    assert not list((project.root / ".hybridflow").rglob("mlruns")) and not (project.root / "mlruns").exists()


RUNS_IN_ONE_PROCESS = '''
import json
import sys

import hybridflow
from hybridflow.tracking import mlflowruns

mlflowruns.FINISH_SECONDS = 3.0  # the end-of-run wait, short: the test holds a registration until it ends


def run(depth):
    result = hybridflow.run(sys.argv[1], params={"train.depth": depth})
    print("result:", json.dumps({"run_id": result.run_id, "ok": result.ok, "warnings": result.warnings,
                                 "error": str(result.error or "")}), flush=True)


run(3)
run(1)
sys.stdin.readline()  # the test opens the gate
mlflowruns.FINISH_SECONDS = 300.0  # nothing is held now: however loaded the machine, its records go out
run(2)
'''


def ran(driver) -> dict:
    """The next run's result the driver prints (MLflow's client prints lines of its own)."""
    while not (line := driver.stdout.readline()).startswith("result: "):
        assert line, "the driver ended before printing a run's result"
    return json.loads(line.removeprefix("result: "))


def test_the_next_run_of_a_process_waits_for_the_last_runs_mlflow_records(project, server):
    """As a watch session's runs do: each is a new run in the same process. A run whose records are
    still going out (its model's registration held by a slow server) keeps the next run out of MLflow,
    rather than letting it register its model first; once they are out, the next run is recorded."""
    from tests.support.httpgate import HttpGate

    gate = HttpGate(server.uri, lambda method, path: method == "POST" and "/model-versions/create" in path)
    try:
        project.stages(STAGES, module="ml")
        project.write("driver.py", RUNS_IN_ONE_PROCESS)
        path = project.pipeline(PIPELINE.format(uri=gate.url).replace("churn", "gated"))
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPENLINEAGE"))}
        # the first run's last stage starts once its model's registration is held: the run then ends
        # with it still held, however slowly a loaded machine got there
        held = project.root / "registration-held"
        threading.Thread(target=lambda: gate.holding.wait(300) and held.touch(), daemon=True).start()
        driver = subprocess.Popen([sys.executable, "driver.py", str(path)], cwd=project.root, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  env={**environ, "ML_TOKEN": TOKEN, "MLFLOW_HTTP_REQUEST_TIMEOUT": "300",
                                       "ML_EVALUATE_AFTER": str(held)})
        try:
            first, second = ran(driver), ran(driver)
            gate.open()
            driver.stdin.write("\n")
            driver.stdin.flush()
            third = ran(driver)
            assert driver.wait(120) == 0
        finally:
            if driver.poll() is None:
                driver.kill()
    finally:
        gate.close()
    assert gate.held == [gate.held[0]]
    assert first["ok"] and second["ok"] and third["ok"], (first, second, third)
    assert [w for w in first["warnings"] if "MLflow" in w][0].endswith("MLflow records not delivered in time")
    assert second["warnings"] == ["the last run's MLflow records were still being sent: this run is not "
                                  "recorded in MLflow"]
    assert third["warnings"] == []

    client = server.client()
    [experiment] = [e for e in client.search_experiments() if e.name == "gated-exp"]
    recorded = {r.data.tags["hybridflow.run_id"] for r in client.search_runs([experiment.experiment_id])}
    assert recorded == {first["run_id"], third["run_id"]}
    versions = sorted(client.search_model_versions("name = 'gated'"), key=lambda v: int(v.version))
    assert [client.get_run(v.run_id).data.tags["hybridflow.run_id"] for v in versions] == \
        [first["run_id"], third["run_id"]]  # the held model is version 1, the next one's version 2
