"""The S3 implementations the object-storage tests run against: moto (the reference) and versitygw
(a second, independent one), so that nothing of hybridflow relies on one server's quirks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import versitygw
from tests.support.s3server import S3Endpoint, S3Server

STORES = ("moto", "versitygw")

# a test that must hold on every store: `@every_store` and the `s3` fixture (tests/objectstore/conftest.py)
every_store = pytest.mark.parametrize("s3", STORES, indirect=True)


def start_store(store: str, folder: Path, authenticate: bool = True) -> S3Endpoint:
    """A started server of that implementation, its log (and data) in `folder`; skips the test where
    the implementation is not installed here, saying how to install it. `authenticate=False` is moto's
    alone (any key taken): versitygw always checks signatures."""
    if store == "moto":
        return S3Server(folder / "moto.log", authenticate=authenticate).start()
    if store == "versitygw":
        reason = versitygw.missing_reason()
        if reason:
            pytest.skip(reason)
        return versitygw.VersityServer(folder / "versitygw.log", folder / "buckets").start()
    raise ValueError(f"no S3 store named {store!r} (known: {', '.join(STORES)})")
