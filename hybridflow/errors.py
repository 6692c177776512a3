"""Every error a user can cause, and the one table that maps them to exit codes.

The CLI is the only place that prints; everything below it raises one of these
with a message that says what went wrong, where, and how to fix it.
"""

from __future__ import annotations

import errno
import os
import re
from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """Documented exit codes (BSD sysexits where one fits, shell conventions for signals)."""

    OK = 0
    STAGE_FAILED = 1  # one or more stages raised; the rest of the run was consistent
    USAGE = 2  # bad command-line usage (unknown option, missing argument)
    DATA = 65  # an input is missing or a dataset breaks its schema contract
    UNAVAILABLE = 69  # an engine or an optional extra is not installed or cannot start
    INTERNAL = 70  # a bug in hybridflow itself; rerun with --verbose and report it
    IO_ERROR = 74  # where hybridflow or an engine writes is full, read-only, not writable, or was removed
    LOCKED = 75  # another run of the same pipeline holds its lock; try again later
    CONFIG = 78  # the pipeline file is invalid, or its workdir: is a file or a folder hybridflow did not make
    TIMEOUT = 124  # a stage ran past its timeout
    INTERRUPTED = 130  # SIGINT (Ctrl-C)
    TERMINATED = 143  # SIGTERM


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 error', '2 errors', '0 errors': a count and its noun in agreement (for every printed count)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


QUOTE_CHARS = 60  # of a row or value an engine quotes: enough to find it, too little to leak it
LINE_CHARS = 300  # of any one error line: errors go to cron mail, notifications and run records

# Where engines and parsers quote the data itself, which may hold anything (an e-mail address, a card
# number, a megabyte-long line). A whole row runs to the end of the line; a value sits in its quotes.
_QUOTED_ROW = re.compile(
    r"(?P<prefix>Expected \d+ columns, got \d+: "  # pyarrow CSV: the whole row follows
    r"|Malformed records are detected in record parsing: )"  # Spark, FAILFAST
    r"(?P<data>.+)$", re.MULTILINE)
