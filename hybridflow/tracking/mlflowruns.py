"""A run recorded in MLflow (`mlflow:`): the hybridflow run is an MLflow run (tagged with its run id,
pipeline, trigger, schedule time and git commit; the pipeline's params logged), and each stage that
executes is a run nested in it, with its params, its inputs as MLflow datasets (hybridflow's digest,
the source URI, the Arrow schema), what its code logged through ctx.mlflow, and its `kind: files`
outputs declared `mlflow: {model: NAME}` logged as artifacts and registered as a new version of NAME.
A stage's ctx.mlflow.set_model_alias points an alias at the version registered from the model it read.

Every call to MLflow goes out from the background sender (sender.py), in order: a tracking server
that is slow or down costs its record and one warning line, never the run. mlflow is imported there
too, so the run does not wait for it."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import PurePosixPath

from ..backends.stagemlflow import record_of, recorded
from ..results import Listener, RunResult, StageResult
from .datasets import TrackedDataset, read_versions, tracked
from .sender import Sender
from .sourcecode import git_of

FINISH_SECONDS = 60.0  # at the run's end, the longest wait for what is queued (a model's upload)
RUN_STATUS = {"success": "FINISHED", "interrupted": "KILLED"}
MAX_PARAM = 6000  # characters MLflow keeps of a param's value


class MlflowRuns(Listener):
    # the last run's sender in this process: a watch session's (or the API's) next run is a new listener,
    # and waits for what the last one still sends (a model registered late would take the next one's number)
    last_sender: Sender | None = None

    def __init__(self, pipeline, catalog, trigger: str = "manual") -> None:
        self.pipeline, self.catalog, self.trigger = pipeline, catalog, trigger
        self.spec = pipeline.spec.mlflow
        self.sender: Sender | None = None  # one for each run, from its start
        self.client = None  # made in the sender's thread (importing mlflow takes seconds)
        self.run_id: str | None = None  # hybridflow's
        self.parent: str | None = None  # the MLflow run's id, once made
        self.experiment_id: str | None = None
        self.opened_for: str | None = None  # the hybridflow run the MLflow run was made for
        self.stages: dict[str, str] = {}  # stage -> its nested MLflow run's id
        self.registered: dict[tuple[str, str], str] = {}  # (model, dataset version) -> model version
        # (stage, alias, model, the versions it read) asked for by stage code, set at the run's end
        self.aliases: list[tuple[str, str, str | None, dict[str, str]]] = []
        self.unrecorded: str | None = None  # why this run is not in MLflow: said after the run's summary

    # -- the run's events ------------------------------------------------------------------------

    def run_started(self, run_id: str, stages: list[StageResult]) -> None:
        last = MlflowRuns.last_sender
        if last is not None and not last.drained(FINISH_SECONDS):
            # recorded beside it, this run could register its model before the last one's, or name a version
            # the last one has not registered yet
            self.run_id = None
            self.unrecorded = "the last run's MLflow records were still being sent: this run is not recorded in MLflow"
            return
        self.sender = MlflowRuns.last_sender = Sender("MLflow records", self.pipeline.redact)
        self.run_id, self.parent, self.stages, self.aliases = run_id, None, {}, []
        started = datetime.now(timezone.utc)
        self.sender.send(lambda: self._open_run(run_id, started))

    def stage_changed(self, stage: StageResult) -> None:
        if self.run_id is None:
            return
        if stage.status == "running" and stage.name not in self.stages:
            self.stages[stage.name] = ""  # its MLflow run is being made
            self.sender.send(lambda: self._open_stage(stage.name))
        elif stage.status in ("done", "failed") and stage.name in self.stages:
            ended = (stage.name, stage.status, stage.error, dict(stage.outputs), stage.log_path)
            self.sender.send(lambda: self._close_stage(*ended))

    def run_finished(self, result: RunResult) -> None:
        if self.run_id != result.run_id:
            if self.unrecorded:
                result.warnings.append(self.unrecorded)
                self.unrecorded = None
            return
        self.sender.send(lambda: self._set_aliases())
        self.sender.send(lambda: self._client().set_terminated(self._parent(), RUN_STATUS.get(result.status,
                                                                                               "FAILED")))
        self.run_id = None
        warning = self.sender.finish(FINISH_SECONDS)
        if warning:
            result.warnings.append(warning)

    def close(self) -> None:
        if self.run_id is not None and self.sender is not None:  # the run ended outside its stages
            self.sender.finish(0)

    # -- in the sender's thread ------------------------------------------------------------------

    def _client(self):
        if self.client is None:
            # a server that is down is given up on in seconds, not MLflow's default minutes
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.spec.tracking_uri or None)
        return self.client

    def _parent(self) -> str:
        if self.parent is None:
            raise RuntimeError("the run's MLflow run could not be made")
        return self.parent

    def _open_run(self, run_id: str, started: datetime) -> None:
        client = self._client()
        name = self.spec.experiment or self.pipeline.name
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        tags = {"hybridflow.run_id": run_id, "hybridflow.pipeline": self.pipeline.name,
                "hybridflow.trigger": self.trigger, "mlflow.source.name": str(self.pipeline.file)}
        tags["hybridflow.scheduled_for"] = self.pipeline.run_moment().isoformat()  # the tick, --for, or now
        git = git_of(self.pipeline.root)
        if git is not None:
            tags["mlflow.source.git.commit"] = git.commit
        run = client.create_run(experiment_id, start_time=int(started.timestamp() * 1000), tags=tags,
                                run_name=run_id)
        self.experiment_id, self.parent, self.opened_for = experiment_id, run.info.run_id, run_id
        self._log_params(self.parent, {**self.pipeline.spec.params, **self.pipeline.overrides})

    def _open_stage(self, stage: str) -> None:
        client = self._client()
        tags = {"mlflow.parentRunId": self._parent(), "hybridflow.run_id": self.opened_for,
                "hybridflow.pipeline": self.pipeline.name, "hybridflow.stage": stage,
                "hybridflow.backend": self.pipeline.stages[stage].backend}
        run = client.create_run(self.experiment_id, tags=tags, run_name=stage)
        self.stages[stage] = run.info.run_id
        self._log_params(run.info.run_id, self.pipeline.params_for(stage))

    def _close_stage(self, stage: str, status: str, error: str | None, outputs: dict[str, str],
                     log_path: str | None) -> None:
        client, run_id = self._client(), self.stages.get(stage)
        if not run_id:
            raise RuntimeError(f"stage '{stage}' has no MLflow run")
        read = read_versions(self.catalog, outputs)
        inputs = [tracked(self.pipeline, self.catalog, ds, read.get(ds)) for ds in self.pipeline.stages[stage].inputs]
        if inputs:
            client.log_inputs(run_id, datasets=[_mlflow_dataset(ds) for ds in inputs])
        self._log_stage_code(stage, run_id, read, record_of(log_path) if log_path else None,
                             self.pipeline.redact(error) if error else None)
        if status == "done":
            for dataset, version in outputs.items():
                self._register(stage, run_id, dataset, version)
        client.set_terminated(run_id, "FINISHED" if status == "done" else
                              "KILLED" if error == "interrupted" else "FAILED")

    def _log_stage_code(self, stage: str, run_id: str, read: dict[str, str], record, error: str | None) -> None:
        """What the stage's code logged through ctx.mlflow; the aliases it set are set at the run's end."""
        from mlflow.entities import Metric, RunTag

        metrics, tags, params = [], [], {}
        for call in recorded(record) if record else ():
            kind = call["kind"]
            if kind == "metric":
                metrics.append(Metric(call["key"], call["value"], call["timestamp"], call["step"] or 0))
            elif kind == "tag":
                tags.append(RunTag(call["key"], self.pipeline.redact(call["value"])))
            elif kind == "param":
                params[call["key"]] = call["value"]
            elif kind == "alias":
                self.aliases.append((stage, call["alias"], call["model"], read))
        if error:
            tags.append(RunTag("hybridflow.error", error[:5000]))
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics in one batch
            self._client().log_batch(run_id, metrics=metrics[start:start + 1000])
        if tags:
            self._client().log_batch(run_id, tags=tags)
        self._log_params(run_id, params)

    def _register(self, stage: str, run_id: str, dataset: str, version_id: str) -> None:
        """A files output declared `mlflow: {model: NAME}`: its files are the stage run's artifacts,
        registered as a new version of NAME."""
        declared = self.pipeline.dataset(dataset).mlflow
        if declared is None:
            return
        client = self._client()
        version = self.catalog.version(dataset, version_id)
        local = self.catalog.local_copy(version)
        for entry in version.manifest["files"]:  # the stage's files, not hybridflow's manifest
            folder = PurePosixPath(dataset, entry["path"]).parent
            client.log_artifact(run_id, str(local / entry["path"]), artifact_path=str(folder))
        if not client.search_registered_models(filter_string=f"name = '{declared.model}'"):
            client.create_registered_model(declared.model)
        model_version = client.create_model_version(
            declared.model, source=f"runs:/{run_id}/{dataset}", run_id=run_id,
            tags={"hybridflow.dataset": dataset, "hybridflow.version": version_id, "hybridflow.stage": stage})
        self.registered[(declared.model, version_id)] = model_version.version

    def _set_aliases(self) -> None:
        for stage, alias, model, read in self.aliases:
            name, version_id = self._model_read_by(stage, model, read)
            client = self._client()
            version = self.registered.get((name, version_id))
            if version is None:  # registered by an earlier run (the model's stage was skipped)
                found = client.search_model_versions(f"name = '{name}' and tags.`hybridflow.version` = '{version_id}'")
                if not found:
                    raise RuntimeError(f"no version of model '{name}' was registered from {version_id}")
                version = found[0].version
            client.set_registered_model_alias(name, alias, str(version))

    def _model_read_by(self, stage: str, model: str | None, read: dict[str, str]) -> tuple[str, str]:
        """The registered model and the dataset version a stage's alias names: the model it read."""
        candidates = [(self.pipeline.dataset(ds).mlflow.model, ds) for ds in self.pipeline.stages[stage].inputs
                      if self.pipeline.dataset(ds).mlflow is not None]
        chosen = [(name, ds) for name, ds in candidates if model in (None, name)]
        if len(chosen) != 1:
            raise RuntimeError(f"stage '{stage}' set a model alias, but reads {len(chosen)} inputs declared "
                               f"mlflow: {{model: {model or '...'}}}")
        name, dataset = chosen[0]
        return name, read.get(dataset) or self.catalog.current(dataset).id

    def _log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        # a param may hold a value from ${env:...}: MLflow gets *** in its place, as every record does
        flat = [Param(str(k), self.pipeline.redact(v if isinstance(v, str) else json.dumps(v, default=str))[:MAX_PARAM])
                for k, v in params.items()]
        for start in range(0, len(flat), 100):  # MLflow takes at most 100 params in one batch
            self._client().log_batch(run_id, params=flat[start:start + 100])


def _mlflow_dataset(dataset: TrackedDataset):
    from mlflow.entities import Dataset, DatasetInput, InputTag

    source = {"uri": dataset.uri, "hybridflow_version": dataset.version}
    schema = {"mlflow_colspec": [{"name": name, "type": kind} for name, kind in dataset.fields]}
    profile = {"num_rows": dataset.rows, "bytes": dataset.bytes}
    entity = Dataset(name=dataset.dataset, digest=dataset.digest or "external", source_type="hybridflow",
                     source=json.dumps(source), schema=json.dumps(schema) if dataset.fields else None,
                     profile=json.dumps(profile))
    return DatasetInput(entity, tags=[InputTag("mlflow.data.context", "input")])

