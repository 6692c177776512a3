"""Ray: stages get ray.data.Datasets, on a local instance or an attached cluster.

The local instance has its dashboard off and binds to 127.0.0.1. Only a local instance is
shut down at the end; from an attached cluster the driver just disconnects. Attached to a head on
another host, the driver's node address is the local address that routes there (or
backends.ray.advertise_address), on a node of this host that joins the cluster for the run (see raynode).

With GPU stages a local instance offers Ray the visible GPUs (or backends.ray.num_gpus). A stage
asks for them in its own tasks and Tune trials with ctx.gpus_per_trial: its `gpus_per_trial`
param (default 1) on the GPU, 0 on the CPU, so the same code runs either way.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..data.footers import read_footers
from ..data.storage import ObjectPath
from ..data.tables import SAMPLE_ROWS, TableSource, parquet_files, respell_partition_directories, rows_per_file
from ..engines.ray import ENGINE
from ..errors import ConfigError, DataError, HybridflowError, UnavailableError, first_line
from ..settings import TARGET_FILE_SIZE
from .base import Backend, measured_or_none
from .clusterchecks import (
    check_reachable,
    driver_address,
    require_same_versions,
    require_shared_workdir,
    split_host_port,
    versions_probe,
)
from .engineerrors import unwrap_error
from .engineoutput import engine_output_stream
from .raytune import CALLBACKS_VARIABLE, TUNING, TrialCounter, with_callback

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa





VERSIONED = ("pyarrow", "pandas", "ray")
IDLE_WORKERS_BEYOND_CPUS = 4  # a local instance's idle workers kept warm beyond one per CPU
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # what a node must run as the driver does


def gpu_init_options(settings, devices) -> dict[str, Any]:
    """ray.init's GPU count for a local instance with GPU stages."""
    return {"num_gpus": settings.num_gpus if settings.num_gpus is not None else len(devices)}


def gpus_per_trial(on_gpu: bool, params) -> float:
    """What a stage's tasks and trials request: its `gpus_per_trial` param on the GPU, else none."""
    if not on_gpu:
        return 0
    value = params.get("gpus_per_trial", 1)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"param gpus_per_trial must be a number above 0, not {value!r}")
    return value


class RayBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types
    writes_object_storage = True  # its workers write a version's prefix themselves

    def __init__(self, settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.ray = None
        self._gpus_per_trial: float = 0
        self._session_dir: str | None = None  # the private directory around Ray's temp directory
        self._unroute = None  # puts back what _route_engine_output changed
        self._driver: str | None = None  # attached to a head on another host: this node's address
        self._node = None  # the raynode.DriverNode started for that, if this host had none
        self._tune_callbacks: str | None = None  # RAY_TUNE_CALLBACKS before start() named ours
        self._set_single_node = False  # start() set SINGLE_NODE in this process's environment
        self._auth_before: dict[str, str | None] | None = None  # AUTH_VARIABLES before start() set them
        self._counting = False  # Ray Data's executions are counted (see _count_executions)
        # A progress poll (its own thread, and it may outlive its stage) and stop() never overlap: Ray
        # ends this whole process when its worker is used after ray.shutdown()
        self._calls = threading.Lock()

    def _init_options(self, code: Sequence[Path]) -> dict[str, Any]:
        """ray.init's arguments: a cluster's address, or a fresh local instance of our own."""
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                   "configure_logging": True, "logging_level": "error"}
        if self.settings.address:
            host, port = split_host_port(self.settings.address, 6379)
            self._driver = driver_address(host, port, self.settings.advertise_address)
            check_reachable("ray", self.settings.address, host, port, source=self._driver)
            options["address"] = self.settings.address
            if self._driver is not None:
                options["_node_ip_address"] = self._driver  # the node of this host the driver uses
                self._join_cluster()
        else:
            # "local" always starts a fresh instance, never joining a stale one from an address file
            cpus = self.settings.num_cpus or os.cpu_count() or 2
            # Ray keeps only as many idle workers as CPUs are free and kills the others after a second;
            # Ray Data's own actors hold a little CPU, so every sort or shuffle (a partitioned write)
            # killed warm workers and started cold ones, seconds each (ray-project/ray#27863)
            options.update(address="local", num_cpus=cpus, _node_ip_address="127.0.0.1",
                           _system_config={"num_workers_soft_limit": cpus + IDLE_WORKERS_BEYOND_CPUS})
            if self.settings.num_gpus is not None:
                options["num_gpus"] = self.settings.num_gpus
            if "_temp_dir" not in self.settings.init:
                # Ray's session directory holds what tasks print (secrets too): inside an owner-only
                # directory (mkdtemp makes it 0700; Ray opens up its own to 0777) instead of the
                # shared /tmp/ray, and removed when the engine stops
                self._session_dir = tempfile.mkdtemp(prefix="hybridflow-ray-")
                options["_temp_dir"] = os.path.join(self._session_dir, "ray")
            if self.gpu is not None:
                options.update(gpu_init_options(self.settings, self.gpu.devices))
        if code:  # workers import the stage modules to run functions defined there
            options["runtime_env"] = {"py_modules": [str(_as_module_dir(p, self.log_dir)) for p in code]}
        options.update(self.settings.init)
        return options

    def start(self, code: Sequence[Path] = ()) -> None:
        if not self.settings.address and SINGLE_NODE not in os.environ:
            # Without this Ray swaps 127.0.0.1 for the machine's "reachable" address. Taken back at
            # stop: the processes this one launches later (a `ray start` of a cluster) must not inherit it.
            os.environ[SINGLE_NODE] = "0"
            self._set_single_node = True
        import ray

        if self.settings.auth_token:  # ray.init and this host's node read it from the environment
            self._auth_before = {name: os.environ.pop(name, None) for name in AUTH_VARIABLES}
            os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.settings.auth_token)
        options = self._init_options(code)
        try:
            ray.init(**options)
        except Exception as exc:
            self.stop()
            raise UnavailableError(f"ray failed to start ({self.settings.address or 'local'}): "
                                   f"{first_line(exc)}") from exc
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        # pandas batches of numpy dtypes, as pandas users expect (ArrowDtype integers have no `%`);
        # stages that need every type exact take batch_format="pyarrow"
        context.enable_arrow_backed_pandas_conversion = False
        for name in ("ray", "ray.data", "ray.tune", "ray.train"):
            logging.getLogger(name).setLevel(logging.ERROR)  # engine chatter belongs in Ray's own log files
        self._unroute = _route_engine_output()
        # set after ray.init: Ray's workers keep the environment they started with, so only Tune runs
        # in this process (a stage's Tuner.fit) make the callback that counts trials for progress()
        self._tune_callbacks = os.environ.get(CALLBACKS_VARIABLE, "")
        os.environ[CALLBACKS_VARIABLE] = with_callback(self._tune_callbacks, f"{__name__}.TrialProgress")
        if not self.settings.address:
            _warm_up(ray, options["num_cpus"])
        self.ray = ray
        self._counting = _count_executions()

    def _join_cluster(self) -> None:
        from . import raynode

        if raynode.runs_here(self._driver):
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._node = raynode.DriverNode(self.settings.address, self._driver, self.log_dir / "ray-driver-node.log")
        self._node.wait_started(self.settings.address)

    def handles(self) -> dict[str, Any]:
        return {"ray": self.ray, "gpus_per_trial": self._gpus_per_trial}

    def check_versions(self) -> None:
        if not self.settings.address or self.ray is None:
            return
        nodes = [n for n in self.ray.nodes() if n["Alive"]]
        found = self._on_nodes(versions_probe(), nodes, *VERSIONED)
        require_same_versions("ray", self.settings.address,
                              {n["NodeManagerAddress"]: v for n, v in zip(nodes, found)}, VERSIONED)

    def check_shared_workdir(self, workdir: Path) -> bool:
        if self._driver is None or self.ray is None:
            return False
        def exists(marker: str) -> bool:  # runs on each node; nested, so it is shipped by value
            import os

            return os.path.exists(marker)

        def seen_by_nodes(path: str) -> list[bool]:
            # every node that runs tasks (this host's own node has no CPUs)
            nodes = [n for n in self.ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
            return self._on_nodes(exists, nodes, path)

        require_shared_workdir("ray", self.settings.address, workdir, seen_by_nodes)
        return True

    def _on_nodes(self, function, nodes: list[dict], *args) -> list:
        """`function(*args)` on each of `nodes` (as ray.nodes() lists them), in a task that takes no CPU."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = self.ray.remote(num_cpus=0)(function)
        return self.ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                             .remote(*args) for n in nodes], timeout=300)

    def begin_stage(self, on_gpu: bool, params, log) -> None:
        super().begin_stage(on_gpu, params, log)
        self._gpus_per_trial = gpus_per_trial(on_gpu, params)
        TUNING.clear()  # a Tune run that an earlier stage left unfinished says nothing now

    def engine_work(self) -> int | None:
        """Ray Data executions this process has started (a Dataset run, materialized or written)."""
        return _EXECUTIONS[0] if self._counting else None

    def progress(self) -> str | None:
        """Tune trials finished out of all, with the best score so far, while a Tune run goes on in
        this stage; else the blocks done out of the estimated total of the running Ray Data
        executions, as Ray Data reports them to its stats actor (every few seconds)."""
        if not self._calls.acquire(blocking=False):  # stopping: no phrase, and no call into Ray
            return None
        try:
            if self.ray is None:
                return None
            return TUNING.phrase() or self._data_progress()
        finally:
            self._calls.release()

    def _data_progress(self) -> str | None:
        from ray.data._internal.stats import STATS_ACTOR_NAME, STATS_ACTOR_NAMESPACE

        try:
            actor = self.ray.get_actor(STATS_ACTOR_NAME, namespace=STATS_ACTOR_NAMESPACE)
        except ValueError:
            return None  # no Dataset has run yet (and none is made here)
        job = self.ray.get_runtime_context().get_job_id()
        datasets = self.ray.get(actor.get_datasets.remote(job), timeout=2).values()
        running = [d for d in datasets if d.get("state") == "RUNNING" and d.get("total")]
        if not running:
            return None
        return f"blocks {sum(d.get('progress', 0) for d in running)}/{sum(d['total'] for d in running)}"

    # data checks (checkplan): one aggregation, each block measured on its worker; distinct keys by a
    # groupby of their own unless the blocks' keys prove them apart (each block's rising, spans apart)

    def check_frame(self, source: TableSource):
        return self.read(source)

    def check_measure(self, frame, plan) -> dict[str, Any]:
        import pickle

        rows = frame.map_batches(_check_partials, batch_format="pyarrow", fn_kwargs={"plan": plan},
                                 zero_copy_batch=True).take_all()
        values = plan.combine([pickle.loads(row["partials"]) for row in rows])
        for m in plan.measures:
            if m.op == "distinct" and values[m.alias] is None:  # blocks whose keys did not prove them apart
                values[m.alias] = frame.select_columns(list(m.columns)).groupby(list(m.columns)).count().count()
        return values

    def check_measure_groups(self, frame, plan) -> dict[tuple, dict[str, Any]]:
        import pickle

        rows = frame.map_batches(_check_partials, batch_format="pyarrow", fn_kwargs={"plan": plan},
                                 zero_copy_batch=True).take_all()
        groups = plan.combine_by([pickle.loads(row["partials"]) for row in rows])
        keys = list(plan.group_by)
        for m in plan.measures:
            if m.op == "distinct" and any(v[m.alias] is None for v in groups.values()):
                # distinct (partition, key) pairs, then counted per partition
                from .checkplan import plain_value

                pairs = frame.select_columns(keys + [c for c in m.columns if c not in keys])
                counted = pairs.groupby(keys + [c for c in m.columns if c not in keys]).count().groupby(keys).count()
                for row in counted.take_all():
                    groups[tuple(plain_value(row[k]) for k in keys)][m.alias] = row["count()"]
        return groups

    def check_split(self, frame, plan, checks) -> tuple[Any, Any]:
        labelled = frame.map_batches(_check_labelled, batch_format="pyarrow",
                                     fn_kwargs={"plan": plan, "checks": checks})
        return (labelled.map_batches(_rows_passing, batch_format="pyarrow"),
                labelled.map_batches(_rows_failing, batch_format="pyarrow"))

    def check_head(self, frame, columns: list[str], n: int) -> list[dict[str, Any]]:
        return frame.select_columns(columns).take(n)

    def check_count(self, frame) -> int:
        return frame.count() if hasattr(frame, "count") and callable(frame.count) else len(frame)

    def is_frame(self, value: Any) -> bool:
        return isinstance(value, self.ray.data.Dataset)

    def read(self, source: TableSource):
        if source.format != "parquet":  # external text: Ray's workers parse it with pyarrow, typed as declared
            return self._read_text(source)
        from .rayfiles import ParquetPieces  # imports Ray Data

        footers = read_footers(source.name, parquet_files(source), source.filesystem)
        # Ray splits a read into at least 200 blocks (DataContext.read_op_min_num_blocks), too small to
        # pay for themselves; two blocks per CPU of the cluster keep every CPU busy downstream, and a
        # larger input has more pieces (docs/benchmarks.md, "Engine settings").
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        return self.ray.data.read_datasource(ParquetPieces(source, footers),
                                             override_num_blocks=max(len(footers.pieces), 2 * cpus))

    def _read_text(self, source: TableSource):
        import pyarrow.csv as pacsv
        import pyarrow.json as pajson

        files = [str(f) for f in source.files]
        types = dict(zip(source.schema.names, source.schema.types))
        if source.format == "csv":
            options = pacsv.ConvertOptions(column_types=types, include_columns=source.schema.names)
            dataset = self.ray.data.read_csv(files, convert_options=options, file_extensions=None,
                                             partitioning=None, filesystem=source.filesystem)
        else:
            options = pajson.ParseOptions(explicit_schema=source.schema, unexpected_field_behavior="ignore")
            dataset = self.ray.data.read_json(files, parse_options=options, file_extensions=None,
                                              partitioning=None, filesystem=source.filesystem)
        return dataset.map_batches(_as_schema, batch_format="pyarrow", fn_kwargs={"schema": source.schema})

    def write(self, frame: Any, directory: Path, partition_by: tuple[str, ...] = (),
              target_file_size: int = TARGET_FILE_SIZE) -> pa.Schema:
        with _stage_failures():
            return super().write(frame, directory, partition_by, target_file_size)

    def write_measured(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - Backend's
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        # the write materializes the stage's Dataset anyway: its blocks are measured where they are, not
        # read back (partitioned outputs are read back: their partition values come from the paths)
        if partition_by:
            return super().write_measured(frame, directory, partition_by, target_file_size, plan)
        with _stage_failures():
            frame = frame.materialize()
        schema = self.write(frame, directory, (), target_file_size)
        return schema, measured_or_none(lambda: self.check_measure(frame, plan))

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        # Sized from the materialized output: its row count, and what a sample of its rows takes in
        # Parquet. Partitioned: rows of one partition value gathered into one block, so one file each.
        import pyarrow as pa

        stage_frame, frame = frame, frame.materialize()  # an empty materialized dataset forgets its schema
        rows = frame.count()
        per_file = rows_per_file(frame.take_batch(SAMPLE_ROWS, batch_format="pyarrow"), target_file_size) if rows else 1
        smallest, largest = max(1, min(per_file, rows)), per_file
        if partition_by and rows:
            frame = _gathered(frame, partition_by, math.ceil(rows / per_file))
        elif rows:
            # Ray gathers blocks until a write has `smallest` rows, then cuts files of `largest`: blocks
            # of uneven sizes left a few-row file after each cut. Blocks of equal sizes, one file each.
            files = math.ceil(rows / per_file)
            frame = frame.repartition(files)
            smallest, largest = max(1, rows // files), math.ceil(rows / files)
        remote = {"filesystem": self.store.arrow_filesystem()} if isinstance(directory, ObjectPath) else {}
        frame.write_parquet(str(directory), **remote, min_rows_per_file=smallest,
                            max_rows_per_file=largest, partition_cols=list(partition_by) or None,
                            coerce_timestamps="us", allow_truncated_timestamps=False)
        respell_partition_directories(directory, partition_by, remote.get("filesystem"))
        schema = frame.schema() or stage_frame.schema()
        return schema.base_schema if schema is not None else pa.schema([])

    def cancel(self) -> None:
        """Stop the stage's Ray work so that a main thread blocked in ray.get returns (it raises
        TaskCancelledError or ActorDiedError): force-cancel every task this driver submitted, and
        kill this job's actors, whose calls cannot be force-cancelled. Called from another thread."""
        ray = self.ray
        if ray is None:
            return
        worker = ray._private.worker.global_worker
        for object_hex in list(worker.core_worker.get_all_reference_counts()):
            text = object_hex.decode() if isinstance(object_hex, bytes) else object_hex
            with contextlib.suppress(Exception):  # a ray.put object, an actor call, a finished task
                ray.cancel(ray.ObjectRef(bytes.fromhex(text)), force=True, recursive=True)
        if self.settings.address:
            return  # an attached cluster's actors run on other hosts: their process ids mean nothing here
        job = ray.get_runtime_context().get_job_id()
        with contextlib.suppress(Exception):
            for actor in ray._private.state.actors().values():
                if actor.get("State") != "DEAD" and actor.get("JobID") == job and actor.get("Pid"):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(actor["Pid"], signal.SIGKILL)

    def stop(self) -> None:
        with self._calls:  # waits for a poll under way (its call into Ray times out in 2 s)
            self._stop()

    def _put_back_auth(self) -> None:
        """The Ray variables as they were before start(): a cluster's token leaves with it."""
        for name, value in (self._auth_before or {}).items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
        self._auth_before = None

    def _stop(self) -> None:
        if self.ray is not None:
            if not self.settings.address:
                _end_autoscaler_monitor(self.ray)
            self.ray.shutdown()
            self.ray = None
        if self._set_single_node:
            os.environ.pop(SINGLE_NODE, None)
            self._set_single_node = False
        self._put_back_auth()
        if self._tune_callbacks is not None:
            if self._tune_callbacks:
                os.environ[CALLBACKS_VARIABLE] = self._tune_callbacks
            else:
                os.environ.pop(CALLBACKS_VARIABLE, None)
            self._tune_callbacks = None
        if self._unroute is not None:
            self._unroute()
            self._unroute = None
        if self._session_dir is not None:
            shutil.rmtree(self._session_dir, ignore_errors=True)
            self._session_dir = None
        if self._node is not None:
            self._node.stop()
            self._node = None


