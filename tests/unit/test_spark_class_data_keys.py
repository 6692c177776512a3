"""Which class-data archive a Spark driver JVM is given, without starting one (the JVM's side is in
tests/engines/test_spark_class_data.py): the archive is per Java, Spark home and jars, and driver
classpath and options, so a changed jar means another archive; a key whose write failed is left
alone for a week; no archive where the JVM could not write one (a non-empty conf folder on its
classpath, a cache path with a colon, another user's cache folder)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hybridflow.backends.spark.classdata import FOLDER, class_data

CONF = {"spark.driver.extraJavaOptions": "-XX:-UsePerfData", "spark.driver.memory": "2g"}


@pytest.fixture
def machine(tmp_path, monkeypatch) -> Path:
    """A Java, a Spark home with two jars, and a jar cache, all under tmp_path."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    (tmp_path / "jdk" / "lib").mkdir()
    (tmp_path / "jdk" / "lib" / "modules").write_bytes(b"modules")
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (jars / name).write_bytes(b"jar " + name.encode())
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv("HYBRIDFLOW_JARS", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    return tmp_path


def test_a_changed_jar_or_driver_option_means_another_archive(machine):
    first = class_data(CONF)
    assert first is not None and first.writing is not None and first.writing.parent == first.archive.parent
    assert first.archive.parent == machine / "cache" / FOLDER
    assert class_data(CONF).archive == first.archive

    jar = machine / "spark" / "jars" / "spark-sql.jar"
    os.utime(jar, (time.time() + 60, time.time() + 60))  # a reinstall: same name and size, newer
    touched = class_data(CONF).archive
    assert touched != first.archive

    listener = machine / "listener.jar"
    listener.write_bytes(b"v1")
    with_listener = {**CONF, "spark.driver.extraClassPath": str(listener)}
    before = class_data(with_listener).archive
    listener.write_bytes(b"v2 longer")
    assert class_data(with_listener).archive not in (before, touched)
    assert class_data({**CONF, "spark.driver.memory": "4g"}).archive != touched


def test_a_whole_archive_is_mapped_and_a_failed_key_left_alone_for_a_week(machine):
    chosen = class_data(CONF)
    chosen.archive.parent.mkdir(parents=True, exist_ok=True)
    failed = chosen.archive.with_suffix(".failed")
    failed.touch()
    assert class_data(CONF) is None
    os.utime(failed, (time.time() - 8 * 86400, time.time() - 8 * 86400))
    assert class_data(CONF).writing is not None

    chosen.archive.write_bytes(b"\xa8\xab\x0b\xf0" + b"\0" * 64)
    mapped = class_data(CONF)
    assert mapped.writing is None and "-XX:SharedArchiveFile=" in mapped.java_options
    chosen.archive.write_bytes(b"half")  # not an archive: written anew
    assert class_data(CONF).writing is not None


def test_no_archive_where_the_jvm_could_not_write_one_or_the_user_chose_their_own(machine, monkeypatch):
    assert class_data({**CONF, "spark.driver.extraJavaOptions": "-Xshare:off"}) is None

    conf_folder = machine / "spark-conf"
    conf_folder.mkdir()
    (conf_folder / "spark-defaults.conf").write_text("")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_folder))
    assert class_data(CONF) is None
    monkeypatch.delenv("SPARK_CONF_DIR")

    monkeypatch.setenv("HYBRIDFLOW_JARS", str(machine / "a:b"))
    assert class_data(CONF) is None


def test_abandoned_writes_and_long_unused_archives_are_dropped(machine):
    folder = machine / "cache" / FOLDER
    folder.mkdir(parents=True)
    old = time.time() - 40 * 86400
    abandoned, recent = folder / "k.1-a.writing", folder / "k.2-b.writing"
    unused, used = folder / "u.jsa", folder / "v.jsa"
    for path in (abandoned, recent, unused, used):
        path.write_bytes(b"\xa8\xab\x0b\xf0")
    os.utime(abandoned, (time.time() - 7200, time.time() - 7200))
    os.utime(unused, (old, old))
    assert class_data(CONF).writing is not None
    assert sorted(path.name for path in folder.iterdir()) == ["k.2-b.writing", "v.jsa"]
