"""Where a stage's error really happened: the user's own exception and the line of the user's own
file, dug out of engine wrappers (Py4J, a Spark Python worker, a Ray task) and past library frames."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from ..backends.engineerrors import ENGINE_PACKAGES, ENGINE_WRAPPERS, is_engine_error, unwrap_error
from ..errors import one_line_of


def describe_user_error(exc: BaseException, root: Path) -> str:
    """'ValueError: bad row 3 (stages/etl.py:12 in parse)': type, first line of the message (quoted
    data cut short, as in every error line), place."""
    own = unwrap_error(exc)
    where = _user_frame(own, root) or _user_frame(exc, root)
    kind, text = _remote_exception(own, str(exc)) or (type(own).__name__, str(own))
    if isinstance(own, SystemExit):  # str() is only the code: '0'
        text = f"the stage called sys.exit({own.code!r})"
    message = f"{kind}: {one_line_of(text)}".rstrip(": ")
    return f"{message} ({where})" if where else message


_REMOTE_RAISE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.*)$", re.MULTILINE)


def _remote_exception(exc: BaseException, text: str) -> tuple[str, str] | None:
    """(type, message) of the user's exception when an engine carried it only as text (a Spark
    Python worker's PythonException, a Ray task's UserCodeException): the last exception line in
    `text` (the outermost wrapper's, which holds the whole chain) whose type is not the engine's."""
    if not is_engine_error(exc):
        return None
    found = [(kind, message) for kind, message in _REMOTE_RAISE.findall(text)
             if not kind.startswith(ENGINE_PACKAGES) and kind.rsplit(".", 1)[-1] not in ENGINE_WRAPPERS]
    return (found[-1][0].rsplit(".", 1)[-1], found[-1][1]) if found else None


_REMOTE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _user_frame(exc: BaseException, root: Path) -> str | None:
    """file:line in function of the deepest frame inside the pipeline root: from the traceback, or
    from a traceback an engine carried over as text (a Ray task, a Spark Python worker; Polars' query
    process adds it as a note)."""
    root = root.resolve()
    frames = [(_source_file(frame), line, frame.f_code.co_name) for frame, line in traceback.walk_tb(exc.__traceback__)]
    carried = "\n".join([str(exc), *getattr(exc, "__notes__", ())])  # a traceback as text: an engine's, or a note
    frames += [(m[0], int(m[1]), m[2]) for m in _REMOTE_FRAME.findall(carried)]
    where = None
    for filename, line, function in frames:
        relative = _root_relative(filename, root)
        if relative is not None:
            where = f"{relative}:{line} in {function}"
    if where is None and isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}"
    return where


def _source_file(frame) -> str:
    """The file a frame's code came from. A function that an engine shipped by value (cloudpickle,
    which Dask uses, names such code "<dynamic-code>" since 3.1.3) keeps its module's __file__ in
    its globals, and the traceback a worker sends back keeps that too (tblib)."""
    filename = frame.f_code.co_filename
    if filename.startswith("<"):
        return frame.f_globals.get("__file__") or filename
    return filename


_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # hybridflow/, whichever folder this is in


def _root_relative(filename: str, root: Path) -> Path | None:
    """A frame's file relative to root, also when an engine ran a shipped copy of it (a Spark worker
    imports stages/etl.py from .../userFiles-.../stages-1a2b.zip/stages/etl.py): then the longest
    trailing package/module path that exists under root."""
    if filename.startswith("<"):
        return None  # "<string>", "<dynamic-code>": no file (and not one of that name in the working directory)
    path = Path(filename)
    if any(part in ("site-packages", "dist-packages") for part in path.parts):
        return None  # a library, even inside a virtualenv under root
    resolved = path.resolve()
    if resolved.is_relative_to(_PACKAGE_DIR):
        return None
    if resolved.is_relative_to(root):
        return resolved.relative_to(root)
    for start in range(1, len(path.parts) - 1):  # at least package/module.py
        candidate = Path(*path.parts[start:])
        if ".." not in candidate.parts and (root / candidate).is_file():
            return candidate
    return None
