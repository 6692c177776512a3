"""Loading a pipeline file: YAML -> environment values -> spec -> cross checks, every problem located."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..data import localcache
from ..data.storage import ObjectPath, is_object_uri, object_path, scheme_problem, settings_for
from ..diagnostics import Problem, did_you_mean, errors_in
from ..errors import ConfigError, counted
from . import runvalues
from .checks import check_pipeline
from .model import pipeline_model
from .pipeline import Pipeline
from .yamlsource import MAX_FILE_BYTES, SourceMap, load_yaml, scalar_or_text, too_big

_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
CLI = "<command line>"


def load_pipeline(file: str | Path, params: list[str] = (), environ: dict[str, str] | None = None) -> Pipeline:
    """Load and check a pipeline; raises ConfigError carrying every problem found."""
    pipeline, problems = check_file(file, params, environ)
    errors = errors_in(problems)
    if errors:
        more = (f" (and {counted(len(errors) - 1, 'more error')}; hybridflow validate lists them)"
                if len(errors) > 1 else "")
        raise ConfigError(f"{errors[0]}{more}", problems=problems)
    return pipeline


def check_file(file: str | Path, params: list[str] = (),
               environ: dict[str, str] | None = None) -> tuple[Pipeline | None, list[Problem]]:
    """Every problem in one pass; the Pipeline too when there is no error."""
    environ = dict(os.environ) if environ is None else environ
    path = Path(file)
    shown = str(file)
    try:
        text = _read(path)
    except _TooBig as exc:
        return None, [Problem(shown, 1, 1, too_big(exc.size))]
    except FileNotFoundError:
        return None, [Problem(shown, 1, 1, "no such file")]
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        return None, [Problem(shown, 1, 1, f"cannot read the file: {exc}")]
    data, source, problems = load_yaml(text, shown)
    if data is None or problems:
        return None, problems
    if not isinstance(data, dict):
        return None, [source.problem((), "the top level must be a mapping with 'name' and 'stages'")]
    secrets: set[str] = set()
    data = _interpolate(data, (), environ, source, secrets, problems)
    problems += _run_references(data, (), source)
    try:
        spec = pipeline_model().model_validate(data)
    except ValidationError as exc:
        problems += [_locate(error, source) for error in exc.errors()]
        return None, _redacted(problems, secrets)
    root = (path.parent / (spec.root or ".")).resolve()
    workdir, remote, problem = _workdir(spec, root, environ, source)
    if problem is not None:
        return None, _redacted([problem], secrets)
    pipeline = Pipeline(spec, path.resolve(), root, workdir, source, frozenset(secrets), remote=remote)
    problems += _apply_cli_params(pipeline, params)  # before the checks: a --param can satisfy a parameter
    problems += check_pipeline(pipeline)
    return pipeline, _redacted(problems, secrets)


WORKDIR_VARIABLE = "HYBRIDFLOW_WORKDIR"  # what --workdir sets: over the pipeline file's workdir:


def _workdir(spec, root: Path, environ, source: SourceMap) -> tuple[Path | None, ObjectPath | None, Problem | None]:
    """(the local workdir, the workdir in object storage or None, a problem): HYBRIDFLOW_WORKDIR
    (relative to the current directory, as a command line path is) over the file's workdir:
    (relative to root). A workdir in object storage keeps a local cache (logs, staging, the run
    records' copy) under HYBRIDFLOW_CACHE (default ~/.cache/hybridflow)."""
    override = environ.get(WORKDIR_VARIABLE)
    given = override or spec.workdir
    wrong = scheme_problem(given)
    if wrong is not None:
        return None, None, (Problem(CLI, 1, 1, f"{WORKDIR_VARIABLE}: {wrong}") if override
                            else source.problem(("workdir",), f"workdir: {wrong}"))
    if not is_object_uri(given):
        return (Path(override).expanduser().resolve() if override else (root / spec.workdir).resolve()), None, None
    try:
        remote = object_path(given)
    except ValueError as exc:
        problem = (Problem(CLI, 1, 1, f"{WORKDIR_VARIABLE}: {exc}") if override
                   else source.problem(("workdir",), str(exc)))
        return None, None, problem
    section = spec.storage.model_dump(exclude_none=True) if spec.storage else None
    return local_cache(remote, environ, settings_for(remote, section, environ).endpoint), remote, None


def local_cache(remote: ObjectPath, environ, endpoint: str | None = None) -> Path:
    """Where a workdir in object storage keeps what is local to this machine: one folder per workdir,
    and per store (the same bucket and prefix on another endpoint is another workdir)."""
    base = localcache.home(environ)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(remote))[:80]
    digest = hashlib.sha256((remote.uri + (f" at {endpoint}" if endpoint else "")).encode()).hexdigest()[:8]
    return (Path(base).expanduser() / "workdirs" / f"{slug}-{digest}").resolve()


class _TooBig(Exception):
    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


def _read(path: Path) -> str:
    """The file's text, never reading more than the limit (a pipeline path could be /dev/zero)."""
    with path.open("rb") as stream:
        data = stream.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise _TooBig(os.fstat(stream.fileno()).st_size or None)
    return data.decode("utf-8")


def _redacted(problems: list[Problem], secrets: set[str]) -> list[Problem]:
    """Problems never quote a value that came from ${env:...}."""
    redact = Pipeline.redact_with(secrets)
    return sorted(dataclasses.replace(p, message=redact(p.message)) for p in problems)


