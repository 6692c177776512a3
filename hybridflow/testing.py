"""The backend contract as a pytest base class, for hybridflow's own engines and for a third-party one.

Every engine hands its outputs to the next stage, on any engine, as Parquet in one on-disk contract
(see hybridflow.data.tables). An engine's test module holds the engine to it by subclassing BackendContract:

    from hybridflow.testing import BackendContract

    class TestMyEngineContract(BackendContract):
        engine = "myengine"  # its registered name (the `hybridflow.backends` entry point group)
        settings = MyEngineSettings(threads=2)  # its backends.<name> settings, None for the defaults

The class starts the engine (and the reference engine it is held against: hybridflow's default one
unless told) once, and stops them after its last test. Its tests hold for any engine:

- every type of the contract (ints, floats, bool, strings, binary, date, timestamps naive and in UTC,
  decimal, list and struct, nulls in each) survives a hand-off in every direction: the engine writes
  and the reference engine reads, the reference engine writes and the engine reads, the engine reads
  what it wrote; pyarrow reads each writer's files, and each reader starts from Parquet that pyarrow or
  the other engine wrote;
- column names with dots, spaces, backticks, brackets, unicode and emoji are names, never expressions
  or paths;
- an empty output is a valid dataset with its schema;
- a partitioned output keeps its partition column's type, with one spelling of its directories
  whichever engine wrote it, and odd partition names and values survive;
- what the engine declares it cannot hold (its Engine.unrepresentable, which validate warns with) is
  refused on read naming the column, never corrupted, and nothing of the contract's own tables is.

What is particular to an engine comes from its subclass, never from the contract: `unsupported`
(columns of the contract's table it documents it cannot hold), `refused` (tables it must refuse) and
the hooks every_type() and odd_names(). An `engine_setup` fixture, overridden, makes the engine
available before it starts (a plugin registered for the test). `contract_engines`, `backend` and
`published` are fixtures a subclass's own tests may use.

The tables and helpers (every_type_table, odd_names_table, PARTITIONED, ODD_PARTITIONED, source_of,
hand_off, assert_same) serve tests that hold several engines to each other (tests/engines/test_backends.py).

Only tests import this module (it imports pytest, which hybridflow does not depend on); no other
hybridflow module does, and it imports no engine's library: a backend does, when an engine starts.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow import backends
from hybridflow.backends.engineoutput import process_output_to
from hybridflow.data.contract import schema_differences
from hybridflow.data.tables import HIVE_NULL, TableSource, read_arrow, write_arrow
from hybridflow.errors import DataError
from hybridflow.store.catalog import Catalog, Version

UTC = dt.timezone.utc


def every_type_table() -> pa.Table:
    """One table holding every type of the Parquet contract, with nulls and edge values in each."""
    return pa.table({
        "i8": pa.array([-128, 127, None], pa.int8()),
        "i16": pa.array([-32768, None, 7], pa.int16()),
        "i32": pa.array([None, 2**31 - 1, -5], pa.int32()),
        "i64": pa.array([2**62, None, -(2**62)], pa.int64()),
        "f32": pa.array([1.5, None, -0.25], pa.float32()),
        "f64": pa.array([None, 1e300, -2.5e-300], pa.float64()),
        "flag": pa.array([True, False, None], pa.bool_()),
        "text": pa.array(["héllo wörld", "", None], pa.string()),
        "blob": pa.array([b"\x00\xff", None, b""], pa.binary()),
        "day": pa.array([dt.date(1500, 1, 1), dt.date(2026, 11, 16), None], pa.date32()),
        "ts_naive": pa.array([dt.datetime(1500, 3, 1, 12, 0, 0, 1), None, dt.datetime(2300, 1, 1)],
                             pa.timestamp("us")),
        "ts_utc": pa.array([dt.datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=UTC), None,
                            dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)], pa.timestamp("us", "UTC")),
        "amount": pa.array([Decimal("12345678.91"), None, Decimal("-0.01")], pa.decimal128(10, 2)),
        "tags": pa.array([[1, None, 3], None, []], pa.list_(pa.int64())),
        "info": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": None}],
                         pa.struct([("a", pa.int64()), ("b", pa.string())])),
    })


# Column names an engine could misread as an expression (a.b is field b of column a to Spark) or a
# path (partition directories are named after columns); unicode and emoji as well.
ODD_NAMES = ("col.with.dot", "with space", "back`tick", "ünïcödé", "🎉", "a.b`c d[0] (e)")


def odd_names_table() -> pa.Table:
    """Small: the names are what it tests, one column of another type each."""
    values = [
        pa.array([1, None, 3], pa.int64()),
        pa.array(["x.y", None, "z z"], pa.string()),
        pa.array([1.5, 2.5, None], pa.float64()),
        pa.array([dt.date(2026, 1, 1), None, dt.date(1999, 12, 31)], pa.date32()),
        pa.array([True, None, False], pa.bool_()),
        pa.array([{"in.side": 1}, None, {"in.side": None}], pa.struct([("in.side", pa.int64())])),
    ]
    return pa.table(dict(zip(ODD_NAMES, values)))


# A table partitioned by `week` (a date, one of them null) in the partitioned tests, and the directories
# every engine's writing of it is published as.
PARTITIONED = pa.table({
    "week": pa.array([dt.date(2026, 11, 9), dt.date(2026, 11, 16), dt.date(2026, 11, 16), None], pa.date32()),
    "customer": pa.array([1, 2, 3, 4], pa.int64()),
    "spend": pa.array([Decimal("1.50"), None, Decimal("3.25"), Decimal("0.00")], pa.decimal128(10, 2)),
})
PARTITIONED_DIRECTORIES = ["week=2026-11-09", "week=2026-11-16", f"week={HIVE_NULL}"]

ODD_PARTITION = "kind.of `thing` ü"
ODD_PARTITIONED = pa.table({
    "row.id": pa.array(range(8), pa.int64()),
    # what a directory name would bend: separators, escapes (%41 must not come back as A), unicode
    ODD_PARTITION: pa.array(["a.b", "c d", "e/f", "g=h", "50%", "%41", "ü🎉", None], pa.string()),
})
# one spelling whichever engine wrote it, Spark's: unicode as it is (Spark reads %XX as one character)
ODD_PARTITION_DIRECTORIES = [f"{ODD_PARTITION}={value}" for value in
                             ["%2541", "50%25", HIVE_NULL, "a.b", "c d", "e%2Ff", "g%3Dh", "ü🎉"]]


def source_of(directory: Path, table: pa.Table) -> TableSource:
    """`table` written by pyarrow (hybridflow's own writer) into `directory`, as an input to read."""
    directory.mkdir(parents=True, exist_ok=True)
    write_arrow(table, directory)
    return TableSource("t", tuple(sorted(directory.glob("*.parquet"))), "parquet", table.schema)


def hand_off(engine, source: TableSource, directory: Path) -> pa.Table:
    """Read with the engine, write its native frame back, and return what landed on disk (read by pyarrow)."""
    directory.mkdir()
    engine.write(engine.read(source), directory)
    files = sorted(directory.rglob("*.parquet"))
    assert files, "the engine wrote no parquet file"
    return pq.read_table([str(f) for f in files])


def assert_same(actual: pa.Table, expected: pa.Table) -> None:
    """The same columns of the same contract types (schema_differences), holding the same values."""
    declared = dict(zip(expected.schema.names, expected.schema.types))
    assert schema_differences(declared, actual.schema) == []
    actual = actual.select(expected.schema.names).cast(expected.schema)  # only normalises flavours
    for name in expected.schema.names:
        assert actual.column(name).to_pylist() == expected.column(name).to_pylist(), name


def publish_through(engine, catalog: Catalog, base: Path, name: str, table: pa.Table,
                    partition_by: tuple[str, ...] = ()) -> tuple[list[str], Version]:
    """`table` read and written by `engine` and published as dataset `name` into `catalog`, as a stage's
    output is: (its partition directories, its version)."""
    staging = catalog.new_staging("run1", name, remote=engine.writes_object_storage)
    written = engine.write(engine.read(source_of(base / "src", table)), staging, partition_by)
    version = catalog.publish(name, staging, kind="table", stage="s", run_id="run1", inputs={},
                              partition_by=partition_by, written=written,
                              declared=dict(zip(table.schema.names, table.schema.types)))
    directories = sorted({PurePosixPath(f["path"]).parts[0] for f in version.manifest["files"]
                          if len(PurePosixPath(f["path"]).parts) > 1})
    return directories, version


def start_engine(name: str, settings: Any, log_dir: Path):
    """A started engine (backends.create), the output of the processes it launches in log_dir/engines.log."""
    engine = backends.create(name, settings, log_dir)
    with process_output_to(log_dir / "engines.log"):
        engine.start()
    return engine


class BackendContract:
    """The backend contract for one engine; subclass it in a test module (a `Test...` class name):

    engine: the engine's registered name (required).
    settings: its settings (the model of backends.<engine>), None for its defaults.
    reference, reference_settings: the engine it is held against (hybridflow's default engine, which
        reads and writes with pyarrow in hybridflow's own process) and its settings.
    unsupported: {column of every_type_table(): a regular expression its refusal matches}: what the
        engine documents it cannot hold. Those columns are left out of the hand-offs, and reading each
        must raise DataError matching it (a column refused by name, never corrupted).
    refused: {case: (table, regular expression)}: further tables the engine must refuse on read with
        a DataError matching the expression (a type it has not, names it cannot tell apart).

    Hooks: every_type() and odd_names() (the tables the hand-offs use), and the `engine_setup` fixture
    (class-scoped, runs before the engines start; override it, as a classmethod fixture, to register a
    plugin or set a variable).
    """

    engine: str = ""
    settings: Any = None
    reference: str = backends.DEFAULT
    reference_settings: Any = None
    unsupported: Mapping[str, str] = {}
    refused: Mapping[str, tuple[pa.Table, str]] = {}

    # -- hooks -----------------------------------------------------------------------------------------

    def every_type(self) -> pa.Table:
        """Every type of the contract that the engine holds: every_type_table() less `unsupported`."""
        return every_type_table().drop_columns(list(self.unsupported))

    def odd_names(self) -> pa.Table:
        """The table of odd column names; override to leave out a type the engine cannot hold."""
        return odd_names_table()

    def directions(self) -> list[tuple[str, str]]:
        """The (writer, reader) pairs of the hand-off tests: each way with the reference, and itself."""
        pairs = [(self.engine, self.reference), (self.reference, self.engine), (self.engine, self.engine)]
        return list(dict.fromkeys(pairs))  # the reference engine's own contract: itself once

    def refusals(self) -> dict[str, tuple[pa.Table | None, str]]:
        """The cases of the refusal test: the contract's own tables (none refused), then what is."""
        cases: dict[str, tuple[pa.Table | None, str]] = {"contract-tables": (None, "")}
        cases.update({f"unsupported-{column}": (every_type_table().select([column]), message)
                      for column, message in self.unsupported.items()})
        cases.update(self.refused)
        return cases

    def pytest_generate_tests(self, metafunc) -> None:
        """Parametrises the contract's tests by what the subclass says (pytest calls it per test)."""
        if not self.engine:
            raise TypeError(f"{type(self).__name__} must name the engine it tests: engine = '<name>'")
        if "direction" in metafunc.fixturenames:
            pairs = self.directions()
            metafunc.parametrize("direction", pairs, ids=[f"{writer}-to-{reader}" for writer, reader in pairs])
        if "refusal" in metafunc.fixturenames:
            cases = self.refusals()
            metafunc.parametrize("refusal", list(cases.values()), ids=list(cases))

    # -- fixtures --------------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def engine_setup(cls):
        """What the engine needs before it starts: nothing here; a subclass overrides it (same decorators)."""
        yield

    @pytest.fixture(scope="class")
    @classmethod
    def contract_engines(cls, engine_setup, tmp_path_factory) -> dict[str, Any]:
        """The engine and the reference engine, started once for the class and stopped after it: name -> engine."""
        log_dir = tmp_path_factory.mktemp(f"{cls.engine}-logs")
        started: dict[str, Any] = {}
        try:
            for name, settings in ((cls.engine, cls.settings), (cls.reference, cls.reference_settings)):
                if name not in started:
                    started[name] = start_engine(name, settings, log_dir)
            yield started
        finally:
            for engine in started.values():
                engine.stop()

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, contract_engines):
        """The started engine under test."""
        return contract_engines[cls.engine]

    @pytest.fixture(scope="class")
    @classmethod
    def published(cls, contract_engines, tmp_path_factory):
        """publish(writer, table, partition_by=()): `table` (written by pyarrow) read by the engine named
        `writer`, written as a stage's output into a local workdir and published, once per writer, table
        and partition columns for the class. Returns the partition directories it made, and the version."""
        done: dict[tuple, tuple[list[str], Version]] = {}

        def publish(writer: str, table: pa.Table, partition_by: tuple[str, ...] = ()) -> tuple[list[str], Version]:
            key = writer, tuple(table.schema.names), partition_by
            if key not in done:
                base = tmp_path_factory.mktemp(f"published-{writer}")
                done[key] = publish_through(contract_engines[writer], Catalog(base / "home"), base, "out", table,
                                            partition_by)
            return done[key]
        return publish

    # -- the contract ----------------------------------------------------------------------------------

    def test_every_type_survives_a_hand_off(self, contract_engines, published, tmp_path, direction):
        writer, reader = direction
        expected = self.every_type()
        _, version = published(writer, expected)
        assert_same(pq.read_table([str(f) for f in version.files if f.suffix == ".parquet"]), expected)
        back = hand_off(contract_engines[reader], version.source(), tmp_path / "read")  # the writer's own files
        assert_same(back, expected)

    def test_odd_column_names_survive_a_hand_off(self, contract_engines, published, tmp_path, direction):
        """Dots, spaces, backticks, brackets, unicode and emoji are names, never expressions or paths."""
        writer, reader = direction
        expected = self.odd_names()
        _, version = published(writer, expected)
        assert_same(pq.read_table([str(f) for f in version.files if f.suffix == ".parquet"]), expected)
        back = hand_off(contract_engines[reader], version.source(), tmp_path / "read")
        assert_same(back, expected)

    def test_an_empty_output_is_a_valid_dataset_with_its_schema(self, backend, tmp_path):
        expected = self.every_type()
        catalog = Catalog(tmp_path / "home")
        staging = catalog.new_staging("run1", "empty", remote=backend.writes_object_storage)
        backend.write(backend.read(source_of(tmp_path / "src", expected.slice(0, 0))), staging)
        version = catalog.publish("empty", staging, kind="table", stage="s", run_id="run1", inputs={})
        assert version.rows == 0
        table = read_arrow(version.source())
        assert table.num_rows == 0
        assert schema_differences(dict(zip(expected.schema.names, expected.schema.types)), table.schema) == []

    def test_a_partitioned_output_keeps_its_partition_type(self, contract_engines, published, tmp_path, direction):
        writer, reader = direction
        directories, version = published(writer, PARTITIONED, ("week",))
        assert directories == PARTITIONED_DIRECTORIES
        assert version.rows == 4 and version.manifest["schema"]["week"] == "date32[day]"
        back = hand_off(contract_engines[reader], version.source(), tmp_path / "read")
        assert back.schema.field("week").type == pa.date32()
        assert_same(back.sort_by("customer"), PARTITIONED)

    def test_odd_partition_names_and_values_survive(self, contract_engines, published, tmp_path, direction):
        writer, reader = direction
        directories, version = published(writer, ODD_PARTITIONED, (ODD_PARTITION,))
        assert directories == ODD_PARTITION_DIRECTORIES
        back = hand_off(contract_engines[reader], version.source(), tmp_path / "read")
        assert_same(back.sort_by("row.id"), ODD_PARTITIONED)

    def test_the_engine_refuses_only_what_it_declares_it_cannot_hold(self, backend, tmp_path, refusal):
        """What it refuses is named by its Engine.unrepresentable too (validate warns before a run), and
        reading it raises DataError naming the column; nothing of the contract's own tables is either."""
        declared = backends.engine(self.engine).unrepresentable
        table, message = refusal
        if table is None:
            tables = (self.every_type(), self.odd_names(), PARTITIONED, ODD_PARTITIONED)
            assert [problem for t in tables for problem in (declared(t.schema) if declared else [])] == []
            return
        if declared is not None:
            problems = declared(table.schema)
            assert any(re.search(message, problem) for problem in problems), problems
        with pytest.raises(DataError, match=message):
            backend.read(source_of(tmp_path / "src", table))
