"""Values read back from a workdir are checked before they become paths, ssh targets or commands."""

from __future__ import annotations

import pytest

from hybridflow.data import untrusted
from hybridflow.errors import ExitCode


@pytest.mark.parametrize("name", ["part-0.parquet", "week=2026-11-02/part-0.parquet", "a/b/c.txt", ".hidden"])
def test_plain_relative_file_names_are_taken(name):
    assert untrusted.relative_file(name, "here").as_posix() == name


@pytest.mark.parametrize("name", ["../../x", "a/../../x", "/etc/passwd", "", ".", "a//b", "a/./b", "a\\..\\b",
                                  "a\0b", None, 3])
def test_names_that_reach_outside_are_refused_in_one_line(name):
    with pytest.raises(untrusted.UntrustedValue) as raised:
        untrusted.relative_file(name, "the manifest s3://b/v/_manifest.json")
    assert raised.value.exit_code == ExitCode.DATA
    assert raised.value.one_line().startswith("the manifest s3://b/v/_manifest.json names the file name")
    assert "\n" not in raised.value.one_line()


@pytest.mark.parametrize(("check", "good", "bad"), [
    (untrusted.run_id, ["20261127T030000Z-a1b2c3", "gc-20261127T030000Z-a1b2c3"], ["../x", "..", "-x", "a/b", ""]),
    (untrusted.host, ["10.0.0.2", "node-1.example.com", "root@node-1", "[fe80::1]"],
     ["-oProxyCommand=touch x", "host name", "a;b", "node\n", "", "@host"]),
    (untrusted.name, ["sshflow", "hf-small-20260101T000000Z-abcdef-dask"], ["../up", "a b", "$(x)", "-rf"]),
])
def test_run_ids_hosts_and_names(check, good, bad):
    for value in good:
        assert check(value, "here") == value
    for value in bad:
        with pytest.raises(untrusted.UntrustedValue):
            check(value, "here")
