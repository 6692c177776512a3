"""Spark's s3a jars fetched the first time they are needed, without Maven: from a Maven repository served
here on 127.0.0.1 (a few small jars, their POMs and checksums, in Maven's layout), into a cache in a
temporary folder. A jar with the wrong checksum, a connection dropped mid-file, a repository that is not
there: nothing lands in the cache, and the error is one line with exit code 69."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybridflow.engines.spark.s3_jars import (
    CACHE_VARIABLE,
    FOLDER_VARIABLE,
    REPOSITORY_VARIABLE,
    check,
    ensure,
    hadoop_version,
)
from hybridflow.errors import ExitCode, UnavailableError
from tests.support.maven import PROJECT, serving

VERSION = "9.9.9"
HADOOP_AWS_POM = PROJECT.format(f"""
  <parent><groupId>org.apache.hadoop</groupId><artifactId>hadoop-project</artifactId><version>{VERSION}</version></parent>
  <artifactId>hadoop-aws</artifactId><version>{VERSION}</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-common</artifactId><scope>provided</scope></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId><scope>compile</scope></dependency>
    <dependency><groupId>software.amazon.s3.analyticsaccelerator</groupId><artifactId>analyticsaccelerator-s3</artifactId></dependency>
    <dependency><groupId>org.wildfly.openssl</groupId><artifactId>wildfly-openssl</artifactId><scope>runtime</scope></dependency>
    <dependency><groupId>org.assertj</groupId><artifactId>assertj-core</artifactId><scope>test</scope></dependency>
    <dependency><groupId>org.example</groupId><artifactId>optional-extra</artifactId><version>1</version><optional>true</optional></dependency>
  </dependencies>""")
HADOOP_PROJECT_POM = PROJECT.format(f"""
  <parent><groupId>org.apache.hadoop</groupId><artifactId>hadoop-main</artifactId><version>{VERSION}</version></parent>
  <groupId>org.apache.hadoop</groupId><artifactId>hadoop-project</artifactId><version>{VERSION}</version>
  <properties><aws-java-sdk-v2.version>${{sdk.line}}.4</aws-java-sdk-v2.version></properties>
  <dependencyManagement><dependencies>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId>
      <version>${{aws-java-sdk-v2.version}}</version></dependency>
    <dependency><groupId>software.amazon.s3.analyticsaccelerator</groupId>
      <artifactId>analyticsaccelerator-s3</artifactId><version>${{accelerator.version}}</version></dependency>
  </dependencies></dependencyManagement>""")
HADOOP_MAIN_POM = PROJECT.format(f"""
  <groupId>org.apache.hadoop</groupId><artifactId>hadoop-main</artifactId><version>{VERSION}</version>
  <properties><sdk.line>2.35</sdk.line><accelerator.version>1.3.1</accelerator.version></properties>""")
JARS = {  # what the POMs above need at run time, and the checksum the repository publishes for each
    f"org/apache/hadoop/hadoop-aws/{VERSION}/hadoop-aws-{VERSION}.jar": ("sha512", os.urandom(40_000)),
    "software/amazon/awssdk/bundle/2.35.4/bundle-2.35.4.jar": ("sha256", os.urandom(600_000)),
    "software/amazon/s3/analyticsaccelerator/analyticsaccelerator-s3/1.3.1/analyticsaccelerator-s3-1.3.1.jar":
        ("sha1", os.urandom(20_000)),  # older artifacts publish sha1 only
}
BUNDLE = "software/amazon/awssdk/bundle/2.35.4/bundle-2.35.4.jar"


def maven_files() -> dict[str, bytes]:
    poms = {f"org/apache/hadoop/{name}/{VERSION}/{name}-{VERSION}.pom": (text.encode(), "sha1")
            for name, text in (("hadoop-aws", HADOOP_AWS_POM), ("hadoop-project", HADOOP_PROJECT_POM),
                               ("hadoop-main", HADOOP_MAIN_POM))}
    files = {}
    for path, (data, algorithm) in [*poms.items(), *((p, (d, a)) for p, (a, d) in JARS.items())]:
        files[path] = data
        files[f"{path}.{algorithm}"] = hashlib.new(algorithm, data).hexdigest().encode()
    return files


@pytest.fixture
def maven():
    with serving(maven_files()) as server:
        yield server


def cached_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and p.name != ".lock")


def test_a_first_fetch_takes_the_jars_the_pom_needs_verified_and_a_second_downloads_nothing(maven, tmp_path):
    cache = tmp_path / "jars"
    said = io.StringIO()
    jars = ensure(VERSION, maven.url, cache, stream=said)

    assert {jar.name: jar.read_bytes() for jar in jars} == {path.rsplit("/", 1)[1]: data
                                                           for path, (_, data) in JARS.items()}
    assert {jar.parent for jar in jars} == {cache / f"hadoop-{VERSION}"}
    assert cached_files(cache) == sorted([f"hadoop-{VERSION}/.complete",
                                          *(f"hadoop-{VERSION}/{jar.name}" for jar in jars)])
    assert sorted(maven.downloads()) == sorted(JARS)  # provided, runtime, test and optional ones left out
    assert said.getvalue().count("\n") == 2 and "fetching" in said.getvalue()  # not a terminal: a line each side

    maven.requests.clear()
    assert ensure(VERSION, maven.url, cache, stream=io.StringIO()) == jars
    assert maven.requests == []


def test_a_jar_that_does_not_match_its_checksum_is_refused_and_nothing_is_cached(maven, tmp_path):
    maven.auth = "Basic dXNlcjpzM2NyZXQtdG9rZW4="  # user:s3cret-token, given in the mirror's URL
    maven.files[f"{BUNDLE}.sha256"] = hashlib.sha256(b"other bytes").hexdigest().encode()
    cache = tmp_path / "jars"
    with pytest.raises(UnavailableError) as refused:
        ensure(VERSION, maven.url.replace("http://", "http://user:s3cret-token@"), cache, stream=io.StringIO())

    line = refused.value.one_line()
    assert refused.value.exit_code == ExitCode.UNAVAILABLE == 69 and "\n" not in line
    assert "bundle-2.35.4.jar" in line and "does not match its published sha256" in line
    assert f"127.0.0.1:{maven.server_address[1]}" in line and "s3cret" not in line
    assert REPOSITORY_VARIABLE in line
    assert BUNDLE in maven.downloads()  # it was downloaded, and thrown away
    assert cached_files(cache) == []


def test_a_connection_dropped_mid_file_every_time_leaves_nothing_cached(maven, tmp_path):
    maven.drops[BUNDLE] = 3
    cache = tmp_path / "jars"
    with pytest.raises(UnavailableError) as broken:
        ensure(VERSION, maven.url, cache, retries=2, backoff=0, stream=io.StringIO())

    line = broken.value.one_line()
    assert "\n" not in line and "broke off" in line and "bundle-2.35.4.jar" in line
    assert maven.downloads().count(BUNDLE) == 3
    assert cached_files(cache) == []
    assert not list(cache.glob(".fetch-*"))


def test_a_download_cut_off_once_goes_on_where_it_stopped(maven, tmp_path):
    maven.drops[BUNDLE] = 1
    jars = ensure(VERSION, maven.url, tmp_path / "jars", retries=2, backoff=0, stream=io.StringIO())

    bundle = JARS[BUNDLE][1]
    assert [jar.read_bytes() for jar in jars if jar.name == "bundle-2.35.4.jar"] == [bundle]
    assert [(path, rng) for path, rng in maven.requests if path == BUNDLE] == [
        (BUNDLE, None), (BUNDLE, f"bytes={len(bundle) // 2}-")]


def test_two_first_fetches_at_once_download_once(maven, tmp_path):
    """The second waits on the first's lock and takes its jars; neither sees a half-made cache."""
    cache, release = tmp_path / "jars", threading.Event()
    maven.holds[BUNDLE] = release
    results, streams = {}, {"first": io.StringIO(), "second": io.StringIO()}

    def fetch(name: str) -> None:
        results[name] = ensure(VERSION, maven.url, cache, stream=streams[name])
    first = threading.Thread(target=fetch, args=("first",))
    first.start()
    with maven.asked:
        assert maven.asked.wait_for(lambda: BUNDLE in maven.downloads(), timeout=30)
    second = threading.Thread(target=fetch, args=("second",))
    second.start()
    for _ in range(300):  # until the second says it waits
        if "waiting for another process" in streams["second"].getvalue():
            break
        time.sleep(0.05)
    release.set()
    first.join(30)
    second.join(30)

    assert "waiting for another process" in streams["second"].getvalue()
    assert results["first"] == results["second"] and len(results["first"]) == len(JARS)
    assert maven.downloads().count(BUNDLE) == 1


