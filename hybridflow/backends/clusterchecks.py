"""Attaching an engine to a cluster: its address parsed and reached (one line when nothing answers),
the address the driver binds to and advertises, and the checks before any data moves that its
workers run this machine's versions and see the workdir under the same path."""

from __future__ import annotations

from pathlib import Path


def check_reachable(backend: str, address: str, host: str, port: int, timeout: float = 5.0,
                    source: str | None = None) -> None:
    """Fail fast with one line when a cluster address does not answer (engines would retry for minutes).
    `source`: the local address the driver binds to and advertises, which the connection leaves from."""
    import errno
    import socket

    from ..errors import UnavailableError

    try:
        with socket.create_connection((host, port), timeout=timeout,
                                      source_address=(source, 0) if source else None):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL and source:
            raise UnavailableError(f"the {backend} driver cannot bind to {source}: it is not an address of this host",
                                   hint=f"fix or remove backends.{backend}.advertise_address") from None
        raise UnavailableError(f"cannot reach the {backend} cluster at {address}: {exc.strerror or exc}",
                               hint=f"start it, or fix backends.{backend} in the pipeline file") from None


def is_loopback_host(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1): a cluster on this host."""
    import ipaddress
    import socket

    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError):
        return False  # check_reachable says what is wrong with it
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def local_address_towards(host: str, port: int) -> str:
    """The one address of this host that the kernel routes `host` from: a connected UDP socket sends
    nothing, but its local end is chosen by the routing table."""
    import socket

    family, _, _, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)
        return probe.getsockname()[0]


def driver_address(host: str, port: int, advertise: str | None) -> str | None:
    """Where the driver side of an engine attached to a cluster at host:port binds and what it tells
    the cluster to call back: `advertise` (backends.<engine>.advertise_address) or the local address
    that routes to the cluster; None for a cluster on loopback, which stays on 127.0.0.1 like an
    embedded engine. Never a wildcard address."""
    if is_loopback_host(host):
        return None
    try:
        return advertise or local_address_towards(host, port)
    except OSError:
        return None  # no route: check_reachable reports it


def versions_probe():
    """A function giving its process's Python (major.minor) and the versions of the packages it is
    asked for: what a worker's must equal the driver's. Made here, nested, so that cloudpickle ships it
    by value (a module-level function goes by reference, and a worker without hybridflow could not
    load it); it imports what it uses itself."""
    def versions(*packages: str) -> dict[str, str]:
        import importlib
        import sys

        found = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
        for package in packages:
            try:
                found[package] = getattr(importlib.import_module(package), "__version__", "unknown")
            except ImportError:
                found[package] = "not installed"
        return found

    return versions


def require_same_versions(backend: str, address: str, workers: dict[str, dict[str, str]],
                          packages: tuple[str, ...]) -> None:
    """One line and exit 69 when a worker runs other versions than this machine: a pickled function or
    Parquet written by another pyarrow then fails deep in a stage, or silently differs."""
    from ..errors import UnavailableError

    here = versions_probe()(*packages)
    for worker, theirs in sorted(workers.items()):
        different = [f"{name} {theirs.get(name, 'unknown')} (here {version})" for name, version in here.items()
                     if theirs.get(name) != version]
        if different:
            others = sum(1 for w in workers.values() if any(w.get(k) != v for k, v in here.items())) - 1
            raise UnavailableError(f"the {backend} cluster at {address}: worker {worker} runs "
                                   f"{', '.join(different)}{f' (and {others} more workers differ)' if others else ''}",
                                   hint="install the driver's versions on every node (python -m pip freeze "
                                        "here says which)")


def require_shared_workdir(backend: str, address: str, workdir: Path, seen_by_workers) -> None:
    """Write a marker file into `workdir` here and ask the cluster's workers whether they see it:
    `seen_by_workers(path)` runs on them and returns one answer (True: the file is there) per worker
    it reached. Raises a one-line UnavailableError (exit 69) unless every answer is yes."""
    import uuid

    from ..errors import UnavailableError, first_line

    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / f".hybridflow-shared-{uuid.uuid4().hex}"
    marker.write_bytes(b"")
    try:
        answers = list(seen_by_workers(str(marker)))
    except Exception as exc:
        raise UnavailableError(f"cannot check that the {backend} cluster at {address} sees the workdir {workdir}: "
                               f"{first_line(exc)}", hint="check that the cluster has workers") from exc
    finally:
        marker.unlink(missing_ok=True)
    if not answers or not all(answers):
        missing = "no worker answered" if not answers else \
            f"{answers.count(False)} of {len(answers)} workers do not see a file written there"
        raise UnavailableError(f"the workdir {workdir} is not shared with the {backend} cluster at {address}: "
                               f"{missing}",
                               hint="mount it on every node under the same path (NFS or another shared "
                                    "filesystem), or set workdir: to a path that is")


def split_host_port(address: str, default_port: int) -> tuple[str, int]:
    """'spark://h:7077', 'tcp://h:8786', 'h:6379' -> (host, port)."""
    rest = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else (rest, default_port)
