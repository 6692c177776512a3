import pyarrow as pa
import pytest

from hybridflow.data.arrow_types import ALIASES, ArrowTypeError, parse_arrow_type, printed_name, type_name

ROUND_TRIP = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.float32(), pa.float64(), pa.bool_(),
    pa.string(), pa.large_string(), pa.binary(), pa.date32(), pa.timestamp("us"), pa.timestamp("us", "UTC"),
    pa.timestamp("ms", "Europe/Paris"), pa.decimal128(10, 2), pa.decimal256(50, 4), pa.list_(pa.int64()),
    pa.large_list(pa.float32()), pa.struct([("a", pa.int64()), ("b", pa.list_(pa.string()))]),
    pa.map_(pa.string(), pa.int64()), pa.time64("us"), pa.duration("s"),
]


@pytest.mark.parametrize("arrow_type", ROUND_TRIP, ids=str)
def test_every_printed_type_parses_back_to_itself(arrow_type):
    assert parse_arrow_type(type_name(arrow_type)) == arrow_type


@pytest.mark.parametrize("text, expected", [
    ("decimal(10,2)", pa.decimal128(10, 2)),
    ("list<int64>", pa.list_(pa.int64())),
    ("timestamp[us, tz=+01:00]", pa.timestamp("us", "+01:00")),
    ("  int64 ", pa.int64()),
    ("bool", pa.bool_()),
])
def test_user_spellings(text, expected):
    assert parse_arrow_type(text) == expected


@pytest.mark.parametrize("text, message", [
    ("int65", "unknown Arrow type 'int65'"),
    ("timestamp[xs]", "timestamp unit must be one of"),
    ("timestamp[us, tz=Mars/Olympus]", "unknown time zone 'Mars/Olympus'"),
    ("decimal(10)", "expected decimal(precision, scale)"),
    ("decimal(77,2)", "decimal precision must be 1 to 76, not 77"),
    ("decimal(0,0)", "decimal precision must be 1 to 76, not 0"),
    ("struct<a int64>", "expected ':'"),
    ("int64 junk", "unexpected text"),
    ("", "non-empty"),
])
def test_bad_type_names_say_why(text, message):
    with pytest.raises(ArrowTypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_arrow_type(text)


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_name_checked_without_pyarrow_is_one_pyarrow_knows_and_prints_so(alias):
    assert parse_arrow_type(alias) == pa.type_for_alias(alias)
    assert printed_name(f" {alias.upper()} ") == str(pa.type_for_alias(alias))
