"""Everyday pandas (tests/everyday.py) on the frames a stage really works with, on every engine:
the python backend's frame, the Dask frame (computed, and lazily for what Dask computes lazily),
Spark's toPandas() and Ray's to_pandas() (what users of those engines do), and a Ray map_batches.

Each case is named engine-operation. An engine is started the first time a selected test needs it
and kept for the module, so `pytest -k python` starts none of the others."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from hybridflow.data.tables import TableSource, write_arrow
from tests.support import everyday
from tests.support.engines import start_engines
from tests.support.everyday import OPERATIONS, everyday_table

TABLE = everyday_table()
IN_MAP_BATCHES = ("modulo", "str_accessors")  # run by Ray inside map_batches, on each pandas batch
SPARK_NAIVE_TIME = ("comparisons", "merge_asof_on_ts", "dt_on_utc_timestamps")  # compare with UTC-aware times


def _python(frames):
    return frames.engine("python").read(frames.source)


def _dask_lazy(frames):
    return frames.engine("dask").read(frames.source)


def _dask(frames):
    return frames.get("dask-lazy").compute()


def _spark(frames):
    return frames.engine("spark").read(frames.source).toPandas()


def _ray(frames):
    return frames.engine("ray").read(frames.source).to_pandas()


READERS = {"python": _python, "dask": _dask, "dask-lazy": _dask_lazy, "spark": _spark, "ray": _ray}


class Frames:
    """Engines started on first use and the frame each way of reading gives, read once per module."""

    def __init__(self, log_dir, source: TableSource) -> None:
        self.log_dir, self.source = log_dir, source
        self.engines: dict = {}
        self.frames: dict = {}

    def engine(self, name: str):
        if name not in self.engines:
            self.engines.update(start_engines(self.log_dir, names=(name,)))
        return self.engines[name]

    def get(self, way: str):
        if way not in self.frames:
            self.frames[way] = READERS[way](self)
        return self.frames[way]

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    directory = tmp_path_factory.mktemp("everyday")
    write_arrow(TABLE, directory)
    source = TableSource("everyday", tuple(sorted(directory.glob("*.parquet"))), "parquet", TABLE.schema)
    found = Frames(tmp_path_factory.mktemp("engine-logs"), source)
    yield found
    found.stop()


def cases():
    for way in ("python", "dask", "dask-lazy", "spark", "ray"):
        for op in OPERATIONS:
            if way != "dask-lazy" or op.lazy:
                yield pytest.param(way, op, id=f"{way}-{op.name}")


@pytest.mark.parametrize(("way", "op"), list(cases()))
def test_everyday_operation(frames, way, op):
    for library in op.needs:
        pytest.importorskip(library)
    if way == "spark" and op.name in SPARK_NAIVE_TIME:
        pytest.skip("Spark's toPandas() gives session-time naive timestamps: Spark's own rule, not a frame we make")
    frame = frames.get(way)
    lacking = [c for c in op.columns if c not in frame.columns]
    if lacking:
        pytest.skip(f"the {way} frame has no column {', '.join(lacking)}")
    op.run(frame.copy())  # a copy: an operation that adds a column must not change the next one's frame


@pytest.fixture(scope="module")
def ray_ships_everyday():
    """Ray workers get the operations by value: they need not import this tests package."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(everyday)
    yield
    cloudpickle.unregister_pickle_by_value(everyday)


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.name in IN_MAP_BATCHES], ids=lambda op: op.name)
def test_everyday_operation_inside_ray_map_batches(frames, ray_ships_everyday, op):
    run = op.run

    def each(batch: pd.DataFrame) -> pd.DataFrame:
        run(batch.copy())
        return pd.DataFrame({"rows": [len(batch)]})

    dataset = frames.engine("ray").read(frames.source)
    done = dataset.map_batches(each, batch_format="pandas").to_pandas()
    assert done["rows"].sum() == TABLE.num_rows


def _numpy(name: str):
    return lambda dtype: isinstance(dtype, np.dtype) and dtype == np.dtype(name)


def _one_of(*dtypes):
    return lambda dtype: any(dtype == d for d in dtypes if type(dtype) is type(d))


def _arrow(arrow_type: pa.DataType):
    return lambda dtype: isinstance(dtype, pd.ArrowDtype) and dtype.pyarrow_dtype == arrow_type


# column -> (what a pandas user expects, the check); a width (int32, float32) may stay or widen
EXPECTED_DTYPES = {
    "id": ("numpy int64", _numpy("int64")),
    "qty": ("pandas Int32 or Int64 (has nulls)", _one_of(pd.Int32Dtype(), pd.Int64Dtype())),
    "price": ("numpy float64, null as NaN (has nulls, no NaN values)", _numpy("float64")),
    "ratio": ("numpy float32 or float64", _one_of(np.dtype("float32"), np.dtype("float64"))),
    "flag": ("numpy bool", _numpy("bool")),
    "maybe": ("pandas boolean (has nulls)", _one_of(pd.BooleanDtype())),
    "name": ("pandas' string dtype", lambda dtype: isinstance(dtype, pd.StringDtype)),
    "city": ("pandas' string dtype", lambda dtype: isinstance(dtype, pd.StringDtype)),
    "ts": ("datetime64[us, UTC]", _one_of(pd.DatetimeTZDtype("us", "UTC"))),
    "ts_naive": ("numpy datetime64[us]", _numpy("datetime64[us]")),
    "day": ("ArrowDtype date32", _arrow(pa.date32())),
    "amount": ("ArrowDtype decimal128(10, 2)", _arrow(pa.decimal128(10, 2))),
    "label": ("numpy int64", _numpy("int64")),
}


@pytest.mark.parametrize("way", ["python", "dask"])
def test_frames_have_the_dtypes_a_pandas_user_expects(frames, way):
    seen = {way: frames.get(way).dtypes}
    if way == "dask":
        seen["dask meta"] = frames.get("dask-lazy").dtypes  # what the stage's lazy code is typed by
    wrong = [f"{where} {column}: {dtype} (expected {EXPECTED_DTYPES[column][0]})"
             for where, dtypes in seen.items() for column, dtype in dtypes.items()
             if not EXPECTED_DTYPES[column][1](dtype)]
    assert list(seen[way].index) == TABLE.column_names
    assert not wrong, "\n".join(wrong)
