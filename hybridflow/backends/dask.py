"""Dask: stages get dask.dataframe.DataFrames, on a local or attached cluster, of the same dtypes as the
python backend's pandas frames (see pandas_frames), decided from the Parquet footers.

The local cluster binds to 127.0.0.1 with the dashboard off. Data stays on the workers:
the runner never collects a frame into this process. A client attached to a scheduler opens no
listener: it connects out, from the local address that routes to the scheduler (or
backends.dask.advertise_address, which must be one of this host's).

With GPU stages the local cluster is a dask_cuda.LocalCUDACluster, one worker per visible GPU with
the RMM pool of backends.dask.rmm_pool_size (an attached cluster must have GPU workers); a GPU
stage's frames are dask-cudf frames (Dask's "cudf" dataframe backend).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import operator
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Sequence

from ..data.contract import standard_schema
from ..data.footers import Piece, read_footers
from ..data.storage import ObjectPath
from ..data.tables import (
    SAMPLE_ROWS,
    TableSource,
    hive_escape,
    parquet_files,
    partition_values,
    read_piece,
    rows_per_file,
)
from ..engines.dask import ENGINE, DaskTls
from ..errors import DataError, UnavailableError
from .base import Backend, measured_or_none
from .clusterchecks import (
    check_reachable,
    driver_address,
    require_same_versions,
    require_shared_workdir,
    split_host_port,
    versions_probe,
)
from .engineoutput import engine_output_stream
from .framerules import index_as_columns
from .shippedcode import code_archive

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa



VERSIONED = ("pyarrow", "pandas", "dask", "distributed")  # what a worker must run as the driver does
WORKERS_WAIT = 30.0  # seconds the versions check waits for a first worker (one that scales from none: skipped)
NO_DASHBOARD = {"dashboard_address": "127.0.0.1:0", "scheduler_kwargs": {"dashboard": False}}
GRAPH_COUNTER = "hybridflow-graphs"  # the scheduler plugin that counts task graphs


def gpu_cluster_options(settings, devices) -> dict[str, Any]:
    """LocalCUDACluster's arguments: one worker process per visible GPU (dask_cuda itself honours
    CUDA_VISIBLE_DEVICES), each with the RMM pool the settings ask for."""
    return {"n_workers": len(devices), "threads_per_worker": settings.threads_per_worker or 1,
            "memory_limit": settings.memory_limit or "auto", "rmm_pool_size": settings.rmm_pool_size,
            "host": "127.0.0.1", "silence_logs": logging.ERROR, **NO_DASHBOARD}


class DaskBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types
    writes_object_storage = True  # its workers write a version's prefix themselves

    def __init__(self, settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.client = None
        self.cluster = None  # only set when we started it
        self._driver: str | None = None  # attached to a scheduler on another host: the client's address
        self._frame_backend = "pandas"  # Dask's dataframe backend before GPU stages switched it
        self._unroute = None  # puts back what _route_logging changed

    @property
    def address(self) -> str:
        return self.settings.address or "a local cluster"

    def start(self, code: Sequence[Path] = ()) -> None:
        # dask.dataframe (slow to import) and pandas are what every stage reads into:
        # imported as part of the start, which the runner overlaps with earlier stages
        import dask
        import dask.dataframe  # noqa: F401
        from distributed import Client, LocalCluster

        from . import pandas_frames  # noqa: F401

        self._frame_backend = dask.config.get("dataframe.backend", "pandas")
        self._unroute = _route_logging(dask.config.get("distributed.admin.log-format"))
        try:
            if self.settings.address:
                host, port = split_host_port(self.settings.address, 8786)
                self._driver = driver_address(host, port, self.settings.advertise_address)
                check_reachable("dask", self.settings.address, host, port, source=self._driver)
                self.client = Client(self.settings.address, timeout="15s", security=_security(self.settings.tls))
            elif self.gpu is not None:
                from dask_cuda import LocalCUDACluster

                self.cluster = LocalCUDACluster(**gpu_cluster_options(self.settings, self.gpu.devices))
                self.client = Client(self.cluster)
            else:
                processes = True if self.settings.processes is None else self.settings.processes
                # worker processes listen on 127.0.0.1 only; threads in this process listen nowhere
                network = {"host": "127.0.0.1"} if processes else {}
                self.cluster = LocalCluster(
                    n_workers=self.settings.n_workers or 2,
                    threads_per_worker=self.settings.threads_per_worker or 1, processes=processes,
                    memory_limit=self.settings.memory_limit or "auto", silence_logs=logging.ERROR,
                    **NO_DASHBOARD, **network)
                self.client = Client(self.cluster)
            if self.gpu is not None and self.settings.address:
                _require_gpu_workers(self.client, self.settings.address)
            self._ship(code)
            self._count_graphs()
            if self.cluster is not None:
                # fresh worker processes import what every read task needs now, within the start the
                # runner overlaps with earlier stages, not in the first stage's first task
                with contextlib.suppress(Exception):  # a worker that cannot: the stage reports it
                    self.client.run(_import_readers)
        except UnavailableError:
            raise
        except Exception as exc:
            self.stop()
            raise UnavailableError(f"dask failed to start ({self.address}): {exc}") from exc

    def reload_code(self, code: Sequence[Path]) -> bool:
        if self.client is None:
            return False
        tops = [path.stem if path.is_file() else path.name for path in code]

        def forget(names: list[str]) -> None:  # runs on every worker; nested, so it is shipped by value
            import sys

            for module in [m for m in sys.modules.copy() if m.split(".")[0] in names]:  # a copy: tasks import too
                sys.modules.pop(module, None)

        # workers drop the stage modules they imported, then import them from the new archive
        if self._workers_elsewhere():
            self.client.run(forget, tops)
        self._ship(code)
        return True

    def _ship(self, code: Sequence[Path]) -> None:
        """Workers in other processes import the stage modules (to run functions defined there) from
        an archive that the upload puts first on their sys.path (and on the workers of a later restart).

        A scheduler we started runs in this process, where the stage modules are already imported from
        the pipeline root: Client.upload_file would also import the archive here, putting a scratch
        directory first on this process's sys.path and reloading the user's package from it, so that
        once the cluster stopped (and its scratch went) pickling a stage function by reference failed
        for a later engine (Ray). Only a remote scheduler, which unpickles the task graph, gets it."""
        from distributed.diagnostics.plugin import UploadFile

        if not self._workers_elsewhere():
            return  # threads of this process: they see this process's modules
        for path in code:
            archive = str(code_archive(path, self.log_dir))
            if self.cluster is None:
                self.client.upload_file(archive)
            else:
                # named after the package: a reload replaces its plugin, so a restarted worker gets the new code
                self.client.register_plugin(UploadFile(archive), name=f"hybridflow-code-{path.stem}")

    def _workers_elsewhere(self) -> bool:
        """False for a local cluster of threads in this process (processes: false)."""
        return self.cluster is None or self.settings.processes is not False

    def handles(self) -> dict[str, Any]:
        return {"dask": self.client}

    def check_versions(self) -> None:
        if not self.settings.address or self.client is None:
            return
        with contextlib.suppress(TimeoutError):  # a cluster brought up for the run: its workers are joining
            self.client.wait_for_workers(1, timeout=WORKERS_WAIT)
        found = self.client.run(versions_probe(), *VERSIONED)  # on every worker there (none: nothing to check)
        require_same_versions("dask", self.settings.address, found, VERSIONED)

    def check_shared_workdir(self, workdir: Path) -> bool:
        if self._driver is None or self.client is None:
            return False

        def seen_by_workers(path: str) -> list[bool]:
            def exists(marker: str) -> bool:  # runs on every worker; nested, so it is shipped by value
                import os

                return os.path.exists(marker)

            return list(self.client.run(exists, path).values())

        require_shared_workdir("dask", self.settings.address, workdir, seen_by_workers)
        return True

    def begin_stage(self, on_gpu: bool, params, log) -> None:
        super().begin_stage(on_gpu, params, log)
        if self.gpu is not None:  # what dd.read_parquet, dd.from_dict ... build in this stage's code
            import dask

            dask.config.set({"dataframe.backend": "cudf" if on_gpu else self._frame_backend})

    def release_gpu_memory(self) -> None:
        # Dropped frames are freed on the workers; collect what cycles still hold. A worker's RMM pool
        # keeps its size (backends.dask.rmm_pool_size) until the cluster stops.
        if self.client is not None:
            self.client.run(gc.collect)

    # data checks (checkplan): one reduction graph, each partition measured on its worker

    def check_frame(self, source: TableSource):
        return self.read(source)

    def check_measure(self, frame, plan) -> dict[str, Any]:
        import dask

        partials = [dask.delayed(_check_partials)(part, plan) for part in frame.to_delayed()]
        return dask.delayed(plan.combine)(partials).compute()

    def check_measure_groups(self, frame, plan) -> dict[tuple, dict[str, Any]]:
        import dask

        partials = [dask.delayed(_check_partials)(part, plan) for part in frame.to_delayed()]
        return dask.delayed(plan.combine_by)(partials).compute()

    def check_split(self, frame, plan, checks) -> tuple[Any, Any]:
        import pandas as pd

        from ..definition.datachecks import CHECK_COLUMN

        meta = frame._meta.assign(**{CHECK_COLUMN: pd.Series([], dtype="string")})
        labelled = frame.map_partitions(_check_labelled, plan, checks, meta=meta)
        return (labelled[labelled[CHECK_COLUMN].isnull()].drop(columns=[CHECK_COLUMN]),
                labelled[labelled[CHECK_COLUMN].notnull()])

    def check_head(self, frame, columns: list[str], n: int) -> list[dict[str, Any]]:
        return frame[columns].head(n, npartitions=-1).to_dict("records")

    def check_count(self, frame) -> int:
        return len(frame)

    def is_frame(self, value: Any) -> bool:
        import dask.dataframe as dd

        return isinstance(value, dd.DataFrame)

    def read(self, source: TableSource):
        import dask.dataframe as dd

        if self.stage_on_gpu:
            if source.format == "parquet" and not source.partition_by:
                return dd.read_parquet([str(f) for f in source.files], calculate_divisions=False, index=False)
            return self._read_cpu(source).to_backend("cudf")
        return self._read_cpu(source)

    def _read_cpu(self, source: TableSource):
        import dask.dataframe as dd

        from . import pandas_frames  # pandas: imported when a stage reads, not when a run creates the engine

        if source.format != "parquet":  # external text: each worker parses whole files with pyarrow
            kinds = pandas_frames.schema_kinds(source.schema, source.schema.names)  # nulls unknown: nullable
            return dd.from_map(_read_text_pandas, list(source.files), fmt=source.format, schema=source.schema,
                               store=source.store,
                               kinds=kinds, meta=pandas_frames.to_pandas(source.schema.empty_table(), kinds),
                               label=f"read-{source.format}")
        footers = read_footers(source.name, parquet_files(source), source.filesystem)
        schema = source.schema or footers.schema
        nullable = set(footers.nullable)
        if source.partition_by:  # partition values come from the paths: a null is __HIVE_DEFAULT_PARTITION__
            base = source.base or source.files[0]
            nullable |= {column for column in source.partition_by
                         if any(partition_values(p.file, base, source.partition_by).get(column) is None
                                for p in footers.pieces)}
        kinds = pandas_frames.schema_kinds(schema, nullable)
        return dd.from_map(_read_piece, list(footers.pieces), source=source, schema=schema, kinds=kinds,
                           meta=pandas_frames.to_pandas(schema.empty_table(), kinds), label="read-parquet")

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        return self._write_files(frame, directory, partition_by, target_file_size)[0]

    def write_measured(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - Backend's
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        # the write keeps the stage's partitions on the workers to size its files: they are measured there,
        # in the graph that computes them, not read back (partitioned outputs are: their partition values
        # come from the paths)
        if partition_by or _is_cudf_meta(frame._meta):
            return super().write_measured(frame, directory, partition_by, target_file_size, plan)
        schema, measured = self._write_files(frame, directory, (), target_file_size, plan)
        self.write_schema_file(directory, schema, ())
        return schema, measured

    def _write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - write_measured's
                     target_file_size: int, plan=None) -> tuple[pa.Schema, dict[str, Any] | None]:
        import pyarrow as pa

        frame = index_as_columns(frame)
        remote = {"filesystem": self.store.fsspec_filesystem()} if isinstance(directory, ObjectPath) else {}
        if _is_cudf_meta(frame._meta):  # cuDF writes its own Parquet, keeping its column types
            frame.to_parquet(str(directory), **remote, write_index=False, partition_on=list(partition_by) or None,
                             write_metadata_file=False)
            return frame._meta.to_arrow(preserve_index=False).schema, None
        try:
            schema = standard_schema(pa.Schema.from_pandas(frame._meta, preserve_index=False).remove_metadata())
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise DataError(f"cannot derive an Arrow schema from the frame: {exc}") from exc
        frame, measured = self._sized(frame, schema, partition_by, target_file_size, plan)
        frame = _hive_escaped(frame, schema, partition_by)
        frame.to_parquet(str(directory), **remote, write_index=False, engine="pyarrow", schema=schema,
                         partition_on=list(partition_by) or None, write_metadata_file=False,
                         coerce_timestamps="us", allow_truncated_timestamps=False)
        return schema, measured

    def _sized(self, frame, schema: pa.Schema, partition_by: tuple[str, ...], target_file_size: int,  # noqa: PLR0913
               plan=None):
        """(the output in as many partitions as files of the target size need, the measures of `plan`
        over it or None). Dask writes a file per partition, and per partition value; partitioned outputs
        are shuffled so that each value lives in one partition. One graph computes each partition once,
        keeps it on the workers, and counts, samples (and measures) it there: the counts are fetched
        with the measures, and only the first partitions' samples (the write is the only other graph).
        Counting and sampling the frame itself in that graph would compute every partition twice: Dask
        optimizes each branch into tasks of its own."""
        import dask
        import dask.dataframe as dd
        import pandas as pd
        from distributed import futures_of

        from . import pandas_frames

        parts = frame.to_delayed()
        measures = [] if plan is None else [dask.delayed(_combined)(
            [dask.delayed(_written_partials)(part, plan, schema) for part in parts], plan)]
        kept = self.client.persist([*parts, *map(dask.delayed(len), parts),
                                    *map(dask.delayed(operator.methodcaller("head", SAMPLE_ROWS)), parts), *measures])
        futures = [futures_of(each)[0] for each in kept]
        count = len(parts)
        fetched = self.client.gather(futures[count:2 * count] + futures[3 * count:])  # the lengths, the measures
        lengths, measured = fetched[:count], (fetched[count] if plan is not None else None)
        needed, sampled = [], 0  # the first non-empty partitions' heads that make up the sample
        for length, head in zip(lengths, futures[2 * count:]):
            if sampled >= SAMPLE_ROWS:
                break
            if length:
                needed.append(head)
                sampled += length
        rows, heads = int(sum(lengths)), self.client.gather(needed)  # one round trip
        sample = pd.concat(heads) if heads else None
        table = pandas_frames.to_arrow(sample).cast(schema) if sample is not None else schema.empty_table()
        files = max(1, math.ceil(rows / rows_per_file(table, target_file_size))) if rows else 1
        frame = dd.from_delayed(kept[:count], meta=frame._meta, divisions=frame.divisions, verify_meta=False)
        if partition_by:
            return frame.shuffle(on=list(partition_by), npartitions=files), measured
        return (frame if files == frame.npartitions else frame.repartition(npartitions=files)), measured

    def _count_graphs(self) -> None:
        """Give the scheduler a plugin that counts the task graphs it is given (one per compute, persist
        or write, from any client). Shipped by value, so a remote scheduler needs no hybridflow."""
        def install(dask_scheduler) -> None:
            from distributed.diagnostics.plugin import SchedulerPlugin

            class GraphCounter(SchedulerPlugin):
                def __init__(self) -> None:
                    self.graphs = 0

                def update_graph(self, scheduler, **kwargs) -> None:
                    self.graphs += 1

            if GRAPH_COUNTER not in dask_scheduler.plugins:
                dask_scheduler.add_plugin(GraphCounter(), name=GRAPH_COUNTER)

        with contextlib.suppress(Exception):  # without it, only the count is missing
            self.client.run_on_scheduler(install)

    def engine_work(self) -> int | None:
        """Task graphs the scheduler has been given so far, as _count_graphs counts them."""
        if self.client is None:
            return None

        def graphs(dask_scheduler) -> int | None:
            counter = dask_scheduler.plugins.get(GRAPH_COUNTER)
            return None if counter is None else counter.graphs

        with contextlib.suppress(Exception):
            return self.client.run_on_scheduler(graphs)
        return None

    def progress(self) -> str | None:
        """Tasks done out of all the tasks of the scheduler's current computation (what one compute or
        persist, or several submitted while it ran, asked for): one small call to the scheduler."""
        if self.client is None:
            return None

        def counts(dask_scheduler) -> tuple[int, int] | None:  # runs on the scheduler: shipped by value
            """(done, total) of the newest computation while it runs; a task is done once it computed
            (even if released since) or erred."""
            if not dask_scheduler.computations:
                return None
            states: dict[str, int] = {}
            for group in dask_scheduler.computations[-1].groups:
                for state, count in group.states.items():
                    states[state] = states.get(state, 0) + count
            total = sum(states.values())
            done = sum(states.get(state, 0) for state in ("memory", "erred", "released", "forgotten"))
            return None if total == 0 or done == total else (done, total)

        found = self.client.run_on_scheduler(counts)
        return None if found is None else "tasks {}/{}".format(*found)

    def cancel(self) -> None:
        if self.client is not None:
            from distributed import Future

            keys = list(self.client.futures)  # what this client is computing or holding for the stage
            self.client.cancel([Future(key, self.client) for key in keys], force=True)

    def abandon(self) -> None:
        if self.cluster is not None:  # a LocalCluster's nannies live in this process: no restarts
            for nanny in list(self.cluster.workers.values()):
                nanny.close_gracefully(reason="hybridflow ends the run")

    def stop(self) -> None:
        if self.gpu is not None:
            import dask

            dask.config.set({"dataframe.backend": self._frame_backend})  # this process may run more pipelines
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        if self._unroute is not None:  # after the close, whose chatter goes to engines.log too
            self._unroute()
            self._unroute = None


def _route_logging(log_format: str):
    """The "distributed" loggers of this process (a local cluster's scheduler runs here, and the
    client) write to engines.log, no further: left alone they reach the root logger, whose handler
    writes to the terminal (the shuffle plugin's "Shuffle ... initialized by task ..." at every p2p
    shuffle, over the run's display). The stream is a copy of this process's stderr taken now, during
    the start, while it points at engines.log. Returns what undoes it."""
    logger = logging.getLogger("distributed")
    sink = engine_output_stream()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter(log_format))
    # distributed's own console handler, if it made one (bound to the stderr of its import); others
    # that a caller put there (pytest's capture) stay
    saved, propagated = [h for h in logger.handlers if type(h) is logging.StreamHandler], logger.propagate
    for old in saved:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.propagate = False

    def undo() -> None:
        logger.removeHandler(handler)
        for old in saved:
            logger.addHandler(old)
        logger.propagate = propagated
        sink.close()

    return undo


def _import_readers() -> None:
    """Runs on each worker at start: the modules every read task imports."""
    import dask.dataframe  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from . import pandas_frames  # noqa: F401


def _hive_escaped(frame, schema: pa.Schema, partition_by: tuple[str, ...]):
    """String partition values spelled as directory names (tables.hive_escape): Dask names a directory
    name=value as it is, so a '/' in a value nested a directory and a '%' was read back as an escape.
    Values of other types print without such characters."""
    import pyarrow as pa

    strings = [name for name in partition_by if pa.types.is_string(schema.field(name).type)]
    return frame.map_partitions(_escape_columns, strings, meta=frame._meta) if strings else frame


def _escape_columns(frame, names: list[str]):
    frame = frame.copy(deep=False)
    for name in names:
        frame[name] = frame[name].map(hive_escape, na_action="ignore")  # keeps the dtype, categories too
    return frame


def _is_cudf_meta(meta) -> bool:
    return type(meta).__module__.split(".")[0] == "cudf"


def _security(tls: DaskTls | None):
    """The client's Security: TLS and nothing unencrypted with credentials, else Dask's defaults."""
    if tls is None:
        return None
    from distributed.security import Security

    return Security(tls_ca_file=tls.ca, tls_client_cert=tls.cert, tls_client_key=tls.key, require_encryption=True)


def _require_gpu_workers(client, address: str) -> None:
    """An attached cluster for GPU stages: every worker must see a GPU and import dask_cudf."""
    def has_gpu():  # runs on the workers (defined here so it is shipped by value)
        import importlib.util
        import shutil
        import subprocess

        smi = shutil.which("nvidia-smi")
        listed = smi and subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout.strip()
        return bool(listed) and importlib.util.find_spec("dask_cudf") is not None

    answers = client.run(has_gpu)
    lacking = sorted(worker for worker, ok in answers.items() if not ok)
    if not answers or lacking:
        raise UnavailableError(f"the dask cluster at {address} has workers without a GPU or dask_cudf: "
                               f"{', '.join(lacking) or 'no workers'}",
                               hint="start them with dask cuda worker, or set gpu: false on its stages")


def _read_piece(piece: Piece, source: TableSource, schema: pa.Schema, kinds: list[str], columns=None):
    """Some row groups of one file as a pandas frame of the dtypes every partition shares. Dask
    passes `columns` when the stage uses only some (column projection)."""
    from . import pandas_frames

    if columns is not None:
        kinds = [kinds[schema.get_field_index(c)] for c in columns]
    return pandas_frames.to_pandas(read_piece(piece, source, schema, columns), kinds)


def _read_text_pandas(file: PurePath, fmt: str, schema: pa.Schema, kinds: list[str], store=None, columns=None):
    from ..data.textfiles import read_text_file
    from . import pandas_frames

    table = read_text_file(file, fmt, schema, filesystem=store.arrow_filesystem() if store else None)
    if columns is not None:
        chosen = [schema.get_field_index(c) for c in columns]
        table, kinds = table.select(list(columns)), [kinds[i] for i in chosen]
    return pandas_frames.to_pandas(table, kinds)


def create(settings, log_dir: Path) -> DaskBackend:
    return DaskBackend(settings, log_dir)


def _check_partials(part, plan) -> dict:
    """One partition's check measures (per partition of the output with a plan's group_by), on its worker."""
    from . import pandas_frames

    table = pandas_frames.to_arrow(part)
    return plan.arrow_partials_by(table) if plan.group_by else plan.arrow_partials(table)


def _written_partials(part, plan, schema) -> dict | None:
    """One partition's check measures as it is written (in the write's schema), on its worker; None
    where they fail (the checks then measure the files, and say why)."""
    from . import pandas_frames

    return measured_or_none(lambda: plan.arrow_partials(pandas_frames.to_arrow(part).select(schema.names).cast(schema)))


def _combined(partials: list[dict | None], plan) -> dict | None:
    """The whole output's measures from its partitions', on a worker (None: some could not be taken)."""
    return None if any(p is None for p in partials) else plan.combine(partials)


def _check_labelled(part, plan, checks):
    """One partition with the name of the first check each row fails (missing: it passes them all)."""
    import pandas as pd

    from ..definition.datachecks import CHECK_COLUMN
    from . import pandas_frames

    label = plan.arrow_label(pandas_frames.to_arrow(part), checks).to_pandas()
    return part.assign(**{CHECK_COLUMN: pd.Series(label.to_numpy(), index=part.index, dtype="string")})
