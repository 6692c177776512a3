"""The stores the object-storage tests run against: moto (the reference) and versitygw (a second,
independent one), so that nothing of hybridflow relies on one server's quirks; and fake-gcs-server and
Azurite, for the suites that hold on every cloud (`@every_cloud`: gs:// and az:// through the same tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import azurite, gcsserver, versitygw
from tests.support.s3server import S3Endpoint, S3Server

STORES = ("moto", "versitygw")

# a test that must hold on every store: `@every_store` and the `s3` fixture (tests/objectstore/conftest.py)
every_store = pytest.mark.parametrize("s3", STORES, indirect=True)
# and on every cloud's store: a test on it uses only what every endpoint has (a GcsServer's methods)
CLOUDS = (*STORES, "fake-gcs", "azurite")
every_cloud = pytest.mark.parametrize("s3", CLOUDS, indirect=True)


def start_store(store: str, folder: Path,
                authenticate: bool = True) -> S3Endpoint | gcsserver.GcsServer | azurite.AzuriteServer:
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
    if store == "fake-gcs":
        reason = gcsserver.missing_reason()
        if reason:
            pytest.skip(reason)
        return gcsserver.GcsServer(folder / "fake-gcs-server.log").start()
    if store == "azurite":
        reason = azurite.missing_reason()
        if reason:
            pytest.skip(reason)
        return azurite.AzuriteServer(folder / "azurite.log").start()
    raise ValueError(f"no store named {store!r} (known: {', '.join(CLOUDS)})")
