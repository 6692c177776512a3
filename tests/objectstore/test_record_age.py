"""The age of an object by the store's own clock (what a reaper reads a watch session's beat by),
against a real S3 server (moto on 127.0.0.1): this machine's clock, set hours wrong, changes nothing."""

from __future__ import annotations

import time

import pytest

from tests.support.s3stores import every_store

pytestmark = pytest.mark.timeout(120)
S3_BUCKETS = ("ages",)


@every_store
def test_a_records_age_is_read_by_the_stores_clock_not_this_machines(s3, monkeypatch):
    from hybridflow.data.storage import ObjectPath
    from hybridflow.data.stores.s3 import S3Settings
    from hybridflow.data.stores.s3objects import S3ObjectStore
    from hybridflow.store.clusterrecords import ObjectRecords

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    records = ObjectRecords(S3ObjectStore(S3Settings.of()), ObjectPath("ages/p/clusters"))
    assert records.age("run-dask") is None  # no such record
    records.put("run-dask", {"name": "hf-p-run-dask", "beat_every": 1.0})
    monkeypatch.setattr(time, "time", lambda: 10 * 3600.0)  # this machine's clock, far off
    first = records.age("run-dask")
    assert first is not None and 0 <= first < 5
    deadline = time.monotonic() + 10
    while records.age("run-dask") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 2 <= records.age("run-dask") < 5  # the store's seconds go by; this machine's stand still
