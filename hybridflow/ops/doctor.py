"""`hybridflow doctor`: can this machine run a pipeline, unattended too? Checks return findings; the CLI prints.

Each check is a function of a Target yielding Findings, and CHECKS lists them in the order shown:
a new check (a GPU one, say) is one function appended there. Checks read the environment they are
given, never import an engine, and survive an empty one (`env -i`), which is what cron gives; the
one exception attaches to the clusters a pipeline names, to see that they share its workdir.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..definition.pipeline import Pipeline
from ..engines import engines
from ..errors import HybridflowError, UnavailableError
from ..installing import install_extras

LOW_DISK = 2 * 1024**3
DEFAULT_WORKDIR = Path(".hybridflow")  # what the CLI's --workdir defaults to when no pipeline is given


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok | warning | error
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Target:
    """What is checked: a pipeline (or None: every backend, nothing required) in an environment."""

    pipeline: Pipeline | None
    environ: Mapping[str, str]

    @property
    def backends(self) -> set[str]:
        if self.pipeline is None:
            return set(engines())
        return {stage.backend for stage in self.pipeline.stages.values()}

    @property
    def needed(self) -> str:
        """How bad a missing engine is: an error for a pipeline that uses it, else a warning."""
        return "error" if self.pipeline is not None else "warning"

    @property
    def scheduled(self) -> bool:
        return self.pipeline is not None and self.pipeline.spec.schedule is not None

    @property
    def workdir(self) -> Path:
        return self.pipeline.workdir if self.pipeline is not None else DEFAULT_WORKDIR.resolve()

    def which(self, program: str) -> str | None:
        return shutil.which(program, path=self.environ.get("PATH", os.defpath))  # exec's default without PATH


Check = Callable[[Target], Iterable[Finding]]


def check_packages(target: Target, extras: Mapping[str, tuple[str, str]] | None = None) -> Iterable[Finding]:
    """Each engine's package, as the registry declares it; `extras` (engine -> (pip extra, module))
    overrides the declarations."""
    known = engines()
    if extras is None:
        extras = {name: (e.extra, e.requires[0]) for name, e in known.items() if e.requires}
    for backend in sorted(target.backends & extras.keys()):
        extra, module = extras[backend]
        if importlib.util.find_spec(module) is None:  # finds, never imports
            fix = install_extras(extra) if extra else known[backend].install
            yield Finding(f"{backend} engine", target.needed, f"{module} is not installed", fix)
        else:
            yield Finding(f"{backend} engine", "ok", f"{module} {_version(module)}")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def check_engines(target: Target) -> Iterable[Finding]:
    """What each engine the pipeline uses needs on this machine beyond its package (Spark: Java), as
    the engine itself declares it (backends.Engine.doctor)."""
    known = engines()
    for name in sorted(target.backends & known.keys()):
        if known[name].doctor is not None:
            for check, status, detail, fix in known[name].doctor(target.environ, target.needed):
                yield Finding(check, status, detail, fix)


def check_workdir(target: Target) -> Iterable[Finding]:
    workdir = target.workdir
    existing = _nearest_existing(workdir)
    if not existing.is_dir():
        yield Finding("workdir", "error", f"{existing} is not a directory", "remove it, or set workdir: elsewhere")
    elif not os.access(existing, os.W_OK | os.X_OK):
        yield Finding("workdir", "error", f"{existing} is not writable",
                      "fix its permissions, or set workdir: elsewhere")
    elif existing == workdir:
        yield Finding("workdir", "ok", f"{workdir} is writable")
    else:
        yield Finding("workdir", "ok", f"{workdir} will be created in {existing}, which is writable")


def check_disk(target: Target) -> Iterable[Finding]:
    existing = _nearest_existing(target.workdir)
    free = shutil.disk_usage(existing).free
    detail = f"{free / 1024**3:.1f} GiB free in {existing}"
    if free < LOW_DISK:
        yield Finding("disk", "warning", detail, "free some space: runs stage every output before publishing it")
    else:
        yield Finding("disk", "ok", detail)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_cron(target: Target) -> Iterable[Finding]:
    """Only a scheduled pipeline needs cron; otherwise its absence is a warning."""
    needed = "error" if target.scheduled else "warning"
    binary = target.which("crontab")
    if binary is None:
        yield Finding("crontab", needed, "the crontab command is not on PATH", "apt-get install cron")
    else:
        yield Finding("crontab", "ok", binary)
    pid = cron_daemon()
    if pid is None:
        yield Finding("cron daemon", needed, "no cron or crond process is running",
                      "service cron start (in a container: run cron as root)")
    else:
        yield Finding("cron daemon", "ok", f"running (pid {pid})")


def cron_daemon() -> int | None:
    """The process id of a running cron daemon, found through /proc."""
    try:
        processes = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return None
    for process in processes:
        try:
            name, _, rest = (process / "stat").read_text().partition(" (")[2].rpartition(")")
        except OSError:  # it ended while we looked
            continue
        if name in ("cron", "crond") and rest.split()[:1] != ["Z"]:  # a zombie runs nothing
            return int(process.name)
    return None


def check_schedule(target: Target) -> Iterable[Finding]:
    if not target.scheduled:
        return
    from . import schedule

    spec = target.pipeline.spec.schedule
    install = f"hybridflow schedule install {target.pipeline.file}"
    try:
        entry = schedule.installed_for(target.pipeline)
    except UnavailableError as exc:
        yield Finding("schedule", "error", f"cannot read the crontab: {exc.message}", exc.hint or "")
        return
    if entry is None:
        yield Finding("schedule", "error", "the pipeline's schedule is not in the crontab", install)
    elif (entry.cron, entry.timezone) != (spec.cron, spec.timezone):
        yield Finding("schedule", "warning", f"the crontab has '{entry.cron}' ({entry.timezone}), the file "
                                             f"'{spec.cron}' ({spec.timezone})", install)
    else:
        yield Finding("schedule", "ok", f"installed: '{entry.cron}' ({entry.timezone}), log {entry.log}")


def check_cron_environment(target: Target) -> Iterable[Finding]:
    """The ${env:NAME} variables a scheduled pipeline reads that cron will not give its run (which
    then fails to load the pipeline). Names only: their values may be secrets."""
    if not target.scheduled:
        return
    wanted = env_references(target.pipeline)
    if not wanted:
        return
    from . import schedule

    try:
        given, entry = schedule.cron_variables(target.pipeline, dict(target.environ))
    except UnavailableError:
        return  # check_schedule reports the unreadable crontab
    line = "the installed crontab line" if entry else "a crontab line installed from this shell"
    missing = sorted(wanted - given)
    if missing:
        yield Finding("cron environment", "error",
                      f"the pipeline reads {', '.join(missing)} (${{env:...}}), which cron will not set: not on "
                      f"{line}, not in the crontab or /etc/environment; a scheduled run would stop at loading the file",
                      f"crontab -e and add {' and '.join(f'{n}=...' for n in missing)}, one per line, above the "
                      "hybridflow lines (schedule install leaves them in place)")
    else:
        yield Finding("cron environment", "ok",
                      f"cron sets {', '.join(sorted(wanted))}, which the pipeline reads (${{env:...}})")


def check_cron_store(target: Target) -> Iterable[Finding]:
    """A scheduled pipeline on object storage: whether its cron runs would reach the same store, as the
    same profile, as this shell (AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE... on the crontab line,
    in the crontab, in /etc/environment). Two stores would be two workdirs, each with a lease of its own."""
    if not target.scheduled or not target.pipeline.uses_object_storage:
        return
    from ..data.storage import settings_for
    from . import schedule

    try:
        cron = schedule.cron_store_values(target.pipeline, dict(target.environ))
    except UnavailableError:
        return  # check_schedule reports the unreadable crontab
    shell = {name: target.environ[name] for name in schedule.STORE_VARIABLES if target.environ.get(name)}
    storage = target.pipeline.spec.storage
    section = storage.model_dump(exclude_none=True) if storage else None

    def reached(environ: Mapping[str, str]) -> dict[str, str]:
        return settings_for(target.pipeline.store_uri, section, environ).reached(environ)

    here, there = reached(shell), reached(cron)
    differ = [f"{what} {there[what]} (this shell: {here[what]})" for what in here if here[what] != there[what]]
    if differ:
        yield Finding("cron store", "error", f"cron's runs would reach another store than this shell's: "
                                             f"{'; '.join(differ)}",
                      f"hybridflow schedule install {target.pipeline.file} (from a shell set up as the runs "
                      "should be), or fix the crontab's AWS_... variables")
    else:
        yield Finding("cron store", "ok", f"cron's runs reach {here['endpoint']} as this shell does")


def env_references(pipeline: Pipeline) -> set[str]:
    """The names of the ${env:NAME} references in the pipeline file's values."""
    from ..definition.config import _ENV_REF
    from ..definition.yamlsource import load_yaml

    data, _, _ = load_yaml(pipeline.file.read_text(encoding="utf-8"), str(pipeline.file))
    names: set[str] = set()
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack += value.values()
        elif isinstance(value, list):
            stack += value
        elif isinstance(value, str):
            names.update(_ENV_REF.findall(value))
    return names


