"""The engines hybridflow knows before it starts one: each engine's declaration (an Engine: its name,
its `backends.<name>` settings model, the frames its stages return, what it needs installed, its GPU
support, how it reaches each object store, how its own cluster processes are launched), and the
registry that finds them. hybridflow's own six are declared here, one module each; the Backend that
starts an engine and moves data is in hybridflow.backends, imported only when a run creates one
(Engine.module). Another package adds an engine through the `hybridflow.backends` entry point group,
naming a module that declares its ENGINE (hybridflow.backends re-exports these names for it):

    [project.entry-points."hybridflow.backends"]
    duckdb = "hybridflow_duckdb.engine"

Everything outside asks the registry; nothing else names an engine. Declarations import no engine's
library, so validate, plan and --help load them cheaply; the pipeline file's model is built from them.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..errors import DataError, UnavailableError
from ..installing import install_extras

ENTRY_POINTS = "hybridflow.backends"
BUILT_IN = ("python", "spark", "dask", "ray", "duckdb", "polars")
DEFAULT = "python"  # the engine of a stage that names none
ITSELF, COPIES = "itself", "copies"  # how an engine reaches an object store's paths: Engine.way_to


@dataclass(frozen=True)
class ClusterLaunch:
    """How the engine's own cluster processes are started on hosts (a cluster brought up over SSH, see
    hybridflow.execution.provisioning): the address the driver attaches to, the head's command, and each worker's.
    Every process is started with its output to a log and its environment tagged with the cluster."""

    address: str  # what backends.<engine>.address (or master) is set to
    port: int  # where the head answers once it is up
    head: list[str]
    worker: Callable[[str], list[str]]  # a worker host -> its command
    grace: float = 10.0  # seconds its processes are given to end on SIGTERM before SIGKILL
    # the run's own credentials for the cluster: files written (mode 0600, over ssh's input) into the
    # cluster's private folder on each host before anything starts there, by file name
    files: dict[str, str] = field(default_factory=dict)
    attach: dict[str, Any] = field(default_factory=dict)  # what the driver's settings get to attach with them
    secrets: tuple[str, ...] = ()  # the credentials' values: redacted wherever they could be written
    # what the head's log says once it serves, and a worker's once it is part of the cluster: a start
    # waits for it (one that exits before is started again, while up_timeout lasts); None: no wait
    head_ready: str | None = None
    joined: str | None = None


@dataclass(frozen=True)
class GpuPlugin:
    """A file an engine's GPU stages load into it (Spark: the RAPIDS Accelerator jar), found on this
    machine without starting the engine."""

    label: str  # its row in `hybridflow doctor`: "Spark RAPIDS jar"
    name: str  # what it is, in words: "the RAPIDS Accelerator jar for Spark"
    # (the engine's settings or None, the pipeline's root or None) -> (its path or None, where it looked)
    find: Callable[[Any, Any], tuple[Any, str]]
    hint: str  # how to get it


@dataclass(frozen=True)
class Engine:
    """What hybridflow knows of an engine before it starts one, and without importing it."""

    name: str
    module: str  # the backend module: its create(settings, log_dir) makes a Backend (hybridflow.backends.create)
    frame_types: str  # what its stages return, in words, for messages
    settings: type | None = None  # the model of backends.<name>; None: a free mapping
    description: str = ""
    requires: tuple[str, ...] = ()  # modules that must be importable (found, never imported, to check)
    extra: str | None = None  # the pip extra that installs them: hybridflow[<extra>]
    package: str | None = None  # or the distribution that does (a third-party engine's own)
    starts: bool = True  # False: stages run in hybridflow's own process (python); nothing starts
    # what `hybridflow doctor` checks on this machine beyond the engine's package: (environment, how bad a
    # problem is: "error" or "warning") -> (check, status, detail, fix) rows; without importing the engine
    doctor: Callable[[Any, str], Iterable[tuple[str, str, str, str]]] | None = None
    environment: tuple[str, ...] = ()  # variables the engine reads that an unattended (cron) run must carry
    # GPU: what an embedded engine's GPU stages need importable, and what an attached cluster's client
    # needs; a GPU mode on an engine without GPU support is a config error
    gpu: bool = False
    gpu_packages: tuple[str, ...] = ()
    attached_gpu_packages: tuple[str, ...] = ()
    gpu_plugin: GpuPlugin | None = None  # a file its GPU stages load into it (Spark's RAPIDS jar)
    # the SQL dialect (as sqlglot names it) of the queries it runs for SQL stages (Backend.run_sql);
    # None: it runs no SQL stage
    sql_dialect: str | None = None
    # whether settings name a cluster to attach to (not an engine started here)
    attached: Callable[[Any], bool] = lambda settings: False
    # the distributions that make up the engine (pyspark; dask and distributed): their versions are kept
    # with every fingerprint of its stages, and an upgrade makes those run again (definition/libraries.py)
    distributions: tuple[str, ...] = ()
    # engine settings that change what a stage computes (Spark's conf): part of every fingerprint
    result_settings: Callable[[Any], dict[str, Any]] = lambda settings: {}
    # what of an Arrow schema the engine cannot hold, a phrase per problem (validate warns)
    unrepresentable: Callable[[Any], list[str]] | None = None
    # what the engine's own messages say (regular expressions, matched ignoring case) when an input's
    # bytes do not decode, and when a CSV or JSON value does not parse as its column's type: such a
    # failure is told as the input's (exit 65), not the stage code's (execution/readerrors.py); and the
    # stack frames of its Parquet decoders (matched as written), whose exceptions mean the same whatever
    # they say
    undecodable: tuple[str, ...] = ()
    unparsable: tuple[str, ...] = ()
    decoder_frames: tuple[str, ...] = ()
    # the stage `hybridflow init` writes for it: (module code, where {input} is the dataset it reads;
    # the function, which also names the dataset it writes); None: init does not offer the engine
    example: tuple[str, str] | None = None
    # the object stores (their URI schemes) the engine reaches; None: every one hybridflow knows. On this
    # machine it reaches the others through local copies; on a cluster, not at all (way_to)
    stores: tuple[str, ...] | None = None
    # what the engine needs to read the given store's paths beyond hybridflow's own extras, checked
    # without starting it (doctor): returns where it found it, raises UnavailableError saying how to get it
    object_storage_check: Callable[[Any], str] | None = None
    # fetches, once per machine, what the engine needs to reach object storage (Spark: the store's Hadoop
    # connector), given its settings and the store's: called before a run that needs it starts its engines
    # or its display, so a first download shows its progress on the terminal; raises UnavailableError
    object_storage_fetch: Callable[[Any, Any], Any] | None = None
    # the engine's own cluster processes on hosts, for `cluster: {provider: ssh}`: (python, head, port or
    # None for the engine's own, the cluster's name, its idle timeout in seconds, the cluster's private
    # folder on each host) -> ClusterLaunch, with credentials made afresh; None: the engine has no
    # cluster of its own to start
    cluster_launch: Callable[[str, str, int | None, str, float, str], ClusterLaunch] | None = None

    def reaches(self, scheme: str) -> bool:
        """The engine reads and writes `scheme`:// paths itself."""
        return self.stores is None or scheme in self.stores

    def way_to(self, scheme: str, settings) -> str | None:
        """How the engine, run with `settings`, reads and writes `scheme`:// paths: ITSELF, through
        COPIES on this machine, or None: not at all (on a cluster, attached or brought up for the
        run, its workers cannot read this machine's copies). Decided here alone."""
        if self.reaches(scheme):
            return ITSELF
        if self.attached(settings) or getattr(settings, "cluster", None) is not None:
            return None
        return COPIES

    def refuse_unrepresentable(self, dataset: str, schema) -> None:
        """Refuse, naming the column, what the engine would misread instead of letting it corrupt data."""
        problems = self.unrepresentable(schema) if self.unrepresentable else []
        if problems:
            raise DataError(f"dataset '{dataset}', {problems[0]}",
                            hint="change it in the stage (or the tool) that produces it, or read it on another "
                                 "engine")

    @property
    def install(self) -> str:
        """The command that installs what the engine needs."""
        if self.extra:
            return install_extras(self.extra)
        if self.package:
            return f"pip install {self.package}"
        return f"install the package that provides {self.requires[0]}"


