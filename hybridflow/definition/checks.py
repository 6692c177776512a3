"""Checks that need the whole pipeline: names, the dataset graph, stage functions, extras."""

from __future__ import annotations

import importlib.util
import keyword
from pathlib import Path

from ..data.arrow_types import ArrowTypeError, check_arrow_type
from ..data.storage import is_object_uri, object_path, scheme_problem
from ..diagnostics import Problem, did_you_mean
from ..engines import engine, engines
from . import datachecks, signature, sqlstage
from .model import IDENTIFIER
from .pipeline import Pipeline
from .sqlstage import is_sql
from .stagecode import inspect_target


def check_pipeline(pipeline: Pipeline) -> list[Problem]:
    problems: list[Problem] = []
    for check in (_check_root, _check_names, _check_producers, _check_inputs, _check_datasets,
                  _check_incremental, _check_cycles, _check_functions, _check_extras, _check_stores,
                  datachecks.pipeline_problems):
        problems += check(pipeline)
    return problems


def name_problem(name: str, what: str) -> str | None:
    """Why `name` cannot be a stage or dataset name (they become keyword arguments and directory names)."""
    if not isinstance(name, str) or not IDENTIFIER.match(name):
        return (f"{what} name '{name}' must be a plain identifier (letters, digits and _, not starting "
                "with a digit; no '/', '.', '..' or spaces)")
    if keyword.iskeyword(name) or name == signature.CTX:
        return f"{what} name '{name}' is reserved in Python stage functions: choose another name"
    return None


def _check_incremental(p: Pipeline) -> list[Problem]:
    """An incremental stage maps each partition of one partitioned input to the same partitions of each
    of its outputs, so those must exist and line up."""
    problems = []
    for stage, spec in p.stages.items():
        if not spec.incremental:
            continue
        at = ("stages", stage, "incremental")
        partitioned = [ds for ds in spec.inputs if p.dataset(ds).partition_by]
        if len(partitioned) != 1:
            found = f"it has {len(partitioned)} ({', '.join(partitioned)})" if partitioned else "it has none"
            problems.append(p.source.problem(at, f"incremental stage '{stage}' needs exactly one input with "
                                                 f"partition_by to process partition by partition; {found}"))
            continue
        columns = p.dataset(partitioned[0]).partition_by
        if p.dataset(partitioned[0]).format != "parquet":
            problems.append(p.source.problem(at, f"incremental stage '{stage}' reads '{partitioned[0]}' as "
                                                 f"{p.dataset(partitioned[0]).format}: partitions are tracked for "
                                                 "parquet inputs only"))
        for ds in spec.outputs:
            out = p.dataset(ds)
            if out.kind == "files":
                problems.append(p.source.problem(at, f"incremental stage '{stage}' cannot have the files output "
                                                     f"'{ds}': only partitioned tables can be updated in part"))
            elif out.partition_by != columns:
                problems.append(p.source.problem(
                    at, f"output '{ds}' of incremental stage '{stage}' must be partitioned like its input "
                        f"'{partitioned[0]}' (partition_by: [{', '.join(columns)}]), not "
                        f"[{', '.join(out.partition_by)}]"))
    return problems


def _check_root(p: Pipeline) -> list[Problem]:
    if p.root.is_dir():
        return []
    return [p.source.problem(("root",), f"root directory {p.root} does not exist")]


def _check_names(p: Pipeline) -> list[Problem]:
    problems = []
    for stage, spec in p.stages.items():
        if (why := name_problem(stage, "stage")):
            problems.append(p.source.problem(("stages", stage), why, at_key=True))
        for field in ("inputs", "outputs"):
            for i, dataset in enumerate(getattr(spec, field)):
                if (why := name_problem(dataset, "dataset")):
                    problems.append(p.source.problem(("stages", stage, field, i), why))
    for dataset in p.spec.datasets:
        if (why := name_problem(dataset, "dataset")):
            problems.append(p.source.problem(("datasets", dataset), why, at_key=True))
    return problems