def check_gpu(target: Target) -> Iterable[Finding]:
    """The GPUs, their memory, the driver, and which RAPIDS pieces are there. Missing pieces are errors
    for a pipeline with `gpu: true`, warnings with `gpu: auto` (or no pipeline), and not reported
    when no stage asks for a GPU."""
    from ..backends import gpu

    modes = set()
    if target.pipeline is not None:
        modes = {gpu.stage_mode(target.pipeline, stage) for stage in target.pipeline.stages}
    missing = "error" if True in modes else "warning" if "auto" in modes or target.pipeline is None else None
    for name, detail in gpu.report(pipeline=target.pipeline):
        absent = detail.startswith(("none usable", "not installed", "not found"))
        if not absent:
            yield Finding(f"gpu: {name}", "ok", detail)
        elif missing:
            yield Finding(f"gpu: {name}", missing, detail, "see the README's GPU (RAPIDS) section")
    if missing is None:
        yield Finding("gpu", "ok", "no stage asks for a GPU")


def check_shared_workdir(target: Target) -> Iterable[Finding]:
    """Each cluster the pipeline attaches to: attached to and asked whether its workers see the workdir
    under the same path (see Backend.check_shared_workdir); a cluster on this host has nothing to share,
    nor does one whose workdir is in object storage."""
    if target.pipeline is None or target.pipeline.remote is not None:
        return
    from .. import engines as registry

    for name in sorted(target.backends):
        engine = engines().get(name)
        settings = target.pipeline.engine_settings(name)
        if engine is not None and engine.attached(settings) and not registry.missing([name]):
            yield _shared_with(name, settings, target)


