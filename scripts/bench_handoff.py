"""Hand-off benchmark: write and read one table with every engine and with plain pyarrow.

For each engine, "write" is the engine's Parquet write of a frame it already holds in memory, and
"read" is reading the published files back into a materialised native frame. Both go through the
same backend code a pipeline run uses: the read is given the schema the write returned, as a stage
reading a published version is given its manifest's. Each engine writes and reads --rounds times
(default 5) on one started engine, after one untimed round (a JVM's JIT warm-up, which a long run
pays once), pyarrow as often; prints every round, the medians in seconds and MB/s (of the in-memory
Arrow size), and the ratio of each engine's median write + read to pyarrow's.

    python scripts/bench_handoff.py              # 5M rows
    python scripts/bench_handoff.py --rows 500000 --rounds 5
    python scripts/bench_handoff.py --workdir s3://BUCKET/PREFIX   # through object storage

With --workdir s3://..., the store the AWS variables name (AWS_ENDPOINT_URL for an S3-compatible
one): an engine's write is a publish to a workdir there (Spark, Dask and Ray write the version's
prefix themselves, the others a local folder that is uploaded; then checks, manifest and commit),
its read the engine's read of that version from the store; pyarrow's figure is its own write of the
same table to the same store (files of the same size) and its read back.

Each engine is also set against its own floor, the same round trip without hybridflow, where the
engine has one of its own: Spark's df.write.parquet + spark.read.parquet of the same frame (to the
same store with --workdir), python's DataFrame.to_parquet + pandas.read_parquet, their rounds in
turns with the engine's; Dask's and Ray's is pyarrow's. The targets: Spark within 1.15x of its own,
python within 1.1x, Dask and Ray within 1.5x of pyarrow.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow import backends
from hybridflow.backends.engineoutput import process_output_to
from hybridflow.data.storage import object_path
from hybridflow.data.stores.s3 import S3Settings
from hybridflow.data.tables import TableSource, write_arrow
from hybridflow.engines.dask import DaskSettings
from hybridflow.engines.duckdb import DuckDBSettings
from hybridflow.engines.polars import PolarsSettings
from hybridflow.engines.ray import RaySettings
from hybridflow.engines.spark import SparkSettings

SETTINGS = {
    "python": None,
    "spark": SparkSettings(master="local[2]", conf={"spark.driver.memory": "6g", "spark.sql.shuffle.partitions": 4}),
    "dask": DaskSettings(n_workers=1, threads_per_worker=2, processes=False),
    "ray": RaySettings(num_cpus=2),
    "duckdb": DuckDBSettings(threads=2),
    "polars": PolarsSettings(),
}


def make_table(rows: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    start = np.datetime64("2026-01-01T00:00:00", "us").astype("int64")
    ts = start + rng.integers(0, 365 * 86400 * 10**6, rows)
    null = rng.random(rows) < 0.1
    return pa.table({
        "id": pa.array(np.arange(rows, dtype=np.int64)),
        "value": pa.array(rng.normal(size=rows)),
        "name": pa.array([f"customer-{i % 100_000}" for i in range(rows)]),
        "flag": pa.array(rng.random(rows) < 0.5),
        "ts_utc": pa.array(ts, pa.timestamp("us", "UTC")),
        "ts_naive": pa.array(ts, pa.timestamp("us")),
        "day": pa.array((ts // (86400 * 10**6)).astype(np.int32), pa.date32()),
        "amount": pa.array(rng.integers(0, 10**8, rows), pa.int64()).cast(pa.decimal128(22, 2)),
        "maybe_int": pa.array(np.where(null, 0, rng.integers(0, 1000, rows)), mask=null),
        "maybe_text": pa.array(np.where(null, "", "x"), mask=null),
        "plan": pa.array(np.array(["free", "pro", "team"])[rng.integers(0, 3, rows)]),
        "scores": pa.ListArray.from_arrays(np.arange(0, rows * 2 + 1, 2, dtype=np.int32),
                                           pa.array(rng.random(rows * 2), pa.float32())),
    })


def materialise(name: str, frame, keep: bool):
    """Force an engine's lazy frame through: held in memory (`keep`, the frame a stage returns), or
    just read to the end (Spark's `noop` sink, a Dask count), as a stage consuming it would."""
    if name == "spark":
        if keep:
            frame = frame.cache()
        frame.write.format("noop").mode("overwrite").save()
    elif name == "dask":
        frame = frame.persist() if keep else frame
        frame.map_partitions(len).compute()
    elif name == "ray":
        frame = frame.materialize()
    elif name == "duckdb":  # run once, the rows held by DuckDB (execute() before DuckDB 2.0)
        frame = frame.materialize() if hasattr(frame, "materialize") else frame.execute()
    elif name == "polars":  # the LazyFrame collected on the streaming engine, into a DataFrame
        frame = frame.collect(engine="streaming")
    return frame


def timed(fn, *args, **kwargs):
    clock = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - clock, result


def rounds(count: int, scratch: Path, label: str, write, read) -> list[tuple[float, float]]:
    """`count` times: write(directory) into a fresh directory, then read(files, what write returned);
    their seconds."""
    figures = []
    for round_ in range(count):
        out = scratch / f"{label}-{round_}"
        out.mkdir()
        write_s, written = timed(write, out)
        read_s, _ = timed(read, tuple(sorted(out.rglob("*.parquet"))), written)
        figures.append((write_s, read_s))
        shutil.rmtree(out)
    return figures


def rounds_through_store(count: int, scratch: Path, label: str, remote, write, read) -> list[tuple[float, float]]:
    """As rounds(), through object storage: write(catalog) returns what read(it) reads back."""
    from hybridflow.data.stores.s3objects import S3ObjectStore
    from hybridflow.store.objectcatalog import ObjectCatalog
    figures = []
    for round_ in range(count):
        catalog = ObjectCatalog(scratch / f"{label}-{round_}", remote / f"{label}-{round_}",
                                S3ObjectStore(S3Settings.of()))
        write_s, written = timed(write, catalog)
        read_s, _ = timed(read, written)
        figures.append((write_s, read_s))
        catalog.objects.delete_tree(remote / f"{label}-{round_}")
    return figures


def bench(name: str, engine, source: TableSource, scratch: Path, remote,
          count: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]] | None]:
    """The engine's hand-off, and its own floor where it has one (OWN_FLOOR), in turns on the same
    frame: an untimed first turn of each (a JVM's JIT warm-up), then `count` timed ones."""
    held = materialise(name, engine.read(source), keep=True)  # the frame a stage would return

    def read_back(files, schema):  # read as a stage reading a published version is: with its schema
        return materialise(name, engine.read(TableSource("bench", files, "parquet", schema)), keep=False)

    def ours(label: str) -> tuple[float, float]:
        if remote is None:
            return rounds(1, scratch, label, lambda out: engine.write(held, out), read_back)[0]
        return rounds_through_store(1, scratch, label, remote, lambda catalog: published(engine, held, catalog),
                                    lambda version: materialise(name, engine.read(version.source()), keep=False))[0]

    own = OWN_FLOOR[name][0](engine, held, scratch, remote) if name in OWN_FLOOR else None
    figures, floor = [], []
    for round_ in range(count + 1):
        mine = ours(f"{name}-{round_}")
        theirs = own(round_) if own is not None else None
        if round_ > 0:
            figures.append(mine)
            floor.append(theirs)
    return figures, (floor if own is not None else None)