def __getattr__(name: str):
    """TrialProgress, the Tune callback that RAY_TUNE_CALLBACKS names: a class with Tune's Callback
    as a base, so it is made when Tune first asks for it (this module imports Ray only when used)."""
    if name != "TrialProgress":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ray.tune import Callback

    made = globals()[name] = type(name, (TrialCounter, Callback), {"__module__": __name__})
    return made


SINGLE_NODE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray keeps a local instance on 127.0.0.1


def _warm_up(ray, cpus: int) -> None:
    """Run one tiny Ray Data job on a fresh local instance: its worker processes start, set up the
    stages' runtime environment and import Ray Data, and the driver its streaming executor. Part of
    the start, which the runner overlaps with earlier stages; otherwise the first Ray stage paid it
    (1.4 s to read a small table into pandas, against 0.1 s on a warm instance, on 2 cores). A warm-up
    that fails is ignored: the stage then meets the problem and reports it as it would have."""
    with contextlib.suppress(Exception):
        ray.data.range(cpus, override_num_blocks=cpus).map_batches(_same, batch_format="pyarrow").materialize()


def _same(batch):
    return batch


def _end_autoscaler_monitor(ray) -> None:
    """Kill the local instance's autoscaler monitor before ray.shutdown(). Shutdown sends each of its
    processes SIGTERM and waits up to a second for it to exit; the monitor never does, so every
    stop of an embedded Ray took a second longer than it needs (on the run's critical path when the
    engine stops early). The monitor holds no state a local instance needs."""
    with contextlib.suppress(Exception):  # private API: where it is not as expected, shutdown does it all
        node = ray._private.worker._global_node
        for info in node.all_processes.get(ray._private.ray_constants.PROCESS_TYPE_MONITOR, []):
            info.process.kill()
            info.process.wait(5)


