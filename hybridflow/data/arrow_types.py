"""Arrow type names as users write them in a dataset `schema:`, parsed without guessing.

Accepts pyarrow's own spellings (what `str(pa_type)` prints, so stored schemas
round-trip): `int64`, `string`, `timestamp[us, tz=UTC]`, `decimal(10,2)`,
`decimal128(10, 2)`, `date32`, `list<int64>`, `list<item: int64>`,
`struct<a: int64, b: string>`, `map<string, int64>`.
"""

from __future__ import annotations

import re
import zoneinfo

import pyarrow as pa

from ..diagnostics import did_you_mean

_TIME_UNITS = ("s", "ms", "us", "ns")
COMMON_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                "float64", "double", "bool", "string", "large_string", "binary", "large_binary", "date32",
                "date64", "timestamp", "decimal", "list", "large_list", "struct", "map", "null")
_OFFSET = re.compile(r"^[+-]\d{2}:\d{2}$")


class ArrowTypeError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self) -> pa.DataType:
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

    def type_(self) -> pa.DataType:
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
        try:
            return pa.type_for_alias(name)
        except (ValueError, KeyError):
            raise ArrowTypeError(f"unknown Arrow type '{name}'{did_you_mean(name, COMMON_TYPES)}") from None

    def decimal(self, name: str) -> pa.DataType:
        try:
            self.expect("(")
            precision = int(self.until(","))
            self.expect(",")
            scale = int(self.until(")"))
            self.expect(")")
        except ValueError:
            raise ArrowTypeError(f"expected {name}(precision, scale), e.g. decimal(10,2), in '{self.text}'") from None
        if name == "decimal256" or precision > 38:
            return pa.decimal256(precision, scale)
        return pa.decimal128(precision, scale)

    def timestamp(self) -> pa.DataType:
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
        return pa.timestamp(unit, tz)

    def field_type(self) -> pa.DataType:
        # list<item: int64> and list<int64> both mean a list of int64
        start = self.pos
        self.word()
        if self.peek(":"):
            self.expect(":")
        else:
            self.pos = start
        return self.type_()

    def list_(self, name: str) -> pa.DataType:
        self.expect("<")
        item = self.field_type()
        self.expect(">")
        return pa.large_list(item) if name == "large_list" else pa.list_(item)

    def struct(self) -> pa.DataType:
        self.expect("<")
        fields = []
        while True:
            field_name = self.word()
            self.expect(":")
            fields.append(pa.field(field_name, self.type_()))
            if not self.peek(","):
                break
            self.expect(",")
        self.expect(">")
        return pa.struct(fields)

    def map_(self) -> pa.DataType:
        self.expect("<")
        key = self.type_()
        self.expect(",")
        value = self.type_()
        self.expect(">")
        return pa.map_(key, value)


def _check_timezone(tz: str) -> None:
    if tz.upper() == "UTC" or _OFFSET.match(tz):
        return
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ArrowTypeError(f"unknown time zone '{tz}'{did_you_mean(tz, zoneinfo.available_timezones())} "
                             "(use UTC, an IANA name like Europe/Paris, or an offset like +01:00)") from None


def parse_arrow_type(text: str) -> pa.DataType:
    """Parse an Arrow type name; raises ArrowTypeError with a readable reason."""
    if not isinstance(text, str) or not text.strip():
        raise ArrowTypeError("an Arrow type name must be a non-empty string, e.g. int64 or string")
    return _Parser(text.strip()).parse()


def type_name(arrow_type: pa.DataType) -> str:
    """The canonical spelling of a type: what pyarrow prints, which parse_arrow_type reads back."""
    return str(arrow_type)
