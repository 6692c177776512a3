"""The S3 server of the object-storage tests, one per module and store: moto unless a test asks for
every store (`@every_store`, tests/support/s3stores.py), then moto and versitygw in turn.

A module says what it needs of the server through two names of its own: S3_BUCKETS (made at start)
and S3_CHECKS_SIGNATURES (False: moto takes any key, for tests behind a proxy that edits requests)."""

from __future__ import annotations

import pytest

from tests.support.s3stores import start_store


@pytest.fixture(scope="module")
def s3(request, tmp_path_factory):
    store = getattr(request, "param", "moto")
    server = start_store(store, tmp_path_factory.mktemp(f"s3-{store}"),
                         authenticate=getattr(request.module, "S3_CHECKS_SIGNATURES", True))
    try:
        for bucket in getattr(request.module, "S3_BUCKETS", ()):
            server.bucket(bucket)
        yield server
    finally:
        server.stop()
