"""The listening sockets of a run's whole process tree, sampled while it runs: embedded engines must
listen on 127.0.0.1 only, and no dashboard or job API port may be open."""

from __future__ import annotations

import ipaddress
import subprocess
import threading
import time

import psutil

DASHBOARD_PORTS = {8787: "Dask dashboard", 8265: "Ray dashboard / job API", 4040: "Spark UI"}


class ListenerSampler:
    """Samples, every `interval` seconds until stopped, each (address, port) listened on by `pid`
    or any of its descendants, with the command names that listened there."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.seen: dict[tuple[str, int], set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "ListenerSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in tree:
            try:
                connections = process.net_connections(kind="inet")
                name = " ".join(process.cmdline()[:3])[:120]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            for connection in connections:
                if connection.status == psutil.CONN_LISTEN:
                    self.seen.setdefault((connection.laddr.ip, connection.laddr.port), set()).add(name)

    def problems(self) -> list[str]:
        """Every listener off loopback, and every dashboard port open, in words."""
        found = []
        for (address, port), names in sorted(self.seen.items()):
            if not is_loopback(address):
                found.append(f"{address}:{port} (not loopback) by {sorted(names)}")
            elif port in DASHBOARD_PORTS:
                found.append(f"{address}:{port} ({DASHBOARD_PORTS[port]}) by {sorted(names)}")
        return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 and ::1, also written as IPv4-mapped IPv6 (::ffff:127.0.0.1, as the JVM binds)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def run_sampled(command: list[str], timeout: float, **popen) -> tuple[subprocess.CompletedProcess, ListenerSampler]:
    """Run `command` to its end while sampling its listeners."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    with ListenerSampler(process.pid) as sampler:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"{command} did not end within {timeout} s:\n{out}\n{err}") from None
    return subprocess.CompletedProcess(command, process.returncode, out, err), sampler
