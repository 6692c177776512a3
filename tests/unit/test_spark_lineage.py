"""The OpenLineage Spark listener's jar, fetched once from a Maven repository served here on 127.0.0.1
(checked against its published checksum; a jar that does not match is never cached), and the conf each
stage's listener is made with: the stage's run as its parent, the pipeline's as its root, the transport
of the pipeline's `lineage:`."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from hybridflow.backends.spark.lineage import listener_conf
from hybridflow.backends.spark.lineage_jar import JAR_VARIABLE, LISTENER, artifact, listener_jar, scala_version
from hybridflow.definition.lineageids import LineageTarget, run_uuid
from hybridflow.definition.tracking import LineageSpec
from hybridflow.errors import UnavailableError
from tests.support.maven import serving

WANTED = artifact("2.13", "9.9.9")
JAR = os.urandom(50_000)


def repository(jar: bytes = JAR, published: bytes = JAR) -> dict[str, bytes]:
    path = WANTED.path("jar")
    return {path: jar, f"{path}.sha512": hashlib.sha512(published).hexdigest().encode()}


def test_the_first_need_fetches_the_jar_verified_and_later_ones_take_it_from_the_cache(tmp_path):
    cache = tmp_path / "jars"
    with serving(repository()) as maven:
        said = io.StringIO()
        jar = LISTENER.ensure(WANTED, maven.url, cache, stream=said)
        assert jar == cache / "openlineage-spark-9.9.9" / "openlineage-spark_2.13-9.9.9.jar"
        assert jar.read_bytes() == JAR and "fetching openlineage-spark_2.13-9.9.9.jar" in said.getvalue()
        maven.requests.clear()
        assert LISTENER.ensure(WANTED, maven.url, cache) == jar
        assert maven.requests == []
    assert [p.name for p in jar.parent.iterdir()] == [jar.name]  # no partial download left beside it


def test_a_jar_that_does_not_match_its_checksum_is_refused_and_nothing_is_cached(tmp_path):
    with serving(repository(published=b"another jar")) as maven, pytest.raises(UnavailableError) as raised:
        LISTENER.ensure(WANTED, maven.url, tmp_path / "jars", retries=0, backoff=0)
    assert "does not match its published sha512" in raised.value.one_line()
    assert not list((tmp_path / "jars").rglob("*.jar"))


def test_a_jar_named_by_the_environment_is_used_as_it_is(tmp_path, monkeypatch):
    jar = tmp_path / "listener.jar"
    jar.write_bytes(JAR)
    monkeypatch.setenv(JAR_VARIABLE, str(jar))
    assert listener_jar() == jar
    monkeypatch.setenv(JAR_VARIABLE, str(tmp_path / "missing.jar"))
    with pytest.raises(UnavailableError, match=JAR_VARIABLE):
        listener_jar()


def test_pyspark_here_is_built_for_scala_2_13():
    assert scala_version() == "2.13"


class Pipeline:
    """What LineageTarget.of reads of a pipeline."""

    def __init__(self, root, lineage: LineageSpec) -> None:
        self.name, self.root = "shop", root
        self.spec = type("Spec", (), {"lineage": lineage})()


def test_each_stage_listener_has_the_stage_run_as_parent_and_the_pipeline_run_as_root(tmp_path):
    spec = LineageSpec(url="http://marquez:5000", api_key="k3y", namespace="team", timeout=3)
    conf = listener_conf(LineageTarget.of(Pipeline(tmp_path, spec)), "20261127T1200Z-ab12", "enrich")
    ours = {key.removeprefix("spark.openlineage."): value for key, value in conf.items()}
    assert ours == {
        "namespace": "team", "appName": "shop.enrich.spark",
        "parentJobNamespace": "team", "parentJobName": "shop.enrich",
        "parentRunId": run_uuid("team", "shop", "20261127T1200Z-ab12", "enrich"),
        "rootParentJobNamespace": "team", "rootParentJobName": "shop",
        "rootParentRunId": run_uuid("team", "shop", "20261127T1200Z-ab12"),
        "transport.type": "http", "transport.url": "http://marquez:5000", "transport.endpoint": "/api/v1/lineage",
        "transport.timeoutInMillis": "3000", "transport.auth.type": "api_key", "transport.auth.apiKey": "k3y"}


def test_a_file_transport_is_the_same_file_relative_to_the_project(tmp_path):
    lineage = LineageTarget.of(Pipeline(tmp_path, LineageSpec(transport="file", path="lineage/events.jsonl")))
    conf = listener_conf(lineage, "r1", "make")
    assert conf["spark.openlineage.transport.type"] == "file"
    assert conf["spark.openlineage.transport.location"] == str(tmp_path / "lineage" / "events.jsonl")
    assert LineageTarget.of(Pipeline(tmp_path, None)) is None  # no lineage: no listener
