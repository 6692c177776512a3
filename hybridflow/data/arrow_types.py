"""Arrow type names as users write them in a dataset `schema:`, parsed without guessing.

Accepts pyarrow's own spellings (what `str(pa_type)` prints, so stored schemas
round-trip): `int64`, `string`, `timestamp[us, tz=UTC]`, `decimal(10,2)`,
`decimal128(10, 2)`, `date32`, `list<int64>`, `list<item: int64>`,
`struct<a: int64, b: string>`, `map<string, int64>`.

Parsing needs no pyarrow: `validate` checks a schema's types without importing it. A parse gives a
builder that makes the pyarrow type on demand (parse_arrow_type).
"""

from __future__ import annotations

import re
import zoneinfo
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from ..diagnostics import did_you_mean

if TYPE_CHECKING:
    import pyarrow as pa

_TIME_UNITS = ("s", "ms", "us", "ns")
COMMON_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                "float64", "double", "bool", "string", "large_string", "binary", "large_binary", "date32",
                "date64", "timestamp", "decimal", "list", "large_list", "struct", "map", "null")
_OFFSET = re.compile(r"^[+-]\d{2}:\d{2}$")
# the names pyarrow.type_for_alias knows (its types.pxi _type_aliases), each with what str() of its type
# prints; test_arrow_types holds this to pyarrow's
ALIASES = {name: name for name in (
    "null", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "halffloat",
    "float", "double", "string", "binary", "large_string", "large_binary", "binary_view", "string_view",
    "date32[day]", "date64[ms]", "time32[s]", "time32[ms]", "time64[us]", "time64[ns]", "timestamp[s]",
    "timestamp[ms]", "timestamp[us]", "timestamp[ns]", "duration[s]", "duration[ms]", "duration[us]",
    "duration[ns]", "month_day_nano_interval")}
ALIASES.update({
    "boolean": "bool", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64", "u1": "uint8", "u2": "uint16",
    "u4": "uint32", "u8": "uint64", "f2": "halffloat", "float16": "halffloat", "f4": "float", "float32": "float",
    "f8": "double", "float64": "double", "str": "string", "utf8": "string", "large_str": "large_string",
    "large_utf8": "large_string", "date32": "date32[day]", "date64": "date64[ms]"})
MAX_DECIMAL_PRECISION = 76  # decimal256's; up to 38 digits fit a decimal128

Builder = Callable[[ModuleType], "pa.DataType"]  # given the pyarrow module, makes the parsed type


