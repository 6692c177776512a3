"""Values read back from a workdir (a bucket anyone with write access to it can edit) checked before
they become local paths, ssh targets or remote commands: the bucket is data, not code.

Each check returns the value when it is safe and raises UntrustedValue (a DataError: exit 65, one
line naming where it came from) otherwise.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from ..errors import DataError

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # new_run_id's shape, and the names prefixed to it
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # a pipeline, engine or cluster name
# [user@]host: a DNS name, an IPv4 address or a bracketed IPv6 one; never an option (-oProxyCommand=...)
HOST = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]{0,63}@)?([A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\])")


class UntrustedValue(DataError):
    """A value read from the workdir that would reach outside where it belongs."""


def relative_file(name: object, where: str) -> PurePosixPath:
    """A file name under a folder: relative, no '..', no empty or '.' part, no backslash or NUL."""
    text = name if isinstance(name, str) else ""
    path = PurePosixPath(text)
    if (not text or path.is_absolute() or "\\" in text or "\0" in text
            or any(part in ("", ".", "..") for part in text.split("/"))):
        raise _refused(f"the file name {name!r}", where, "not a plain relative path")
    return path


def run_id(value: object, where: str) -> str:
    if not (isinstance(value, str) and RUN_ID.fullmatch(value) and value.strip(".") and ".." not in value):
        raise _refused(f"the run id {value!r}", where, "not a run id")
    return value


def name(value: object, where: str) -> str:
    if not (isinstance(value, str) and NAME.fullmatch(value) and ".." not in value):
        raise _refused(f"the name {value!r}", where, "not a plain name")
    return value


def host(value: object, where: str) -> str:
    if not (isinstance(value, str) and HOST.fullmatch(value)):
        raise _refused(f"the host {value!r}", where, "not a host name or address")
    return value


def _refused(what: str, where: str, why: str) -> UntrustedValue:
    return UntrustedValue(f"{where} names {_short(what)}, {why}: refused (the workdir's content is not trusted)",
                          hint="someone or something wrote it there: remove or restore that object")


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:80] + "…"