def _check_producers(p: Pipeline) -> list[Problem]:
    problems = []
    first: dict[str, tuple] = {}
    for stage, spec in p.stages.items():
        for i, dataset in enumerate(spec.outputs):
            here = ("stages", stage, "outputs", i)
            if dataset in first:
                other = first[dataset]
                problems.append(p.source.problem(here, f"dataset '{dataset}' is already produced by stage "
                                                       f"'{other[1]}': each dataset has one producer"))
                continue
            first[dataset] = here
            if dataset in spec.inputs:
                problems.append(p.source.problem(here, f"stage '{stage}' both reads and writes '{dataset}': "
                                                       "write a new dataset instead"))
        for field in ("inputs", "outputs"):
            names = getattr(spec, field)
            for i, dataset in enumerate(names):
                if dataset in names[:i]:
                    problems.append(p.source.problem(("stages", stage, field, i),
                                                     f"'{dataset}' is listed twice in {field}"))
    return problems


def _check_inputs(p: Pipeline) -> list[Problem]:
    problems = []
    known = set(p.dag.producer) | set(p.spec.datasets)
    for stage, spec in p.stages.items():
        for i, dataset in enumerate(spec.inputs):
            if dataset in p.dag.producer or p.dataset(dataset).path:
                continue
            if dataset in p.spec.datasets:  # declared on purpose, so not a typo: no "did you mean"
                why = (f"dataset '{dataset}' is declared without a path and no stage produces it "
                       "(give it a path, or add a stage that produces it)")
            else:
                why = (f"no stage produces dataset '{dataset}' and it is not declared under datasets with a path"
                       f"{did_you_mean(dataset, known - {dataset} - set(spec.outputs))}")
            problems.append(p.source.problem(("stages", stage, "inputs", i), why))
    return problems


def _check_datasets(p: Pipeline) -> list[Problem]:
    problems = []
    consumed = {d for s in p.stages.values() for d in s.inputs}
    for name, ds in p.spec.datasets.items():
        at = ("datasets", name)
        producer = p.dag.producer.get(name)
        if ds.path and producer:
            problems.append(p.source.problem(at + ("path",), f"dataset '{name}' has a path but is produced by "
                                             f"stage '{producer}': produced datasets live in the workdir "
                                             "(remove the path)"))
        if not ds.path and ds.format != "parquet":
            problems.append(p.source.problem(at + ("format",), f"dataset '{name}': hand-offs between stages are "
                                             f"always parquet; format {ds.format} is for external inputs only"))
        if ds.kind == "files" and ds.schema_:
            problems.append(p.source.problem(at + ("schema",), f"dataset '{name}' is kind: files and cannot "
                                             "have a schema (schemas describe tables)", at_key=True))
        problems += _partition_problems(p, name, ds) + _schema_problems(p, name, ds)
        wrong = scheme_problem(ds.path)
        if wrong is not None:
            problems.append(p.source.problem(at + ("path",), f"dataset '{name}': {wrong}"))
            continue
        wrong = _object_uri_problem(p, ds.path)
        if wrong is not None:
            problems.append(p.source.problem(at + ("path",), f"dataset '{name}': {wrong}"))
            continue
        if ds.path and not producer and name in consumed:
            problems += _missing_input(p, name)
        if not producer and name not in consumed:
            problems.append(p.source.problem(at, f"dataset '{name}' is declared but no stage reads or writes it",
                                             severity="warning", at_key=True))
        problems += _footer_problems(p, name, ds)
    return problems


def _object_uri_problem(p: Pipeline, path: str | None) -> str | None:
    """What is wrong with an object-storage URI (None: nothing, or not one): no bucket, or another
    store than the pipeline's (engines are handed the settings of one store)."""
    if not is_object_uri(path):
        return None
    try:
        object_path(path)
    except ValueError as exc:
        return str(exc)
    store = p.store_uri.split("://", 1)[0]
    if not path.startswith(f"{store}://"):
        return (f"a pipeline reaches one object store, and this one's is {store}:// (its workdir, or its first "
                f"input there); copy the input into {store}://")
    return None


