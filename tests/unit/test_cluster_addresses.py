"""Where a driver attached to a cluster binds, and the shared-workdir error, without any engine: the
helpers every backend uses (tests/clusters/test_multihost.py runs them against real clusters on other hosts)."""

from __future__ import annotations

import socket

import pytest

from hybridflow.backends.clusterchecks import (
    check_reachable,
    driver_address,
    is_loopback_host,
    local_address_towards,
    require_shared_workdir,
)
from hybridflow.errors import ExitCode, UnavailableError


@pytest.fixture
def listener():
    """A TCP port listening on 127.0.0.1, standing for a cluster's."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_a_cluster_on_loopback_keeps_the_driver_on_loopback():
    assert is_loopback_host("127.0.0.1") and is_loopback_host("localhost")
    assert driver_address("127.0.0.1", 7077, None) is None
    assert driver_address("localhost", 7077, "10.213.0.1") is None  # nothing to advertise to this host


def test_the_local_address_towards_a_host_is_the_one_the_kernel_routes_from():
    assert local_address_towards("127.0.0.1", 7077) == "127.0.0.1"
    assert not is_loopback_host("10.213.0.2")


def test_advertise_address_overrides_the_routed_one():
    assert driver_address("10.213.0.2", 7077, "10.213.0.1") == "10.213.0.1"


def test_an_advertise_address_this_host_does_not_have_fails_at_once(listener):
    with pytest.raises(UnavailableError) as caught:
        check_reachable("spark", "spark://127.0.0.1", "127.0.0.1", listener, source="10.213.0.77")
    assert caught.value.exit_code == ExitCode.UNAVAILABLE
    assert caught.value.one_line() == ("the spark driver cannot bind to 10.213.0.77: it is not an address of this "
                                       "host (fix or remove backends.spark.advertise_address)")
    check_reachable("spark", "spark://127.0.0.1", "127.0.0.1", listener, source="127.0.0.1")


def test_a_workdir_the_workers_do_not_see_is_one_line_with_the_fix(tmp_path):
    workdir = tmp_path / "work"
    markers = []

    def half_the_workers(path: str) -> list[bool]:
        markers.append(path)
        return [True, False]

    with pytest.raises(UnavailableError) as caught:
        require_shared_workdir("dask", "tcp://10.213.0.2:8786", workdir, half_the_workers)
    assert caught.value.one_line() == (
        f"the workdir {workdir} is not shared with the dask cluster at tcp://10.213.0.2:8786: 1 of 2 workers do "
        "not see a file written there (mount it on every node under the same path (NFS or another shared "
        "filesystem), or set workdir: to a path that is)")
    assert markers[0].startswith(str(workdir)) and not list(workdir.iterdir())  # the marker is removed

    with pytest.raises(UnavailableError, match="no worker answered"):
        require_shared_workdir("ray", "10.213.0.2:6379", workdir, lambda path: [])
    require_shared_workdir("ray", "10.213.0.2:6379", workdir, lambda path: [True, True])
