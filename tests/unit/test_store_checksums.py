"""On a store other than AWS, hybridflow asks the AWS SDKs for only the checksums the S3 API requires
(the stores that predate flexible checksums refuse the rest); on AWS, and where the user chose, it
changes nothing."""

from __future__ import annotations

import os

import pytest

from hybridflow.data.stores.s3 import CHECKSUM_VARIABLES, S3Settings


@pytest.fixture
def clean(monkeypatch):
    for name in CHECKSUM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_another_store_gets_only_the_required_checksums(clean):
    S3Settings.of({"endpoint": "http://127.0.0.1:9000"}, environ={}).adopt_checksum_policy()
    assert [os.environ[name] for name in CHECKSUM_VARIABLES] == ["when_required", "when_required"]


def test_aws_itself_keeps_the_sdks_defaults(clean):
    S3Settings.of({}, environ={"AWS_REGION": "eu-west-1"}).adopt_checksum_policy()
    assert not [name for name in CHECKSUM_VARIABLES if name in os.environ]


@pytest.mark.parametrize("endpoint", ["https://bucket.vpce-0a1b2c3d-4e5f.s3.us-east-1.vpce.amazonaws.com",
                                      "https://s3-fips.us-east-2.amazonaws.com", "https://s3.cn-north-1.amazonaws.com.cn"])
def test_an_aws_endpoint_keeps_the_sdks_defaults(clean, endpoint):
    S3Settings.of({"endpoint": endpoint}, environ={}).adopt_checksum_policy()
    assert not [name for name in CHECKSUM_VARIABLES if name in os.environ]


def test_what_the_user_set_is_kept(clean):
    clean.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    S3Settings.of({"endpoint": "https://store.example:9000"}, environ={}).adopt_checksum_policy()
    assert os.environ["AWS_REQUEST_CHECKSUM_CALCULATION"] == "when_supported"
    assert os.environ["AWS_RESPONSE_CHECKSUM_VALIDATION"] == "when_required"