def _schema_problems(p: Pipeline, name: str, ds) -> list[Problem]:
    """Each declared column type that is not one of the contract's."""
    problems = []
    for column, type_text in (ds.schema_ or {}).items():
        try:
            check_arrow_type(type_text)
        except ArrowTypeError as exc:
            problems.append(p.source.problem(("datasets", name, "schema", column), f"dataset '{name}', column "
                                             f"'{column}': {exc}"))
    return problems


def _missing_input(p: Pipeline, name: str) -> list[Problem]:
    """An external input not there yet: a warning (it must exist when a run starts). An s3:// input is
    looked at when a run starts: validate works offline."""
    if not _local(p, name) or p.external_path(name).exists():
        return []
    return [p.source.problem(("datasets", name, "path"), f"external dataset '{name}' does not exist yet at "
                             f"{p.external_path(name)} (it must exist when a run starts)", severity="warning")]


def _local(p: Pipeline, name: str) -> bool:
    return not is_object_uri(p.dataset(name).path)


def _footer_problems(p: Pipeline, name: str, ds) -> list[Problem]:
    """Warnings from an existing external Parquet input's footers (no data is read): a file that a
    run would refuse, or a type an engine of a stage reading it cannot hold. With a declared schema,
    only each file's framing is checked: no type needs reading, so validate imports no pyarrow (a
    run reads every footer before a stage starts)."""
    from ..data import storage
    from ..data.footers import framing_problem, read_footers
    from ..errors import DataError

    if (not ds.path or ds.format != "parquet" or ds.kind != "table" or not _local(p, name)
            or not p.external_path(name).exists()):
        return []
    at = ("datasets", name, "path")
    files = storage.data_files(p.external_path(name))
    if ds.schema_ and files:  # declared: the check of the declared schema says what is wrong with a type
        framing = next(((file, problem) for file in files if (problem := framing_problem(file))), None)
        return [p.source.problem(at, f"input '{name}': {framing[0]} {framing[1]}", severity="warning")] \
            if framing else []
    try:
        footers = read_footers(name, files)
    except DataError as exc:
        return [p.source.problem(at, exc.message, severity="warning")]
    readers = sorted({s.backend for s in p.stages.values() if name in s.inputs})
    return [p.source.problem(at, f"external dataset '{name}' (read by a {reader} stage), {problem}",
                             severity="warning")
            for reader in readers if (check := engine(reader).unrepresentable) for problem in check(footers.schema)]


def _partition_problems(p: Pipeline, name: str, ds) -> list[Problem]:
    at = ("datasets", name, "partition_by")
    if ds.partition_by and ds.kind == "files":
        return [p.source.problem(at, f"dataset '{name}' is kind: files and cannot be partitioned", at_key=True)]
    problems = []
    for i, column in enumerate(ds.partition_by):
        if column in ds.partition_by[:i]:
            problems.append(p.source.problem(at + (i,), f"'{column}' is listed twice in partition_by"))
        elif not directory_safe(column):
            problems.append(p.source.problem(at + (i,), f"dataset '{name}' cannot be partitioned by '{column}': "
                                             "a partition column names directories, where engines spell a leading "
                                             "'.', a control character or any of / = % : ? * # \\ \" ' [ ] { } ^ "
                                             "differently (rename the column)"))
        elif ds.schema_ is not None and column not in ds.schema_:
            problems.append(p.source.problem(at + (i,), f"dataset '{name}' is partitioned by '{column}', which is "
                                             f"not in its schema{did_you_mean(column, ds.schema_)} (declare its type "
                                             "there so every engine reads it back as that type)"))
    return problems


def directory_safe(column: str) -> bool:
    """Whether every engine writes `column` into a partition directory's name as it is: Spark escapes
    what tables.hive_escape does (pyarrow, Ray and Dask do not), and every reader skips a '.' name."""
    from ..data.tables import hive_escape

    return not column.startswith(".") and hive_escape(column) == column


def _check_cycles(p: Pipeline) -> list[Problem]:
    cycle = p.dag.find_cycle()
    if not cycle or len(cycle) == 2:  # a stage reading its own output is reported on its own
        return []
    return [p.source.problem(("stages", cycle[0]), f"the stages form a cycle: {' -> '.join(cycle)}", at_key=True)]