class ArrowTypeError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self) -> Builder:
        result = self.type_()
        self.skip()
        if self.pos != len(self.text):
            raise self.error("unexpected text")
        return result

    def error(self, what: str) -> ArrowTypeError:
        return ArrowTypeError(f"{what} at position {self.pos + 1} of '{self.text}'")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def peek(self, char: str) -> bool:
        self.skip()
        return self.text.startswith(char, self.pos)

    def expect(self, char: str) -> None:
        if not self.peek(char):
            raise self.error(f"expected '{char}'")
        self.pos += len(char)

    def word(self) -> str:
        self.skip()
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.pos)
        if not match:
            raise self.error("expected a type name")
        self.pos = match.end()
        return match.group()

    def until(self, stops: str) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in stops:
            self.pos += 1
        return self.text[start:self.pos].strip()

    def type_(self) -> Builder:
        name = self.word().lower()
        if name in ("decimal", "decimal128", "decimal256"):
            return self.decimal(name)
        if name in ("list", "large_list"):
            return self.list_(name)
        if name == "struct":
            return self.struct()
        if name == "map":
            return self.map_()
        if name == "timestamp":
            return self.timestamp()
        if self.peek("["):  # e.g. time64[us], duration[s], date32[day]
            self.expect("[")
            name = f"{name}[{self.until(']')}]"
            self.expect("]")
        if name.lower() not in ALIASES:
            raise ArrowTypeError(f"unknown Arrow type '{name}'{did_you_mean(name, COMMON_TYPES)}")
        return lambda pa: pa.type_for_alias(name)

    def decimal(self, name: str) -> Builder:
        try:
            self.expect("(")
            precision = int(self.until(","))
            self.expect(",")
            scale = int(self.until(")"))
            self.expect(")")
        except ValueError:
            raise ArrowTypeError(f"expected {name}(precision, scale), e.g. decimal(10,2), in '{self.text}'") from None
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise ArrowTypeError(f"decimal precision must be 1 to {MAX_DECIMAL_PRECISION}, not {precision}, "
                                 f"in '{self.text}'")
        if name == "decimal256" or precision > 38:
            return lambda pa: pa.decimal256(precision, scale)
        return lambda pa: pa.decimal128(precision, scale)

    def timestamp(self) -> Builder:
        self.expect("[")
        unit = self.until(",]")
        if unit not in _TIME_UNITS:
            raise ArrowTypeError(f"timestamp unit must be one of {', '.join(_TIME_UNITS)}, not '{unit}'")
        tz = None
        if self.peek(","):
            self.expect(",")
            self.skip()
            if not self.text.startswith("tz=", self.pos):
                raise self.error("expected 'tz=' (for example timestamp[us, tz=UTC])")
            self.pos += 3
            tz = self.until("]")
            _check_timezone(tz)
        self.expect("]")
        return lambda pa: pa.timestamp(unit, tz)

    def field_type(self) -> Builder:
        # list<item: int64> and list<int64> both mean a list of int64
        start = self.pos
        self.word()
        if self.peek(":"):
            self.expect(":")
        else:
            self.pos = start
        return self.type_()

    def list_(self, name: str) -> Builder:
        self.expect("<")
        item = self.field_type()
        self.expect(">")
        if name == "large_list":
            return lambda pa: pa.large_list(item(pa))
        return lambda pa: pa.list_(item(pa))

    def struct(self) -> Builder:
        self.expect("<")
        fields = []
        while True:
            field_name = self.word()
            self.expect(":")
            fields.append((field_name, self.type_()))
            if not self.peek(","):
                break
            self.expect(",")
        self.expect(">")
        return lambda pa: pa.struct([pa.field(name, field(pa)) for name, field in fields])

    def map_(self) -> Builder:
        self.expect("<")
        key = self.type_()
        self.expect(",")
        value = self.type_()
        self.expect(">")
        return lambda pa: pa.map_(key(pa), value(pa))


def _check_timezone(tz: str) -> None:
    if tz.upper() == "UTC" or _OFFSET.match(tz):
        return
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ArrowTypeError(f"unknown time zone '{tz}'{did_you_mean(tz, zoneinfo.available_timezones())} "
                             "(use UTC, an IANA name like Europe/Paris, or an offset like +01:00)") from None


def check_arrow_type(text: str) -> Builder:
    """Check an Arrow type name without importing pyarrow; raises ArrowTypeError with a readable
    reason. Returns what makes the type (given the pyarrow module)."""
    if not isinstance(text, str) or not text.strip():
        raise ArrowTypeError("an Arrow type name must be a non-empty string, e.g. int64 or string")
    return _Parser(text.strip()).parse()


def parse_arrow_type(text: str) -> pa.DataType:
    """Parse an Arrow type name; raises ArrowTypeError with a readable reason."""
    import pyarrow

    return check_arrow_type(text)(pyarrow)


def printed_name(text: str) -> str | None:
    """What pyarrow prints for the type a schema: names, found without pyarrow; None for a type with
    parameters (timestamp[us, tz=UTC], decimal(10,2), list<int64>...)."""
    return ALIASES.get(text.strip().lower())


def type_name(arrow_type: pa.DataType) -> str:
    """The canonical spelling of a type: what pyarrow prints, which parse_arrow_type reads back."""
    return str(arrow_type)