@functools.cache
def engines() -> dict[str, Engine]:
    """Every registered engine by name: the built-in ones, then those of installed packages."""
    from . import dask, duckdb, polars, python, ray, spark

    found = {module.ENGINE.name: module.ENGINE for module in (python, spark, dask, ray, duckdb, polars)}
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINTS):
        try:
            engine = _engine_of(point.load())
        except Exception as exc:  # a broken plugin must not break every pipeline
            import logging

            logging.getLogger("hybridflow").warning("engine plugin %s (%s) cannot load: %s",
                                                    point.name, point.value, exc)
            continue
        found.setdefault(engine.name, engine)  # a plugin never replaces a built-in engine
    return found


def _engine_of(loaded) -> Engine:
    engine = loaded if isinstance(loaded, Engine) else getattr(loaded, "ENGINE", None)
    if not isinstance(engine, Engine):
        raise TypeError("an engine module must define ENGINE = hybridflow.backends.Engine(...)")
    return engine


def register(engine: Engine) -> None:
    """Add an engine at run time (a notebook, a test); the entry point group does this for packages."""
    engines()[engine.name] = engine  # the pipeline file's model follows the registry (definition.model.pipeline_model)


def engine(name: str) -> Engine:
    try:
        return engines()[name]
    except KeyError:
        raise UnavailableError(f"no backend named '{name}' is registered",
                               hint=f"backends: {', '.join(sorted(engines()))}") from None


def missing(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """The engines among `names` whose packages are not installed: name -> (pip extra, module)."""
    found: dict[str, tuple[str, str]] = {}
    for name in dict.fromkeys(names):  # each once, in the order given
        info = engines().get(name)
        for module in info.requires if info else ():
            if importlib.util.find_spec(module) is None:  # finds, never imports
                found[name] = (info.extra, module)
                break
    return found


def require_all(names: Iterable[str]) -> None:
    """Fail before any stage starts if any of `names` cannot run here: one error naming every missing
    engine and the one pip command that installs them all."""
    absent = missing(names)
    if not absent:
        return
    needs = [f"backend '{name}' needs {module}" for name, (_, module) in absent.items()]
    listed = needs[0] if len(needs) == 1 else f"{', '.join(needs[:-1])} and {needs[-1]}"
    extras = ",".join(extra for extra, _ in absent.values() if extra)
    hints = ([install_extras(extras)] if extras else []) + \
        [engines()[name].install for name, (extra, _) in absent.items() if not extra]
    raise UnavailableError(f"{listed}, which {'is' if len(needs) == 1 else 'are'} not installed",
                           hint="; ".join(hints))


def require(name: str) -> None:
    """Fail before any stage starts if `name` cannot run here, saying how to fix it."""
    require_all([name])