def _check_functions(p: Pipeline) -> list[Problem]:
    problems = []
    if not p.root.is_dir():
        return problems
    for stage, spec in p.stages.items():
        at = ("stages", stage, "run")
        if is_sql(spec.run):
            problems += _check_query(p, stage)
            continue
        target = inspect_target(p.root, spec.run)
        if target.error and target.error_line and target.file:
            problems.append(Problem(_shown(target.file), target.error_line, 1,
                                    f"{target.error} (the code of stage '{stage}')"))
        elif target.error:
            problems.append(p.source.problem(at, f"stage '{stage}': {target.error}"))
        elif target.params is not None:
            param_names = set(p.params_for(stage))
            for why in signature.call_problems(target.params, spec.inputs, param_names):
                problems.append(p.source.problem(at, f"stage '{stage}' cannot call {spec.run}: {why}"))
        for dataset in set(spec.inputs) & set(p.params_for(stage)):
            problems.append(p.source.problem(("stages", stage, "inputs"), f"stage '{stage}': '{dataset}' is both "
                                             "an input and a param: rename one of them"))
    return problems


def _check_query(p: Pipeline, stage: str) -> list[Problem]:
    """A SQL stage: an engine that runs SQL, one output, and a query that parses and reads only the
    stage's inputs with only its params (each problem at its place in the .sql file)."""
    spec = p.stages[stage]
    info = engines().get(spec.backend)
    if info is None:
        return []  # an unknown backend is reported on its own
    if info.sql_dialect is None:
        runs_sql = sorted(name for name, e in engines().items() if e.sql_dialect)
        return [p.source.problem(("stages", stage, "run"), f"stage '{stage}' runs a SQL query, which backend "
                                 f"'{spec.backend}' cannot (backends that run SQL: {', '.join(runs_sql)})")]
    problems = []
    if len(spec.outputs) != 1:
        problems.append(p.source.problem(("stages", stage, "outputs"), f"SQL stage '{stage}' has "
                                         f"{len(spec.outputs)} outputs: its query's result is its one output"))
    file = sqlstage.file_of(p.root, spec.run)
    if not file.is_file():
        return problems + [p.source.problem(("stages", stage, "run"),
                                            f"stage '{stage}': SQL file '{spec.run}' not found under root {p.root}")]
    return problems + sqlstage.problems(p.root, spec.run, info.sql_dialect, list(spec.inputs),
                                        set(p.params_for(stage)), stage, _shown(file))


def _check_extras(p: Pipeline) -> list[Problem]:
    problems = []
    for stage, spec in p.stages.items():
        info = engines().get(spec.backend)
        module = next((m for m in (info.requires if info else ()) if importlib.util.find_spec(m) is None), None)
        if module:
            problems.append(p.source.problem(("stages", stage, "backend"), f"stage '{stage}' runs on {spec.backend} "
                                             f"but {module} is not installed ({info.install})",
                                             severity="warning"))
    return problems


def _check_stores(p: Pipeline) -> list[Problem]:
    """A stage on an engine that cannot reach the pipeline's object store from a cluster (Spark on a
    cluster and az://) is refused here, at its backend: line, not when the run reaches it; on this
    machine such an engine reads and writes the store through local copies."""
    if not p.uses_object_storage:
        return []
    scheme = p.store_uri.split("://", 1)[0]
    reaching = [name for name, info in engines().items() if info.reaches(scheme)]
    problems = []
    for stage, spec in p.stages.items():
        info = engines().get(spec.backend)
        if info is not None and info.way_to(scheme, p.engine_settings(spec.backend)) is None:
            problems.append(p.source.problem(("stages", stage, "backend"), f"stage '{stage}' runs on a "
                                             f"{spec.backend} cluster, which does not reach {scheme}:// paths: "
                                             f"run it on {spec.backend} on this machine, or on "
                                             f"{', '.join(reaching)}"))
    return problems


def _shown(file: Path) -> str:
    try:
        return str(file.relative_to(Path.cwd()))
    except ValueError:
        return str(file)