_QUOTED_VALUE = re.compile(
    r"(?P<prefix>(?:invalid value|[Tt]he value|invalid literal for [\w()]+ with base \d+:"  # pyarrow, Spark, int()
    r"|could not convert string to float:|Unable to parse string|Could not convert|Failed to parse string:)"
    r" ?(?P<quote>['\"]))"  # float(), pandas, pyarrow from pandas
    r"(?P<data>.*?)(?P=quote)(?=\s|$|[,.;:)\]])", re.MULTILINE)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (engines attach whole Java or remote tracebacks),
    with quoted data cut short (see `one_line_of`); of a Java error raised through Py4J, the Java
    exception's line, not Py4J's "An error occurred while calling o89.parquet."."""
    text = str(exc).strip()
    if _PY4J_CALL.match(text):
        text = text.split("\n", 1)[-1].lstrip(": ")
    return one_line_of(text) or type(exc).__name__


_PY4J_CALL = re.compile(r"An error occurred while calling [\w.$]+\.\n: \S")


def one_line_of(text: str) -> str:
    """The first line of an error text fit to be mailed and recorded: a row or value the engine
    quotes is cut to its first QUOTE_CHARS characters, the line to LINE_CHARS. The rule for every
    engine, reader and user error, so that no message carries a whole input row."""
    return _clip(cut_quoted_data((text.strip().splitlines() or [""])[0]), LINE_CHARS)


def cut_quoted_data(text: str) -> str:
    """`text` with each row or value an engine quotes cut to its first QUOTE_CHARS characters."""
    text = _QUOTED_ROW.sub(lambda m: m["prefix"] + _cut(m["data"]), text)
    return _QUOTED_VALUE.sub(lambda m: m["prefix"] + _cut(m["data"]) + m["quote"], text)


def _cut(data: str) -> str:
    """A quote cut short, once: text a caller added after a cut row (its place in the user's file)
    is not the row's, so a message cut again keeps it."""
    return data if data[QUOTE_CHARS:QUOTE_CHARS + 1] == "…" else _clip(data, QUOTE_CHARS)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


class HybridflowError(Exception):
    """Base of all user-facing errors: one line of message plus an optional hint."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        message = cut_quoted_data(message)  # also where a caller put an engine's whole text in
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(HybridflowError):
    """The pipeline file (or a CLI override of it) is invalid."""

    exit_code = ExitCode.CONFIG

    def __init__(self, message: str, *, hint: str | None = None, problems: list | None = None) -> None:
        super().__init__(message, hint=hint)
        self.problems = problems or []

    @property
    def located(self) -> bool:
        """True when the error points into the file: its line reads file:line:col: error: message,
        like `validate` and compilers print it (editors jump to it), with no further label."""
        return any(p.severity == "error" for p in self.problems)

    def one_line(self) -> str:
        """The first error as `validate` prints it, and how many more there are. Built from the problems:
        the message repeats the problem's own 'error:' label, which a caller adding one would double."""
        errors = [p for p in self.problems if p.severity == "error"]
        if not errors:
            return super().one_line()
        more = f" (and {counted(len(errors) - 1, 'more error')}; hybridflow validate lists them)" if errors[1:] else ""
        return f"{errors[0]}{more}" + (f" ({self.hint})" if self.hint else "")


class UsageError(HybridflowError):
    """A command was asked for something that does not exist (an unknown run id, stage or file)."""

    exit_code = ExitCode.USAGE


class DataError(HybridflowError):
    """An input dataset is missing or unreadable, or an output breaks its schema contract."""

    exit_code = ExitCode.DATA


class UnavailableError(HybridflowError):
    """An engine or optional dependency is missing or cannot start."""

    exit_code = ExitCode.UNAVAILABLE


class LockedError(HybridflowError):
    """Another run of the same pipeline is in progress."""

    exit_code = ExitCode.LOCKED


class StageError(HybridflowError):
    """A stage's own code raised; the message is the user's exception, located in the user's file."""

    exit_code = ExitCode.STAGE_FAILED


class StorageError(HybridflowError):
    """Where hybridflow writes is full (disk or quota), read-only, not the user's to write, or was
    removed while in use: the user's to fix, not a bug."""

    exit_code = ExitCode.IO_ERROR


# How running out of space reads: the errno, SQLite's words for it, and the OS's text (which is all a
# JVM's or a worker's wrapped exception carries of it).
_OUT_OF_SPACE = re.compile(r"No space left on device|Disk quota exceeded|database or disk is full", re.I)


def is_out_of_space(exc: BaseException, where=None) -> bool:
    """Whether `exc`, or an exception it was raised from, says the disk or a quota is full; with
    `where`, also any I/O error while the disk there has (almost) no space left, which is how SQLite
    reports a journal it could not create ("disk I/O error")."""
    import errno

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StorageError):
            return True
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        try:
            text = str(current)
        except Exception:  # a JVM exception asks the JVM for its text, and the JVM may be gone
            text = ""
        if _OUT_OF_SPACE.search(text):
            return True
        current = current.__cause__ or current.__context__
    return where is not None and _is_io_error(exc) and _free_bytes(where) < 2**20


def _is_io_error(exc: BaseException) -> bool:
    import sqlite3

    return isinstance(exc, (OSError, sqlite3.OperationalError))


def _free_bytes(where) -> float:
    import shutil

    try:
        return shutil.disk_usage(_nearest_existing(Path(where))).free
    except OSError:
        return float("inf")


def out_of_space(where) -> StorageError:
    """The one error for a full disk: where, and how much is free there now."""
    free = _free_bytes(where)
    room = "free space unknown" if free == float("inf") else f"{free / 2**20:.1f} MiB free there now"
    return StorageError(f"out of disk space writing under {where} ({room})",
                        hint="free some space (hybridflow gc removes old versions), or move workdir to a bigger disk")


def storage_error(exc: BaseException, where) -> HybridflowError | None:
    """The user's error that `exc` (an OSError or a SQLite error, not raised as a HybridflowError)
    stands for when the place hybridflow writes under (`where`) is the cause: a full disk, a
    read-only file system, no permission, a file where a folder belongs. None: the cause is
    hybridflow's (a bug). The one mapping of such errors: the CLI's for whatever reaches it, the run
    store's, which knows its workdir."""
    where = os.fsdecode(where)  # an OSError's filename may be bytes
    if is_out_of_space(exc, where):
        return out_of_space(where)
    if not _is_io_error(exc):
        return None
    place = _nearest_existing(Path(where))
    code = _errno_of(exc)
    if code in (errno.ENOTDIR, errno.EEXIST) and place.is_file():
        return ConfigError(f"cannot write under {where}: {place} is a file, not a folder",
                           hint="move the file away, or point workdir: in the pipeline file at a folder")
    # SQLite says no errno: the place itself tells why it could not open or write its file
    unsure = code is None
    if code == errno.EROFS or unsure and _read_only(place):
        it = "it" if place == Path(where) else str(place)
        return StorageError(f"cannot write to {where}: {it} is on a read-only file system",
                            hint="point workdir: in the pipeline file at a writable folder, or make that file "
                                 "system writable")
    if code in (errno.EACCES, errno.EPERM) or unsure and not _writable(place):
        owner, user = _owner(place), _user()
        it = "it" if place == Path(where) else str(place)
        return StorageError(f"permission denied on {where} ({it} belongs to {owner}; hybridflow runs as user "
                            f"{user})", hint=f"give user {user} access to it, or point workdir: in the pipeline "
                                             f"file at a folder user {user} can write to")
    return None