def _gathered(frame, partition_by: tuple[str, ...], blocks: int):
    """The rows of each partition value in one block. Ray names a shuffle operator after its keys and
    records that name as a metrics tag, which must be ASCII (a column named in unicode failed the
    write): the shuffle keys on ASCII names for the partition columns, renamed back after it."""
    aliases = {name: f"__hybridflow_partition_{i}__" for i, name in enumerate(partition_by)}
    shuffled = frame.rename_columns(aliases).repartition(blocks, shuffle=True, keys=list(aliases.values()))
    return shuffled.rename_columns({alias: name for name, alias in aliases.items()})


def _as_schema(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    return batch.select(schema.names).cast(schema)


# pyarrow's words for a table holding two columns of one name: Ray meets such a Dataset only when it
# serializes one of its blocks, and fails with a bare KeyError from its own code
_DUPLICATE_FIELD = re.compile(r'Field "(.+?)" exists \d+ times in schema')


@contextlib.contextmanager
def _stage_failures():
    """Where the stage's Dataset is computed (its write), its failures surface: told in our own words."""
    try:
        yield
    except Exception as exc:
        known = _in_own_words(exc)
        if known is None or known is exc:
            raise
        raise known from exc


def _in_own_words(exc: BaseException) -> HybridflowError | None:
    """A failed write told as hybridflow tells it on every engine, or None: a DataError that
    hybridflow's reader raised in a worker (a damaged input file), inside Ray's wrappers; duplicate
    column names in the stage's Dataset."""
    carried = unwrap_error(exc)
    if isinstance(carried, HybridflowError):
        return carried
    names = list(dict.fromkeys(_DUPLICATE_FIELD.findall("".join(traceback.format_exception(exc)))))
    if not names:
        return None
    if len(names) == 1:
        return DataError(f"the frame has a duplicate column name '{names[0]}'")
    return DataError(f"the frame has duplicate column names {', '.join(repr(n) for n in names)}")


def _route_engine_output():
    """Ray's output that this process writes is engine chatter, which belongs in engines.log: it goes
    to a copy of this process's stderr taken now, while the runner points it at engines.log for the
    engine's start. Returns what undoes it."""
    sink = engine_output_stream()
    undo = [_route_raylet_messages(sink), _route_loggers(sink)]

    def undo_all() -> None:
        for step in undo:
            step()
        with contextlib.suppress(OSError):
            sink.close()

    return undo_all


def _route_raylet_messages(sink):
    """Ray's driver prints the raylet's warnings ("N PYTHON worker processes have been started...")
    to sys.stdout from a thread of its own, so they land on the terminal above the run's summary (or
    in whichever stage's log is open): to `sink` instead. Returns what undoes it."""
    from ray._private import worker as ray_worker

    original = getattr(ray_worker, "print_to_stdstream", None)
    print_logs = getattr(ray_worker, "print_worker_logs", None)
    if original is None or print_logs is None:
        return lambda: None  # this Ray has no such printer

    def to_engine_output(data, ignore_prefix: bool) -> None:
        with contextlib.suppress(Exception):  # a printer thread must never die of a closed sink
            print_logs(data, sink, ignore_prefix)

    ray_worker.print_to_stdstream = to_engine_output

    def undo() -> None:
        ray_worker.print_to_stdstream = original

    return undo


def _route_loggers(sink):
    """Ray's loggers ("ray", "ray.data") write to the stderr that was current when Ray configured
    them, the terminal: Ray Data logs a failed task's traceback there at ERROR, three times over,
    before hybridflow's one line. Their console handlers write to `sink` instead, keeping their
    format and filters. Returns what undoes it."""
    moved = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "ray" or name.startswith("ray.")) and isinstance(logger, logging.Logger):
            for handler in filter(_is_console_handler, logger.handlers):
                moved.append((handler, handler.stream))
                handler.setStream(sink)

    def undo() -> None:
        for handler, stream in moved:
            handler.setStream(stream)

    return undo


