"""A run's OpenLineage events, sent with the official client (openlineage-python) from a background
sender (sender.py): the pipeline run is a job run of its own (job: the pipeline's name), the parent
of one run per stage that executes (job: pipeline.stage), each with START and then COMPLETE, FAIL or
ABORT, its input and output datasets at the versions read and written, their schemas, hybridflow's
version ids, the rows and bytes written, and the outcomes of their data checks (quality.py). A stage
that fails on a check lists the output it could not publish (with no version) or the external input
it read, so its FAIL event says which assertion failed.

A stage that is skipped (up to date) or not run emits nothing; its outputs, at the versions they
hold, are listed with their version facets in the pipeline run's final event, so every version a
run leaves is traceable to the run that made it."""

from __future__ import annotations

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

from ..definition.lineageids import namespace_of, run_uuid
from ..results import Listener, RunResult, StageResult
from . import quality
from .datasets import TrackedDataset, read_versions, tracked, unpublished
from .sender import Sender
from .sourcecode import stage_source

INTEGRATION = "HYBRIDFLOW"
_ENDED = {"done": RunState.COMPLETE, "failed": RunState.FAIL}


class LineageEvents(Listener):
    """The run's events, told to OpenLineage; skipped and not-run stages emit nothing of their own."""

    def __init__(self, pipeline, catalog, client: OpenLineageClient, namespace: str, trigger: str,
                 timeout: float) -> None:
        self.pipeline, self.catalog, self.client = pipeline, catalog, client
        self.namespace, self.trigger, self.timeout = namespace, trigger, timeout
        self.sender: Sender | None = None  # one for each run, from its start
        self.run_id: str | None = None
        self.nominal: datetime | None = None
        self.started: set[str] = set()  # stages whose START went out (a retry reports running again)

    @classmethod
    def of(cls, pipeline, catalog, trigger: str = "manual") -> LineageEvents:
        spec = pipeline.spec.lineage
        client = OpenLineageClient(transport=_transport(pipeline)) if spec else OpenLineageClient()
        return cls(pipeline, catalog, client, namespace_of(pipeline), trigger, spec.timeout if spec else 5.0)

    # -- the run's events (told in the run's thread; each event is made and sent in the sender's) --

    def run_started(self, run_id: str, stages: list[StageResult]) -> None:
        self.sender = Sender("OpenLineage events", self.pipeline.redact)  # a watch session runs again
        self.run_id, self.started = run_id, set()
        self.nominal = self.pipeline.run_moment().astimezone(timezone.utc)  # the tick, --for, or now
        self._send(RunState.START, lambda: (self._pipeline_run(run_id), self._pipeline_job(), [], []))

    def stage_changed(self, stage: StageResult) -> None:
        if self.run_id is None:
            return
        run_id, name = self.run_id, stage.name
        if stage.status == "running" and name not in self.started:
            self.started.add(name)
            self._send(RunState.START, lambda: (
                self._stage_run(run_id, name), self._stage_job(name),
                [self._input(tracked(self.pipeline, self.catalog, ds)) for ds in self._inputs_of(name)], []))
        elif stage.status in _ENDED and name in self.started:
            state, facets = RunState.COMPLETE, {}
            if stage.status == "failed":
                state = RunState.ABORT if stage.error == "interrupted" else RunState.FAIL
                facets["errorMessage"] = _error(stage.error or "failed")
            outputs, checks = dict(stage.outputs), dict(stage.checks)
            self._send(state, lambda: self._stage_end(run_id, name, facets, outputs, checks))

    def run_finished(self, result: RunResult) -> None:
        if self.run_id != result.run_id:
            return
        run_id = self.run_id
        state = {"success": RunState.COMPLETE, "interrupted": RunState.ABORT}.get(result.status, RunState.FAIL)
        facets = {}
        if result.error is not None:
            facets["errorMessage"] = _error(self.pipeline.redact(result.error.one_line()))
        held = [(s.name, dict(s.outputs)) for s in result.stages.values() if s.status in ("done", "skipped")]
        self._send(state, lambda: (self._pipeline_run(run_id, facets), self._pipeline_job(), [],
                                   [self._output(tracked(self.pipeline, self.catalog, ds, version))
                                    for stage, outputs in held for ds, version in self._held(stage, outputs)]))
        self.run_id = None
        warning = self.sender.finish(self.timeout + 1)
        if warning:
            result.warnings.append(warning)

    def close(self) -> None:
        # the run ended before it could finish (an error outside its stages)
        if self.run_id is not None and self.sender is not None:
            self.sender.finish(0)

    # -- stages ----------------------------------------------------------------------------------

    def _stage_end(self, run_id: str, stage: str, facets: dict, outputs: dict[str, str],  # noqa: PLR0913
                   checks: dict[str, list[dict]]):
        """The stage's end; `checks`: the outcomes of its outputs' and external inputs' data checks."""
        read = read_versions(self.catalog, outputs)
        inputs = [self._input(tracked(self.pipeline, self.catalog, ds, read.get(ds)), checks.get(ds))
                  for ds in self._inputs_of(stage)]
        written = [self._output(tracked(self.pipeline, self.catalog, ds, version), checks.get(ds))
                   for ds, version in outputs.items()]
        # checked but not published: a check failed (the stage's FAIL event says which)
        written += [self._output(unpublished(self.pipeline, self.catalog, ds), checks[ds])
                    for ds in self.pipeline.stages[stage].outputs if ds in checks and ds not in outputs]
        return self._stage_run(run_id, stage, facets), self._stage_job(stage), inputs, written

    def _inputs_of(self, stage: str) -> list[str]:
        return list(self.pipeline.stages[stage].inputs)

    def _held(self, stage: str, outputs: dict[str, str]) -> list[tuple[str, str]]:
        """A stage's outputs at the versions they hold now (a skipped stage's: those published before)."""
        if outputs:
            return list(outputs.items())
        current = [(ds, self.catalog.current(ds)) for ds in self.pipeline.stages[stage].outputs]
        return [(ds, version.id) for ds, version in current if version is not None]

    # -- what an event holds ---------------------------------------------------------------------

    def _pipeline_run(self, run_id: str, facets: dict | None = None) -> Run:
        facets = dict(facets or {})
        facets["tags"] = tags_run.TagsRunFacet(tags=[
            tags_run.TagsRunFacetFields(key="hybridflow.run_id", value=run_id, source=INTEGRATION),
            tags_run.TagsRunFacetFields(key="hybridflow.trigger", value=self.trigger, source=INTEGRATION)])
        if self.nominal is not None:
            facets["nominalTime"] = nominal_time_run.NominalTimeRunFacet(nominalStartTime=_iso(self.nominal))
        return Run(runId=self._uuid(run_id), facets=facets)

    def _stage_run(self, run_id: str, stage: str, facets: dict | None = None) -> Run:
        facets = dict(facets or {})
        parent = self._uuid(run_id)
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent), job=parent_run.Job(namespace=self.namespace, name=self.pipeline.name),
            root=parent_run.Root(run=parent_run.RootRun(runId=parent),
                                 job=parent_run.RootJob(namespace=self.namespace, name=self.pipeline.name)))
        if self.nominal is not None:
            facets["nominalTime"] = nominal_time_run.NominalTimeRunFacet(nominalStartTime=_iso(self.nominal))
        return Run(runId=self._uuid(run_id, stage), facets=facets)

    def _pipeline_job(self) -> Job:
        return Job(namespace=self.namespace, name=self.pipeline.name, facets={"jobType": _job_type("DAG")})

    def _stage_job(self, stage: str) -> Job:
        facets = {"jobType": _job_type("TASK")}
        source = stage_source(self.pipeline, stage)
        if source is not None:
            facets["sourceCodeLocation"] = _source_location(source)
        return Job(namespace=self.namespace, name=f"{self.pipeline.name}.{stage}", facets=facets)

    def _uuid(self, run_id: str, stage: str | None = None) -> str:
        return run_uuid(self.namespace, self.pipeline.name, run_id, stage)

    def _facets(self, dataset: TrackedDataset, checks: list[dict] | None = None) -> dict:
        """The dataset's facets; its data checks' are `checks` (a stage's own record of them) or, for a
        version published before, those its manifest kept."""
        facets: dict = quality.facets(self.pipeline, dataset.dataset, checks or list(dataset.checks), dataset.rows)
        if dataset.fields:
            facets["schema"] = schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in dataset.fields])
        if dataset.version:
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=dataset.version)
        return facets

    def _input(self, dataset: TrackedDataset, checks: list[dict] | None = None) -> InputDataset:
        return InputDataset(namespace=dataset.namespace, name=dataset.name, facets=self._facets(dataset, checks))

    def _output(self, dataset: TrackedDataset, checks: list[dict] | None = None) -> OutputDataset:
        statistics = {}
        if dataset.rows is not None:
            statistics["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=dataset.rows, size=dataset.bytes)
        return OutputDataset(namespace=dataset.namespace, name=dataset.name, facets=self._facets(dataset, checks),
                             outputFacets=statistics)

    def _send(self, state: RunState, made) -> None:
        """One event, made by `made` (run, job, inputs, outputs) in the sender's thread, where reading
        manifests (in object storage, requests) and git cost the run nothing; its time is now."""
        moment = _iso(datetime.now(timezone.utc))

        def send() -> None:
            run, job, inputs, outputs = made()
            self.client.emit(RunEvent(eventType=state, eventTime=moment, run=run, job=job, inputs=inputs,
                                      outputs=outputs, producer=_producer()))

        self.sender.send(send)


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