def spark_own(engine, held, scratch: Path, remote):
    """Spark's own `df.write.parquet` (its default committer; s3a:// with a remote) and
    `spark.read.parquet` of the same frame: the floor under Spark's hand-off."""
    from hybridflow.data.stores.s3objects import S3ObjectStore

    def round_trip(round_: int) -> tuple[float, float]:
        uri = f"s3a://{remote}/spark-own-{round_}" if remote is not None else str(scratch / f"spark-own-{round_}")
        write_s, _ = timed(lambda: held.write.parquet(uri))
        read_s, _ = timed(lambda: materialise("spark", engine.session.read.parquet(uri), keep=False))
        if remote is not None:
            S3ObjectStore(S3Settings.of()).delete_tree(remote / f"spark-own-{round_}")
        else:
            shutil.rmtree(uri)
        return write_s, read_s
    return round_trip


def python_own(engine, held, scratch: Path, remote):
    """pandas' own `DataFrame.to_parquet` and `pandas.read_parquet` of the frame a python stage holds:
    the floor under the python engine's hand-off (through the store: pyarrow's S3 filesystem)."""
    fs = S3Settings.of().arrow_filesystem() if remote is not None else None
    read_back = pandas_reader(held, scratch)

    def round_trip(round_: int) -> tuple[float, float]:
        path = f"{remote}/pandas-own-{round_}.parquet" if remote is not None else str(scratch / f"own-{round_}.parquet")
        write_s, _ = timed(lambda: held.to_parquet(path, filesystem=fs))
        read_s, _ = timed(lambda: read_back(path, fs))
        (fs.delete_file(path) if fs is not None else Path(path).unlink())
        return write_s, read_s
    return round_trip


def pandas_reader(frame, scratch: Path):
    """pandas.read_parquet, or where pandas cannot read back what its own to_parquet wrote of `frame`
    (pandas 3.1 fails to parse the dtype name it recorded for a pyarrow-backed list column), the same
    conversion with those names given as the dtypes themselves: read_table, then to_pandas with the
    metadata pandas wrote, its pyarrow-backed entries mapped from the frame's dtypes."""
    import pandas as pd

    probe = scratch / "pandas-probe.parquet"
    frame.head(10).to_parquet(probe)
    try:
        pd.read_parquet(probe)
        return lambda path, fs: pd.read_parquet(path, filesystem=fs)
    except TypeError:
        # by kind of type: a list read back names its item field as Parquet does ("element")
        arrow_backed = {dtype.pyarrow_dtype.id for dtype in frame.dtypes if isinstance(dtype, pd.ArrowDtype)}

        def read(path, fs):
            table = pq.read_table(path, filesystem=fs)
            meta = json.loads(table.schema.metadata[b"pandas"])
            for column in meta["columns"]:
                if str(column.get("numpy_type")).endswith("[pyarrow]"):  # the names it cannot parse
                    column["numpy_type"] = "object"
            table = table.replace_schema_metadata({**table.schema.metadata, b"pandas": json.dumps(meta).encode()})
            return table.to_pandas(types_mapper=lambda kind: pd.ArrowDtype(kind) if kind.id in arrow_backed else None)
        return read
    finally:
        probe.unlink()