def closed_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_repository_is_one_line_and_exit_69(tmp_path):
    port = closed_port()
    env = {**os.environ, REPOSITORY_VARIABLE: f"http://127.0.0.1:{port}/maven2/",
           CACHE_VARIABLE: str(tmp_path / "jars")}
    env.pop(FOLDER_VARIABLE, None)
    done = subprocess.run([sys.executable, "-m", "hybridflow.backends.spark_s3_jars"], env=env,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 69 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"cannot reach 127.0.0.1:{port}" in done.stderr
    assert REPOSITORY_VARIABLE in done.stderr and "python -m hybridflow.backends.spark_s3_jars" in done.stderr
    assert not (tmp_path / "jars").exists() or cached_files(tmp_path / "jars") == []


def test_doctor_names_the_repository_the_first_fetch_will_use_and_fails_when_it_does_not_answer(
        maven, tmp_path, monkeypatch):
    version = hadoop_version()  # pyspark's, read from its folder: pyspark is not imported
    pom = f"org/apache/hadoop/hadoop-aws/{version}/hadoop-aws-{version}.pom"
    maven.files[f"{pom}.sha1"] = hashlib.sha1(b"<project/>").hexdigest().encode()
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "jars"))
    monkeypatch.delenv(FOLDER_VARIABLE, raising=False)
    monkeypatch.setenv(REPOSITORY_VARIABLE, maven.url)
    said = check()
    assert "not fetched yet" in said and f"127.0.0.1:{maven.server_address[1]}" in said
    assert [path for path, _ in maven.requests if not path.endswith(".sha512") and not path.endswith(".sha256")] \
        == [f"{pom}.sha1"]  # a checksum's few bytes, not the jars

    port = closed_port()
    monkeypatch.setenv(REPOSITORY_VARIABLE, f"http://127.0.0.1:{port}/")
    with pytest.raises(UnavailableError, match=f"cannot reach 127.0.0.1:{port}"):
        check()
