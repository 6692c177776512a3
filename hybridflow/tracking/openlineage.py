"""A run's OpenLineage events, sent with the official client (openlineage-python) from a background
sender (sender.py): the pipeline run is a job run of its own (job: the pipeline's name), the parent
of one run per stage that executes (job: pipeline.stage), each with START and then COMPLETE, FAIL or
ABORT, its input and output datasets at the versions read and written, their schemas, hybridflow's
version ids and the rows and bytes written.

A stage that is skipped (up to date) or not run emits nothing; its outputs, at the versions they
hold, are listed with their version facets in the pipeline run's final event, so every version a
run leaves is traceable to the run that made it."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    nominal_time_run,
    output_statistics_output_dataset,
    parent_run,
    schema_dataset,
    source_code_location_job,
    tags_run,
)

from ..results import Listener, RunResult, StageResult
from .datasets import TrackedDataset, read_versions, tracked
from .schedule import scheduled_for
from .sender import Sender
from .sourcecode import stage_source

DEFAULT_NAMESPACE = "hybridflow"
INTEGRATION = "HYBRIDFLOW"
_ENDED = {"done": RunState.COMPLETE, "failed": RunState.FAIL}


class LineageEvents(Listener):
    """The run's events, told to OpenLineage; skipped and not-run stages emit nothing of their own."""

    def __init__(self, pipeline, catalog, client: OpenLineageClient, namespace: str, trigger: str,
                 timeout: float) -> None:
        self.pipeline, self.catalog, self.client = pipeline, catalog, client
        self.namespace, self.trigger, self.timeout = namespace, trigger, timeout
        self.sender = Sender("OpenLineage events", pipeline.redact)
        self.run_id: str | None = None
        self.nominal: datetime | None = None
        self.started: set[str] = set()  # stages whose START went out (a retry reports running again)

    @classmethod
    def of(cls, pipeline, catalog, trigger: str = "manual") -> LineageEvents:
        spec = pipeline.spec.lineage
        namespace = (spec and spec.namespace) or os.environ.get("OPENLINEAGE_NAMESPACE") or DEFAULT_NAMESPACE
        client = OpenLineageClient(transport=_transport(pipeline)) if spec else OpenLineageClient()
        return cls(pipeline, catalog, client, namespace, trigger, spec.timeout if spec else 5.0)

    # -- the run's events ------------------------------------------------------------------------

    def run_started(self, run_id: str, stages: list[StageResult]) -> None:
        self.run_id, self.started = run_id, set()
        self.nominal = scheduled_for(self.pipeline, self.trigger, datetime.now(timezone.utc))
        self._emit(RunState.START, self._pipeline_run(), self._pipeline_job(), [], [])

    def stage_changed(self, stage: StageResult) -> None:
        if self.run_id is None:
            return
        if stage.status == "running" and stage.name not in self.started:
            self.started.add(stage.name)
            inputs = [self._input(tracked(self.pipeline, self.catalog, ds)) for ds in self._inputs_of(stage.name)]
            self._emit(RunState.START, self._stage_run(stage), self._stage_job(stage.name), inputs, [])
        elif stage.status in _ENDED and stage.name in self.started:
            self._emit_stage_end(stage)

    def run_finished(self, result: RunResult) -> None:
        if self.run_id != result.run_id:
            return
        state = {"success": RunState.COMPLETE, "interrupted": RunState.ABORT}.get(result.status, RunState.FAIL)
        facets = {}
        if result.error is not None:
            facets["errorMessage"] = _error(self.pipeline.redact(result.error.one_line()))
        outputs = [self._output(tracked(self.pipeline, self.catalog, ds, version))
                   for stage in result.stages.values() if stage.status in ("done", "skipped")
                   for ds, version in self._held_outputs(stage).items()]
        self._emit(state, self._pipeline_run(facets), self._pipeline_job(), [], outputs)
        self.run_id = None
        warning = self.sender.finish(self.timeout + 1)
        if warning:
            result.warnings.append(warning)

    def close(self) -> None:
        if self.run_id is not None:  # the run ended before it could finish (an error outside its stages)
            self.sender.finish(0)

    # -- stages ----------------------------------------------------------------------------------

    def _emit_stage_end(self, stage: StageResult) -> None:
        state = _ENDED[stage.status]
        facets = {}
        if stage.status == "failed":
            state = RunState.ABORT if stage.error == "interrupted" else RunState.FAIL
            facets["errorMessage"] = _error(stage.error or "failed")
        read = read_versions(self.catalog, stage.outputs)
        inputs = [self._input(tracked(self.pipeline, self.catalog, ds, read.get(ds)))
                  for ds in self._inputs_of(stage.name)]
        outputs = [self._output(tracked(self.pipeline, self.catalog, ds, version))
                   for ds, version in stage.outputs.items()]
        self._emit(state, self._stage_run(stage, facets), self._stage_job(stage.name), inputs, outputs)

    def _inputs_of(self, stage: str) -> list[str]:
        return list(self.pipeline.stages[stage].inputs)

    def _held_outputs(self, stage: StageResult) -> dict[str, str | None]:
        """A stage's outputs at the versions they hold now (a skipped stage's, the ones published before)."""
        if stage.outputs:
            return dict(stage.outputs)
        held = {}
        for ds in self.pipeline.stages[stage.name].outputs:
            version = self.catalog.current(ds)
            if version is not None:
                held[ds] = version.id
        return held

    # -- what an event holds ---------------------------------------------------------------------

    def _pipeline_run(self, facets: dict | None = None) -> Run:
        facets = dict(facets or {})
        facets["tags"] = tags_run.TagsRunFacet(tags=[
            tags_run.TagsRunFacetFields(key="hybridflow.run_id", value=self.run_id, source="HYBRIDFLOW"),
            tags_run.TagsRunFacetFields(key="hybridflow.trigger", value=self.trigger, source="HYBRIDFLOW")])
        if self.nominal is not None:
            facets["nominalTime"] = nominal_time_run.NominalTimeRunFacet(nominalStartTime=_iso(self.nominal))
        return Run(runId=self._uuid(), facets=facets)

    def _stage_run(self, stage: StageResult, facets: dict | None = None) -> Run:
        facets = dict(facets or {})
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=self._uuid()),
            job=parent_run.Job(namespace=self.namespace, name=self.pipeline.name),
            root=parent_run.Root(run=parent_run.RootRun(runId=self._uuid()),
                                 job=parent_run.RootJob(namespace=self.namespace, name=self.pipeline.name)))
        if self.nominal is not None:
            facets["nominalTime"] = nominal_time_run.NominalTimeRunFacet(nominalStartTime=_iso(self.nominal))
        return Run(runId=self._uuid(stage.name), facets=facets)

    def _pipeline_job(self) -> Job:
        return Job(namespace=self.namespace, name=self.pipeline.name, facets={"jobType": _job_type("DAG")})

    def _stage_job(self, stage: str) -> Job:
        facets = {"jobType": _job_type("TASK")}
        source = stage_source(self.pipeline, stage)
        if source is not None:
            facets["sourceCodeLocation"] = _source_location(source)
        return Job(namespace=self.namespace, name=f"{self.pipeline.name}.{stage}", facets=facets)

    def _uuid(self, stage: str | None = None) -> str:
        """A run's id, the same for every event of it (OpenLineage wants a UUID, hybridflow's run ids
        are not: the pipeline's run id is in its tags facet)."""
        key = f"hybridflow:{self.namespace}:{self.pipeline.name}:{self.run_id}" + (f":{stage}" if stage else "")
        return str(uuid.uuid5(uuid.NAMESPACE_URL, key))

    @staticmethod
    def _facets(dataset: TrackedDataset) -> dict:
        facets: dict = {}
        if dataset.fields:
            facets["schema"] = schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in dataset.fields])
        if dataset.version:
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=dataset.version)
        return facets

    def _input(self, dataset: TrackedDataset) -> InputDataset:
        return InputDataset(namespace=dataset.namespace, name=dataset.name, facets=self._facets(dataset))

    def _output(self, dataset: TrackedDataset) -> OutputDataset:
        statistics = {}
        if dataset.rows is not None:
            statistics["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=dataset.rows, size=dataset.bytes)
        return OutputDataset(namespace=dataset.namespace, name=dataset.name, facets=self._facets(dataset),
                             outputFacets=statistics)

    def _emit(self, state: RunState, run: Run, job: Job, inputs: list, outputs: list) -> None:
        event = RunEvent(eventType=state, eventTime=_iso(datetime.now(timezone.utc)), run=run, job=job,
                         inputs=inputs, outputs=outputs, producer=_producer())
        self.sender.send(lambda: self.client.emit(event))


def _transport(pipeline):
    """The transport `lineage:` asks for."""
    spec = pipeline.spec.lineage
    if spec.transport == "file":
        from openlineage.client.transport.file import FileConfig, FileTransport

        path = Path(spec.path)
        path = path if path.is_absolute() else pipeline.root / path
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileTransport(FileConfig(log_file_path=str(path), append=True))
    from openlineage.client.transport.http import ApiKeyTokenProvider, HttpConfig, HttpTransport, TokenProvider

    auth = ApiKeyTokenProvider({"apiKey": spec.api_key}) if spec.api_key else TokenProvider({})
    # one retry: a sender that waits long for a tracker that is down only delays the run's warning
    retry = {"total": 1, "backoff_factor": 0.2, "status_forcelist": [500, 502, 503, 504]}
    return HttpTransport(HttpConfig(url=spec.url, endpoint=spec.endpoint, timeout=spec.timeout, auth=auth,
                                    retry=retry))


def _job_type(kind: str) -> job_type_job.JobTypeJobFacet:
    return job_type_job.JobTypeJobFacet(processingType="BATCH", integration=INTEGRATION, jobType=kind)


def _error(message: str) -> error_message_run.ErrorMessageRunFacet:
    return error_message_run.ErrorMessageRunFacet(message=message, programmingLanguage="PYTHON")


def _source_location(source) -> source_code_location_job.SourceCodeLocationJobFacet:
    url = source.file.as_uri()
    if source.git is None:
        return source_code_location_job.SourceCodeLocationJobFacet(type="file", url=url)
    return source_code_location_job.SourceCodeLocationJobFacet(
        type="git", url=url, repoUrl=source.git.remote, path=source.in_repository, version=source.git.commit)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _producer() -> str:
    try:
        version = metadata.version("hybridflow")
    except metadata.PackageNotFoundError:
        version = "dev"
    return f"https://pypi.org/project/hybridflow/{version}/"
