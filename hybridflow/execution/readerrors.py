"""A stage failure that is really an input that cannot be decoded, told as a data error.

Engines read lazily: a corrupt page in an input surfaces while the stage's code (or the write of
its output) runs, wrapped in the engine's own exception (a Py4JJavaError holding a Java stack, a
Dask or Ray task error, an OSError from pyarrow). Such a failure is the data's fault, not the code's:
it gets exit 65 and names the dataset, and the file where the engine's message says which.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Mapping, Sequence

from ..data.tables import TableSource, damaged_file
from ..data.textfiles import find_bad_value
from ..errors import DataError, first_line, one_line_of

# What pyarrow (Arrow C++: hybridflow's own reads, Python stages, Dask's and Ray's workers) says when
# the bytes of a Parquet file cannot be decoded; each engine declares its own (Engine.undecodable).
# Deliberately narrow: a user's own error must stay a user error.
_ARROW_UNDECODABLE = (
    r"corrupt snappy", r"corrupt (parquet|page|compressed|footer)", r"Couldn't deserialize thrift",
    r"Unexpected end of stream", r"Parquet magic bytes not found", r"is not a Parquet file", r"Invalid page header",
    r"decompress(ion)? (failed|error)", r"Column chunk .* is corrupt", r"Unexpected end of file")


def _engines_say(field: str, own: tuple[str, ...] = ()) -> re.Pattern | None:
    """One pattern of `own` and every registered engine's `field` patterns; None when there are none."""
    from ..engines import engines

    patterns = [*own, *(pattern for engine in engines().values() for pattern in getattr(engine, field)
                        if _compiles(pattern))]
    return re.compile("|".join(f"(?:{pattern})" for pattern in patterns), re.IGNORECASE) if patterns else None


def _compiles(pattern: str) -> bool:
    """A plugin's pattern that is no regular expression is ignored: it must not hide the stage's error."""
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _decoder_threw(text: str) -> re.Match | None:
    """An exception that an engine's Parquet page decoders threw (its first frame is theirs), whatever it
    says: a dictionary index past the dictionary's end is an ArrayIndexOutOfBoundsException in parquet-mr."""
    frames = _engines_say("decoder_frames")
    if frames is None:
        return None
    return re.search(r"[\w.$]+(?:Exception|Error)(?::[^\n]*)?\n\s+at (?:" + frames.pattern + ")", text)


def input_read_failure(exc: BaseException, inputs: Mapping[str, Sequence[Path]],
                       parquet: Sequence[TableSource] = ()) -> DataError | None:
    """A DataError naming the input (and file) `exc` failed to decode, or None when `exc` is not
    such a failure. `inputs`: each input dataset's files or directory; `parquet`: the Parquet ones,
    read again to find the damaged file when the engine's message does not name it."""
    text = _full_text(exc)
    match = _engines_say("undecodable", _ARROW_UNDECODABLE).search(text)
    thrown = None if match else _decoder_threw(text)
    if not match and not thrown:
        return None
    dataset, file = _which_input(text, inputs)
    if file is None:
        dataset, file = _damaged_input(parquet, dataset) or (dataset, None)
    where = f" ({file})" if file else ""
    reason = _reason_line(text, match) if match else _decoder_failure(thrown)
    name = f"input '{dataset}'" if dataset else f"one of the inputs ({', '.join(inputs)})"
    return DataError(f"{name} cannot be read{where}: {reason}",
                     hint="replace the corrupt file with a good copy, or remove it from the input")


def _full_text(exc: BaseException) -> str:
    parts = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append("".join(traceback.format_exception_only(type(current), current)))
        current = current.__cause__ or current.__context__ or getattr(current, "cause", None)
    return "\n".join(parts)


def _which_input(text: str, inputs: Mapping[str, Sequence[Path]]) -> tuple[str | None, str | None]:
    for dataset, paths in inputs.items():
        for path in paths:
            found = re.search(re.escape(str(path)) + r"[^\s'\",)\]]*", text)
            if found:  # Spark ends "...reading file file:///data/a.parquet." with a full stop
                return dataset, found.group(0).rstrip(".")
    if len(inputs) == 1:
        return next(iter(inputs)), None
    return None, None


def _decoder_failure(thrown: re.Match) -> str:
    """'a page does not decode (ArrayIndexOutOfBoundsException: Index 3 ...)': the innermost of the
    exceptions a line of Spark's nests ("Job aborted ...: java.lang.ArrayIndexOutOfBoundsException: ...")."""
    line = thrown.group(0).split("\n", 1)[0]
    innermost = list(re.finditer(r"([\w.$]+(?:Exception|Error))(?:: |$)", line))[-1]
    kind, what = innermost.group(1).rsplit(".", 1)[-1], one_line_of(line[innermost.end():])
    return f"a page does not decode ({kind}: {what})" if what else f"a page does not decode ({kind})"


def _damaged_input(parquet: Sequence[TableSource], dataset: str | None) -> tuple[str, Path] | None:
    """The input (`dataset`, when known) and its first file whose pages pyarrow cannot decode."""
    for source in parquet:
        found = damaged_file(source) if dataset in (None, source.name) else None
        if found is not None:
            return source.name, found[0]
    return None


def _reason_line(text: str, match: re.Match) -> str:
    """The line of the engine's message that says what is wrong, without its exception prefix."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    line = text[start:end if end != -1 else len(text)].strip().removeprefix(": ")  # Py4J's ": org..."
    for _ in range(3):  # "Caused by: org.apache...Exception: pyarrow...Error: what"
        line = re.sub(r"^([\w.$]+(Exception|Error)|Caused by): ", "", line)
    return first_line(line)


# What pyarrow's CSV and JSON readers say (inside Dask and Ray workers too) when a value does not parse as
# its column's type; each engine declares its own (Engine.unparsable).
_ARROW_UNPARSABLE = (r"CSV (parse|conversion) error", r"JSON (parse|conversion) error", r"In CSV column #",
                     r"Failed of parsing", r"straddling object", r"Failed to read (CSV|JSON) file")


def text_input_failure(exc: BaseException, sources: Sequence[TableSource]) -> DataError | None:
    """A DataError naming the file and value of an external CSV/JSON input that an engine failed to
    parse, or None when `exc` is not such a failure. The engines' own messages rarely name the file:
    the inputs are streamed once more here (only on failure) to find it."""
    text = _full_text(exc)
    match = _engines_say("unparsable", _ARROW_UNPARSABLE).search(text)
    if not match or not sources:
        return None
    for source in sources:
        found = find_bad_value(source.name, list(source.files), source.format, source.schema, source.filesystem)
        if found is not None:
            return found
    names = ", ".join(f"'{s.name}'" for s in sources)
    return DataError(f"input {names} cannot be parsed: {_reason_line(text, match)}",
                     hint="fix the value in the file, or the column's type in the dataset's schema")