def _interpolate(value: Any, path: tuple, environ, source: SourceMap, secrets: set, problems: list) -> Any:
    """Replace ${env:NAME} in every string; the values are remembered as secrets."""
    if isinstance(value, dict):
        return {k: _interpolate(v, path + (k,), environ, source, secrets, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, path + (i,), environ, source, secrets, problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${env:" not in value:
        return value

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in environ:
            problems.append(source.problem(path, f"environment variable {name} is not set "
                                                 f"(export {name}=... before running)"))
            return ""
        if environ[name]:
            secrets.add(environ[name])
        return environ[name]

    return _ENV_REF.sub(replace, value)


def _run_references(value: Any, path: tuple, source: SourceMap) -> list[Problem]:
    """${run.NAME} naming no run value, where it is written."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _run_references(v, path + (k,), source)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _run_references(v, path + (i,), source)]
    return [source.problem(path, f"${{run.{name}}} is not a run value{did_you_mean(name, runvalues.NAMES)} "
                                 f"(known: {', '.join(runvalues.NAMES)})")
            for name in runvalues.unknown_references(value)]


def _locate(error: dict, source: SourceMap) -> Problem:
    """A pydantic error as a file:line:col problem in words a user understands."""
    loc = tuple(error["loc"])
    where = _describe(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _fields_at(loc[:-1])
        parent = f" in {_describe(loc[:-1])}" if loc[:-1] else ""
        return source.problem(loc, f"unknown key '{loc[-1]}'{parent}{did_you_mean(loc[-1], known)}", at_key=True)
    if kind == "missing":
        parent = _describe(loc[:-1]) or "the pipeline"
        return source.problem(loc[:-1], f"{parent} is missing the required key '{loc[-1]}'", at_key=True)
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", error["ctx"]["expected"])
        given = error.get("input")
        return source.problem(loc, f"{where} must be one of {', '.join(allowed)}, not {given!r}"
                                   f"{did_you_mean(str(given), allowed)}")
    if kind == "string_pattern_mismatch" and loc == ("name",):
        return source.problem(loc, "the pipeline name may only hold letters, digits, - and _ "
                                   f"(got {error.get('input')!r})")
    if loc == ("stages",) and (kind == "too_short" or error.get("input") is None):
        return source.problem(loc, "a pipeline needs at least one stage under 'stages'", at_key=True)
    if kind in _TYPE_WORDS:
        what = _TYPE_EXAMPLES.get(loc[-1]) if kind == "list_type" else None
        return source.problem(loc, f"{where} must be {what or _TYPE_WORDS[kind]}, not {error.get('input')!r}")
    message = error["msg"].removeprefix("Value error, ")
    return source.problem(loc, f"{where}: {message}")


# pydantic's "Input should be ..." reads as if it were about a stage input: say it plainly
_TYPE_WORDS = {
    "list_type": "a list", "dict_type": "a mapping of key: value", "model_type": "a mapping of key: value",
    "string_type": "a string", "int_type": "a whole number", "int_parsing": "a whole number",
    "int_from_float": "a whole number", "bool_type": "true or false", "bool_parsing": "true or false",
    "float_type": "a number", "float_parsing": "a number",
}
_TYPE_EXAMPLES = {"inputs": "a list of dataset names, e.g. [events]",
                  "outputs": "a list of dataset names, e.g. [clean_events]"}


def _describe(loc: tuple) -> str:
    """('stages', 'clean', 'backend') -> "stages.clean.backend"."""
    return ".".join(str(part) for part in loc)


def _fields_at(loc: tuple) -> list[str]:
    """The keys allowed at a location of the spec, for "did you mean"."""
    model: Any = pipeline_model()
    for part in loc:
        model = _step(model, part)
        if model is None:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _step(annotation: Any, part: Any) -> Any:
    """The type one step into `annotation` (a model field, a dict value or a list item)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = {f.alias or n: f for n, f in annotation.model_fields.items()}
        field = fields.get(part)
        if field is None:
            return None
        return _unwrap_optional(field.annotation)
    origin = typing.get_origin(annotation)
    if origin is dict:
        return _unwrap_optional(typing.get_args(annotation)[1])
    if origin is list:
        return _unwrap_optional(typing.get_args(annotation)[0])
    return None


def _unwrap_optional(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _apply_cli_params(pipeline: Pipeline, params: list[str]) -> list[Problem]:
    """--param key=value (pipeline-wide) and --param stage.key=value; values parsed as YAML scalars."""
    pipeline.param_args = tuple(params)
    problems = []
    for item in params:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem(CLI, 1, 1, f"--param '{item}' must look like key=value or stage.key=value"))
            continue
        # A scalar was asked for: a structure stays text rather than being guessed at.
        value = scalar_or_text(raw) if raw.strip() else ""
        stage, dot, name = key.partition(".")
        if not dot:
            pipeline.overrides[key] = value
        elif stage in pipeline.stages:
            pipeline.stage_overrides.setdefault(stage, {})[name] = value
        else:
            problems.append(Problem(CLI, 1, 1, f"--param {key}: there is no stage '{stage}'"
                                               f"{did_you_mean(stage, pipeline.stages)}"))
    return problems