def _is_console_handler(handler: logging.Handler) -> bool:
    """A handler Ray made to write to a console stream: its PlainRayHandler, or a plain StreamHandler
    (not a file's, nor another library's on these loggers, such as pytest's capture)."""
    ray_made = type(handler) is logging.StreamHandler or type(handler).__module__.split(".")[0] == "ray"
    return ray_made and isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
        and "stream" in vars(handler)  # a stream of its own, not one that follows sys.stderr


def _as_module_dir(path: Path, scratch: Path) -> Path:
    """Ray ships packages (directories); a single-file module becomes a package of the same name."""
    if path.is_dir():
        return path
    package = scratch / "shipped-code" / path.stem
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_bytes(path.read_bytes())
    return package


def create(settings, log_dir: Path) -> RayBackend:
    return RayBackend(settings, log_dir)


_EXECUTIONS = [0]  # Ray Data executions started in this process, once _count_executions is in place


def _count_executions() -> bool:
    """Count Ray Data's executions in this process: each run of a Dataset makes one StreamingExecutor,
    and Ray offers no public count of them. False where Ray's internals have moved (nothing counted)."""
    try:
        from ray.data._internal.execution.streaming_executor import StreamingExecutor
    except ImportError:
        return False
    original = StreamingExecutor.__init__
    if getattr(original, "counted_by_hybridflow", False):
        return True

    @functools.wraps(original)
    def counted(self, *args, **kwargs):
        _EXECUTIONS[0] += 1
        original(self, *args, **kwargs)

    counted.counted_by_hybridflow = True
    StreamingExecutor.__init__ = counted
    return True


def _check_partials(batch, plan):
    """One block's check measures, pickled into a one-row table (distinct keys are counted apart)."""
    import pickle

    import pyarrow as pa

    partials = plan.arrow_partials_by(batch, False) if plan.group_by else plan.arrow_partials(batch, distinct=False)
    return pa.table({"partials": [pickle.dumps(partials)]})


def _check_labelled(batch, plan, checks):
    from ..definition.datachecks import CHECK_COLUMN

    return batch.append_column(CHECK_COLUMN, plan.arrow_label(batch, checks))


def _rows_passing(batch):
    import pyarrow.compute as pc

    from ..definition.datachecks import CHECK_COLUMN

    return batch.filter(pc.is_null(batch[CHECK_COLUMN])).drop_columns([CHECK_COLUMN])


def _rows_failing(batch):
    import pyarrow.compute as pc

    from ..definition.datachecks import CHECK_COLUMN

    return batch.filter(pc.is_valid(batch[CHECK_COLUMN]))
