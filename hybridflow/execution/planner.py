"""Whether each stage must run, may be skipped, or needs only its new partitions, and why, in words.

The runner asks just before each stage, when its inputs are final; `plan` asks for every stage up
front and says "will be rebuilt" for inputs an earlier stage of the same run is going to replace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Callable

from ..backends import gpu
from ..data import localcache, storage
from ..data.hashing import HashCache, digest_of
from ..definition import fingerprint as fp
from ..definition.codereach import CodeIndex
from ..definition.libraries import Libraries
from ..definition.libraries import describe as describe_upgrades
from ..definition.pipeline import Pipeline
from ..engines import engine
from ..store.catalog import Version, data_digest
from ..store.incremental import DatumChanges, compare, external_datums, schema_types, version_datums
from ..store.state import RunStore
from ..store.workspace import Workspace

RUN, SKIP, INCREMENTAL = "run", "skip", "incremental"


@dataclass
class Decision:
    stage: str
    action: str  # run | skip | incremental
    reasons: list[str]
    fingerprint: fp.Fingerprint | None = None  # None while an input is not available yet (plan only)
    changes: DatumChanges | None = None  # incremental: which partitions to process
    previous: dict[str, Version] = field(default_factory=dict)  # outputs' current versions

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


class Planner:
    def __init__(self, pipeline: Pipeline, workspace: Workspace, force: bool | set[str] = False,
                 runs: RunStore | None = None) -> None:
        """runs: the workdir's run records (opened when first needed if not given)."""
        self.pipeline = pipeline
        self.workspace = workspace
        self.catalog = catalog = workspace.catalog()
        self.force = force
        self.hashes = HashCache(catalog.home / "hashes.json", shared=localcache.home() / "hashes.json")
        self.code = CodeIndex(pipeline.root)
        self.libraries = Libraries()  # read once per plan or run: a watch session sees upgrades
        key, agree = workspace.fingerprint_key()
        self.secrets = fp.SecretHasher(key, pipeline.secrets, agree=agree)
        self._runs = runs
        # a backfill (ops/backfill.py): (stage, partitioned input, its datums now, those its outputs were
        # made from) -> the partitions to process again, or None where it does not apply to the stage
        self.backfill: Callable[[str, str, dict, dict], set[str] | None] | None = None

    def forced(self, stage: str) -> bool:
        return self.force is True or (isinstance(self.force, set) and stage in self.force)

    def partitioned_input(self, stage: str) -> str | None:
        """The input an incremental stage processes partition by partition."""
        spec = self.pipeline.stages[stage]
        if not spec.incremental:
            return None
        return next((ds for ds in spec.inputs if self.pipeline.dataset(ds).partition_by), None)

    def decide(self, stage: str, rebuilt: dict[str, str] | None = None) -> Decision:
        """rebuilt: dataset -> the stage of this run that will replace it first (plan only)."""
        spec = self.pipeline.stages[stage]
        previous = {ds: v for ds in spec.outputs if (v := self.catalog.current(ds)) is not None}
        if self.forced(stage):
            return Decision(stage, RUN, ["forced"], self.fingerprint(stage), previous=previous)
        if not spec.outputs:
            return Decision(stage, RUN, ["has no outputs to compare, so it always runs"])
        pending = [ds for ds in spec.inputs if rebuilt and ds in rebuilt]
        if pending:
            return Decision(stage, RUN, [f"input {ds} will be rebuilt by stage {rebuilt[ds]}" for ds in pending])
        current = self.fingerprint(stage)
        missing = [ds for ds in spec.outputs if ds not in previous]
        if missing:
            reason = self._unpublished(stage) if len(missing) == len(spec.outputs) \
                else f"output {missing[0]} was never published"
            return Decision(stage, RUN, [reason], current, previous=previous)
        records = [v.manifest.get("fingerprint") or {} for v in previous.values()]
        backfilled = self._backfilled(stage, current, records, previous)
        if backfilled is not None:
            return backfilled
        upgraded, noted = self._upgrades(records, current)
        if all(r.get("digest") == current.digest for r in records) and not upgraded:
            runs = sorted({v.manifest.get("run_id", "?") for v in previous.values()})
            return Decision(stage, SKIP, [f"unchanged since run {', '.join(runs)}", *noted], current,
                            previous=previous)
        partitioned = self.partitioned_input(stage)
        if partitioned and _same_base(records, current) and not upgraded:
            if not _aligned(previous.values(), records[0]["datums"]):
                return Decision(stage, RUN, ["its output partitions do not match the input partitions of its last "
                                             "run, so every partition is processed again"], current, previous=previous)
            changes = compare(records[0]["datums"], current.datums or {})
            return Decision(stage, INCREMENTAL, [changes.describe(partitioned), *noted], current, changes, previous)
        reasons = fp.explain(records[0], current) + upgraded
        if not reasons:  # every part matches one output: the others come from another run
            reasons = ["its outputs were published by different runs"]
        return Decision(stage, RUN, reasons + noted, current, previous=previous)

    def _backfilled(self, stage: str, current: fp.Fingerprint, records: list[dict],
                    previous: dict[str, Version]) -> Decision | None:
        """A backfill's decision for an incremental stage: exactly the chosen partitions processed again,
        every other output partition carried over, and recorded with the digest it was made from (so a
        later run still processes an input partition that changed outside the backfill)."""
        partitioned = self.partitioned_input(stage)
        old = records[0].get("datums") if records else None
        if self.backfill is None or partitioned is None or old is None or current.datums is None:
            return None
        chosen = self.backfill(stage, partitioned, current.datums, old)
        if chosen is None:
            return None
        if not chosen:
            return Decision(stage, SKIP, [f"no partition of {partitioned} in this backfill"], current,
                            previous=previous)
        datums = {**{k: v for k, v in old.items() if k not in chosen}, **{k: current.datums[k] for k in chosen}}
        kept = fp.Fingerprint(current.code, current.params, current.settings, current.inputs, datums,
                              current.libraries)
        changes = DatumChanges(tuple(sorted(chosen)), (), tuple(sorted(set(old) - chosen)))
        shown = ", ".join(changes.changed[:3]) + (", ..." if len(changes.changed) > 3 else "")
        return Decision(stage, INCREMENTAL, [f"backfill of {len(chosen)} partition(s) of {partitioned} ({shown})"],
                        kept, changes, previous)

    def _upgrades(self, records: list[dict], current: fp.Fingerprint) -> tuple[list[str], list[str]]:
        """The libraries upgraded since the outputs were made, in one reason: (as a reason to run, as
        a note only). A pipeline with rerun_on_library_upgrade: false only notes them."""
        changes = fp.upgrades(records, current)
        if not changes:
            return [], []
        if self.pipeline.spec.rerun_on_library_upgrade:
            return [describe_upgrades(changes)], []
        return [], [f"{describe_upgrades(changes)} (not a reason to run: rerun_on_library_upgrade is false)"]

    def fingerprint(self, stage: str) -> fp.Fingerprint:
        spec = self.pipeline.stages[stage]
        partitioned = self.partitioned_input(stage)
        code = self.code.reach(spec.run)
        params = fp.visible_params(self.pipeline.root, spec.run, self.pipeline.params_for(stage), code.reads_params)
        settings = {
            "run": spec.run,
            "backend": spec.backend,
            "gpu": gpu.stage_mode(self.pipeline, stage),  # not what this machine allows: no flapping
            "incremental": spec.incremental,
            "datasets": {ds: self.pipeline.dataset(ds).model_dump(mode="json", by_alias=True, exclude={"description"})
                         for ds in [*spec.inputs, *spec.outputs]},
        }
        # engine settings that change results (Spark's conf), as the engine itself declares them
        settings.update(engine(spec.backend).result_settings(self.pipeline.engine_settings(spec.backend)))
        if code.reads_calendar:  # ctx.scheduled_for: the time the run is for decides this stage's output
            settings["scheduled_for"] = self.pipeline.run_values["scheduled_for"]
        inputs = {ds: self.input_digest(ds) for ds in spec.inputs if ds != partitioned}
        datums = self.datums(partitioned) if partitioned else None
        versions = self.libraries.versions(code.imports, engine(spec.backend).distributions)
        result = fp.Fingerprint(code.digests, self.secrets.value(params), self.secrets.value(settings),
                                inputs, datums, versions)
        self.hashes.save()
        return result

    def _unpublished(self, stage: str) -> str:
        """Why a stage has no output yet: its latest attempt failed (a run decides each stage before
        its own attempt is recorded), or it never ran."""
        if self._runs is None:
            self._runs = self.workspace.local_run_store()
        last = self._runs.last_attempt(self.pipeline.name, stage)
        return f"{last['status']} in run {last['run_id']}" if last and last["status"] != "done" else "never run"

    def warm(self, stages: list[str]) -> None:
        """The local external inputs of `stages` hashed side by side now (hashes.warm), before the
        stages are decided one after another."""
        files: list[PurePath] = []
        for dataset in dict.fromkeys(ds for stage in stages for ds in self.pipeline.stages[stage].inputs):
            path = self.pipeline.external_path(dataset) if self.pipeline.is_external(dataset) else None
            if path is not None and self.pipeline.filesystem_of(path) is None:
                files += [f for f in storage.files_under(path) if not _hidden(f, path)] if Path(path).is_dir() \
                    else [path]
        self.hashes.warm(files)

    def input_digest(self, dataset: str) -> str:
        """The content of an input as one digest: unchanged bytes give the same digest, whoever wrote them."""
        if self.pipeline.is_external(dataset):
            path = self.pipeline.external_path(dataset)
            filesystem = self.pipeline.filesystem_of(path)
            if not storage.exists(path, filesystem):
                return "missing"
            if not storage.is_dir(path, filesystem):
                return self.hashes.content(path, filesystem)
            return digest_of((f.relative_to(path).as_posix(), self.hashes.content(f, filesystem))
                             for f in storage.files_under(path, filesystem) if not _hidden(f, path))
        version = self.catalog.current(dataset)
        if version is None:
            return "missing"
        # file names are left out: engines name their part files at random
        return digest_of((PurePosixPath(f["path"]).parent.as_posix(), data_digest(f))
                         for f in version.manifest["files"])

    def datums(self, dataset: str) -> dict[str, str]:
        spec = self.pipeline.dataset(dataset)
        partition_by = tuple(spec.partition_by)
        if self.pipeline.is_external(dataset):
            path = self.pipeline.external_path(dataset)
            types = dict(spec.schema_ or {})  # the names: read without pyarrow where they can be
            filesystem = self.pipeline.filesystem_of(path)
            if not storage.is_dir(path, filesystem):
                return {}
            return external_datums(path, partition_by, self.hashes, types, filesystem)
        version = self.catalog.current(dataset)
        return version_datums(version.manifest, partition_by, schema_types(version.schema)) if version else {}


def _same_base(records: list[dict], current: fp.Fingerprint) -> bool:
    """Every output was made from the same code, params, settings and other inputs, over the same
    partitions: only then can the partitions that changed be processed alone."""
    first = records[0]
    return (first.get("datums") is not None and all(r.get("base") == current.base for r in records)
            and all(r.get("datums") == first["datums"] for r in records))


def _aligned(outputs, datums: dict[str, str]) -> bool:
    """Every partition of the current outputs belongs to a datum of the last run; if not (the
    outputs were changed by hand, or keys are spelt in a way we cannot match), only a full run is safe."""
    for version in outputs:
        keys = version_datums(version.manifest, tuple(version.manifest.get("partition_by", ())),
                              schema_types(version.schema))
        if not set(keys) <= set(datums):
            return False
    return True


def _hidden(file: PurePath, root: PurePath) -> bool:
    return any(part.startswith((".", "_")) for part in file.relative_to(root).parts)