def _shared_with(name: str, settings, target: Target) -> Finding:
    import tempfile

    from .. import backends
    from ..backends.engineoutput import process_output_to

    check = f"{name} cluster"
    with tempfile.TemporaryDirectory(prefix="hybridflow-doctor-") as scratch:
        backend = backends.create(name, settings, Path(scratch), secrets=target.pipeline.secrets)
        try:
            with process_output_to(Path(scratch) / "engines.log"):  # engine chatter off the table
                try:
                    backend.start()
                    remote = backend.check_shared_workdir(target.workdir)
                finally:
                    backend.stop()
        except HybridflowError as exc:
            return Finding(check, "error", exc.message, exc.hint or "")
    if remote:
        return Finding(check, "ok", f"its workers see the workdir {target.workdir}")
    return Finding(check, "ok", "on this host: the workdir needs no sharing")


def check_object_storage(target: Target) -> Iterable[Finding]:
    """A pipeline with paths in object storage: each bucket answers with this environment's credentials
    (a list of one key), and each engine a stage runs on has what it needs to read them (Spark: the
    store's Hadoop connector)."""
    pipeline = target.pipeline
    if pipeline is None or not pipeline.uses_object_storage:
        return
    from ..data.storage import is_object_uri, object_path

    places = [pipeline.remote] if pipeline.remote is not None else []
    places += [object_path(ds.path) for ds in pipeline.spec.datasets.values() if is_object_uri(ds.path)]
    objects = pipeline.store.objects()
    where = pipeline.store.endpoint or pipeline.store.label
    answering = set()
    for bucket in sorted({place.bucket for place in places}):
        try:
            objects.children(type(places[0])(bucket))
        except HybridflowError as exc:
            yield Finding("object storage", "error", exc.message, exc.hint or "")
        else:
            answering.add(bucket)
            yield Finding("object storage", "ok", f"bucket {bucket} answers at {where}")
    if pipeline.remote is not None and pipeline.remote.bucket in answering:
        yield _conditional_writes(objects, pipeline.remote)
    for name in sorted(target.backends):
        if engines()[name].object_storage_check is not None:
            yield _engine_reaches(name, pipeline.store)


def _engine_reaches(name: str, store) -> Finding:
    """What the engine needs to read the store's paths, found (or how it reaches them without it)."""
    check = f"{name} and {store.scheme}://"
    if not engines()[name].reaches(store.scheme):
        return Finding(check, "ok", "through copies on this machine (no connector of its own)")
    try:
        return Finding(check, "ok", engines()[name].object_storage_check(store))
    except UnavailableError as exc:
        return Finding(check, "error", exc.message, exc.hint or "")


def _conditional_writes(objects, workdir) -> Finding:
    """The store check made again (a run keeps its answer in the workdir and trusts it after)."""
    from ..store import storecheck

    check = "conditional writes"
    try:
        ignored = storecheck.recheck(objects, workdir)
    except HybridflowError as exc:
        return Finding(check, "error", exc.message, exc.hint or "")
    if ignored:
        refused = storecheck.refusal(storecheck.endpoint_of(objects), workdir, ignored)
        return Finding(check, "error", refused.message, refused.hint or "")
    return Finding(check, "ok", f"{storecheck.endpoint_of(objects)} refuses a second create-only write and a "
                                "compare-and-swap with a wrong ETag: the workdir's lease and commits hold")


def check_calendar(target: Target) -> list[Finding]:
    """A scheduled pipeline's ticks: missed since its last scheduled run, or held after a failure."""
    if not target.scheduled:
        return []
    from . import calendar

    return [Finding("calendar", *found) for found in calendar.findings(target.pipeline)]


CHECKS: list[Check] = [check_packages, check_engines, check_workdir, check_disk, check_cron, check_schedule,
                       check_calendar, check_cron_environment, check_cron_store, check_gpu, check_shared_workdir,
                       check_object_storage]


def run_checks(pipeline: Pipeline | None, environ: Mapping[str, str] | None = None,
               checks: list[Check] | None = None) -> list[Finding]:
    target = Target(pipeline, dict(os.environ if environ is None else environ))
    findings: list[Finding] = []
    for check in checks or CHECKS:
        try:
            findings += check(target)
        except Exception as exc:  # one broken check must not hide the others' answers
            findings.append(Finding(check.__name__.removeprefix("check_"), "error",
                                    f"the check itself failed: {type(exc).__name__}: {exc}",
                                    "please report it as a hybridflow bug"))
    return findings