# each engine's own round trip without hybridflow, and how close hybridflow's must come to it; the
# others are held against pyarrow's
OWN_FLOOR = {"spark": (spark_own, 1.15), "python": (python_own, 1.1)}
PYARROW_TARGET = 1.5


def published(engine, frame, catalog):
    staging = catalog.new_staging("bench", "handoff", remote=engine.writes_object_storage)
    written = engine.write(frame, staging)
    return catalog.publish("handoff", staging, kind="table", stage="bench", run_id="bench", inputs={},
                           written=written)


def pyarrow_to_store(table: pa.Table, catalog):
    """pyarrow's own write of `table` to the store: files of the size write_arrow makes."""
    from hybridflow.data.tables import rows_per_file
    from hybridflow.settings import TARGET_FILE_SIZE

    fs = catalog.settings.arrow_filesystem()
    rows = rows_per_file(table, TARGET_FILE_SIZE)
    paths = []
    for i, offset in enumerate(range(0, max(table.num_rows, 1), rows)):
        paths.append(f"{catalog.remote}/part-{i:05d}.parquet")
        pq.write_table(table.slice(offset, rows), paths[-1], filesystem=fs, compression="snappy")
    return paths, fs


def medians(figures: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median write, read and write + read (the last a median of its own, over the rounds)."""
    return (statistics.median(w for w, _ in figures), statistics.median(r for _, r in figures),
            statistics.median(w + r for w, r in figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", default="python,spark,dask,ray,duckdb,polars")
    parser.add_argument("--workdir", help="s3://BUCKET/PREFIX: hand off through object storage")
    args = parser.parse_args()
    remote = None
    if args.workdir:
        remote = object_path(args.workdir)
    scratch = Path(tempfile.mkdtemp(prefix="hf-bench-"))
    try:
        table = make_table(args.rows)
        mb = table.nbytes / 1e6
        print(f"{args.rows:,} rows, {table.num_columns} columns, {mb:.0f} MB in memory, {args.rounds} rounds")
        if remote is None:
            results = [("pyarrow", rounds(args.rounds, scratch, "pyarrow", lambda out: write_arrow(table, out),
                                          lambda files, _: pq.read_table([str(f) for f in files])))]
        else:
            results = [("pyarrow", rounds_through_store(
                args.rounds, scratch, "pyarrow", remote, lambda catalog: pyarrow_to_store(table, catalog),
                lambda written: pq.read_table(written[0], filesystem=written[1])))]
        (scratch / "source").mkdir()
        write_arrow(table, scratch / "source")  # what each engine reads into the frame it then writes
        source = TableSource("bench", tuple(sorted((scratch / "source").glob("*.parquet"))), "parquet", table.schema)
        floors: dict[str, list[tuple[float, float]]] = {}
        through: dict[str, list[tuple[float, float]]] = {}
        for name in args.engines.split(","):
            engine = backends.create(name, SETTINGS[name], scratch,
                                     store=S3Settings.of() if remote is not None else None)
            with process_output_to(scratch / "engines.log"):
                start_s, _ = timed(engine.start)
            try:
                figures, floor = bench(name, engine, source, scratch, remote, args.rounds)
                if floor is not None:
                    floors[name] = floor
                    results.append((f"{name}'s own", floor))
            finally:
                engine.stop()
            results.append((f"{name} (start {start_s:.1f}s)", figures))
            through[name] = figures
        for label, figures in results:
            per_round = ", ".join(f"{w:.2f} + {r:.2f}" for w, r in figures)
            print(f"  {label}: write + read per round: {per_round}")
        base = medians(results[0][1])[2]
        print(f"{'engine (medians)':<22} {'write s':>8} {'MB/s':>7} {'read s':>8} {'MB/s':>7} {'total s':>8} "
              f"{'x pyarrow':>9}")
        for label, figures in results:
            write_s, read_s, total = medians(figures)
            print(f"{label:<22} {write_s:8.2f} {mb / write_s:7.0f} {read_s:8.2f} {mb / read_s:7.0f} "
                  f"{total:8.2f} {total / base:9.2f}")
        print(f"\n{'engine':<10} {'against':<16} {'ratio':>6}  target")
        for name, figures in through.items():
            anchor, target = (f"{name}'s own", OWN_FLOOR[name][1]) if name in floors else ("pyarrow", PYARROW_TARGET)
            ratio = medians(figures)[2] / (medians(floors[name])[2] if name in floors else base)
            print(f"{name:<10} {anchor:<16} {ratio:6.2f}  <= {target} {'PASS' if ratio <= target else 'MISS'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