# pyarrow's (and the AWS SDK's) words for an object store's answers that are the user's to fix
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist")
_DENIED = ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "InvalidAccessKeyId", "SIGNATURE_DOES_NOT_MATCH",
           "SignatureDoesNotMatch", "EXPIRED_TOKEN", "ExpiredToken", "Forbidden", "HTTP response code: 403",
           "No response body", "AuthorizationFailure", "AuthenticationFailed")  # the last two: Azure's
# what to set where a store refused the credentials, by scheme (AWS's for s3:// and any other)
_AWS_CREDENTIALS = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to credentials allowed to use "
                    "the bucket")
AZURE_CREDENTIALS = ("set AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY or "
                     "AZURE_STORAGE_SAS_TOKEN) to an account allowed to use the container")
_CREDENTIALS_HINTS = {"az": AZURE_CREDENTIALS}
_UNREACHABLE = ("NETWORK_CONNECTION", "Couldn't connect", "curlCode: 7", "curlCode: 28", "Connection refused",
                "Could not connect", "timed out", "Timeout")


def store_error(exc: BaseException, uri: str) -> HybridflowError:
    """An object store's failure for `uri` as one line and a documented exit code: a bucket that does
    not exist (65), credentials refused (74), a store that does not answer (69). Never the request's
    headers or credentials: pyarrow's text names the operation, the bucket and the key only."""
    text = str(exc)
    bucket = uri.split("://", 1)[-1].split("/", 1)[0]
    if any(word in text for word in _NO_BUCKET):
        return DataError(f"the bucket '{bucket}' of {uri} does not exist",
                         hint="create it, or correct the URI (and storage: endpoint, if it is not AWS S3)")
    if any(word in text for word in ("Unable to locate credentials", "No credentials", "NoCredentials")):
        return StorageError(f"no credentials to reach {uri}", hint=_AWS_CREDENTIALS)
    if any(word in text for word in _DENIED):
        return StorageError(f"the object store refused access to {uri} (403: wrong or missing credentials, or no "
                            "permission)", hint=_CREDENTIALS_HINTS.get(uri.split("://", 1)[0], _AWS_CREDENTIALS))
    if any(word in text for word in _UNREACHABLE):
        return UnavailableError(f"the object store does not answer for {uri}: {first_line(exc)}",
                                hint="check storage: endpoint (or AWS_ENDPOINT_URL) and that the store is up")
    return StorageError(f"the object store failed for {uri}: {first_line(exc)}")


def vanished(path) -> StorageError:
    """The error for a workdir (or its runs.db) deleted while a run or command was using it: what was
    not yet published never will be, and nothing is made anew half-empty."""
    return StorageError(f"{path} was removed while hybridflow was using it; nothing more was published",
                        hint="run again to start afresh: what it held is gone")


def _errno_of(exc: BaseException) -> int | None:
    """The errno of `exc` or of an OSError it was raised from."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno
        current = current.__cause__ or current.__context__
    return None


def _nearest_existing(place):
    while not place.exists() and place != place.parent:
        place = place.parent
    return place


def _read_only(place) -> bool:
    try:
        return bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _writable(place) -> bool:
    """Whether this process may write `place` (a folder: make files in it)."""
    return os.access(place, os.W_OK | (os.X_OK if place.is_dir() else 0))


def _owner(place) -> str:
    try:
        return _user(place.stat().st_uid)
    except OSError:
        return "unknown"


def _user(uid: int | None = None) -> str:
    import pwd

    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class StageTimeout(HybridflowError):
    """A stage ran past its `timeout`; its engine work was cancelled and nothing of it was published."""

    exit_code = ExitCode.TIMEOUT


class InterruptedRun(HybridflowError):
    """The run was stopped by a signal."""

    def __init__(self, signum: int) -> None:
        import signal

        name = signal.Signals(signum).name
        super().__init__(f"run interrupted by {name}; nothing half-written was published")
        self.exit_code = ExitCode.TERMINATED if name == "SIGTERM" else ExitCode.INTERRUPTED
