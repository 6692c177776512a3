"""Whether an object store honours conditional writes, proved before a workdir there is trusted.

The lease and the commit of a workdir in object storage are conditional writes: a second create-only
write (If-None-Match: *) and a compare-and-swap against a stale ETag (If-Match) must both be refused.
A store (or a gateway in front of one) that ignores the headers accepts both, and then two runners
each hold the lease and overwrite each other's commits without a word. So before a workdir is first
used, a probe object under it is written create-only twice and swapped once with a wrong ETag; a
store that accepts either is refused. The answer is kept beside the probe, per endpoint, so the check
costs one GET after the first time; `hybridflow doctor` redoes it.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone

from ..data.objectstore import Conflict, ObjectStore
from ..data.storage import ObjectPath
from ..errors import UnavailableError

FOLDER = ".hybridflow"
RESULT = "store-check.json"

_trusted: set[tuple[str, str]] = set()  # (endpoint, workdir) proved in this process


def endpoint_of(objects: ObjectStore) -> str:
    return objects.settings.endpoint or objects.settings.label


def require_trusted(objects: ObjectStore, workdir: ObjectPath) -> None:
    """Raise UnavailableError (exit 69) unless the store of `workdir` is known to honour conditional
    writes: from this process's memory, the workdir's kept answer, or a probe made now."""
    endpoint = endpoint_of(objects)
    if (endpoint, str(workdir)) in _trusted:
        return
    kept, _ = objects.read_json(workdir / FOLDER / RESULT)
    if not (isinstance(kept, dict) and isinstance(kept.get(endpoint), dict) and kept[endpoint].get("honoured")):
        ignored = probe(objects, workdir)
        if ignored:
            raise refusal(endpoint, workdir, ignored)
        remember(objects, workdir, kept if isinstance(kept, dict) else {})
    _trusted.add((endpoint, str(workdir)))


def probe(objects: ObjectStore, workdir: ObjectPath) -> list[str]:
    """The conditions the store ignored (none: it honours both), found with a probe object under the
    workdir that is always deleted. Each write's body differs, so that a write taken for a lost answer
    of an earlier one is never mistaken for it."""
    path = workdir / FOLDER / f"store-probe-{secrets.token_hex(6)}.json"
    ignored = []
    try:
        objects.write_json(path, {"probe": 1}, create_only=True)
        for condition, attempt in (("If-None-Match: * (a second create-only write succeeded)",
                                    lambda: objects.write_json(path, {"probe": 2}, create_only=True)),
                                   ("If-Match (a compare-and-swap with a wrong ETag succeeded)",
                                    lambda: objects.write_json(path, {"probe": 3}, if_match=objects.wrong_tag))):
            try:
                attempt()
            except Conflict:
                continue
            ignored.append(condition)
    finally:
        objects.delete(path)
    return ignored


def remember(objects: ObjectStore, workdir: ObjectPath, kept: dict) -> None:
    checked = {"honoured": True, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    objects.write_json(workdir / FOLDER / RESULT, {**kept, endpoint_of(objects): checked})


def recheck(objects: ObjectStore, workdir: ObjectPath) -> list[str]:
    """The probe made again whatever is kept (doctor): the conditions ignored, the answer kept when none."""
    _trusted.discard((endpoint_of(objects), str(workdir)))
    ignored = probe(objects, workdir)
    if not ignored:
        kept, _ = objects.read_json(workdir / FOLDER / RESULT)
        remember(objects, workdir, kept if isinstance(kept, dict) else {})
        _trusted.add((endpoint_of(objects), str(workdir)))
    return ignored


def refusal(endpoint: str, workdir: ObjectPath, ignored: list[str]) -> UnavailableError:
    return UnavailableError(f"the object store at {endpoint} ignores {' and '.join(ignored)} for {workdir.uri}: "
                            "its lease and commits would protect nothing",
                            hint="use a store that honours conditional writes (the README's Object storage section "
                                 "lists those known to work), or remove a gateway that drops If-None-Match/If-Match")
