"""Hosts for tests, made of Linux network namespaces: each "remote host" is a namespace with an address
of its own in 10.213.0.0/24, linked to the root namespace (the driver's host, 10.213.0.1) by a veth pair
on a bridge. Processes started in one share this machine's filesystem (and so the workdir) but not its
network. Needs root (`ip netns add`); everything made is removed by Topology.remove."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .engines import descendants

SUBNET = ipaddress.ip_network("10.213.0.0/24")
DRIVER_ADDRESS = "10.213.0.1"


def ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"{' '.join(command)}: {done.stderr.strip()}")


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    probe = f"hfprobe{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create network namespaces here (needs root and ip netns): {exc}"
    with contextlib.suppress(OSError):
        ip("netns", "del", probe)
    return None


@dataclass
class Topology:
    """A bridge in the root namespace holding DRIVER_ADDRESS, and one namespace per host name."""

    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    hosts: dict[str, str] = field(default_factory=dict)  # name -> its address
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"hfbr{self.tag}"

    def build(self, names: list[str]) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{DRIVER_ADDRESS}/{SUBNET.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for number, name in enumerate(names, start=2):
            address = str(SUBNET[number])
            netns, outer = self.netns(name), self.veth(name)
            ip("netns", "add", netns)
            self.hosts[name] = address
            ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", netns)
            ip("link", "set", outer, "master", self.bridge, "up")
            ip("addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0", netns=netns)
            ip("link", "set", "eth0", "up", netns=netns)
            ip("link", "set", "lo", "up", netns=netns)

    def netns(self, name: str) -> str:
        return f"hf{self.tag}-{name}"

    def veth(self, name: str) -> str:
        return f"hf{self.tag}{name[0]}"  # the root namespace's end of the host's link

    def launch(self, host: str, args: list[str], log: Path, env: dict | None = None,
               hide: Path | None = None) -> subprocess.Popen:
        """Start `args` on `host`, in its own process group; `hide`: a directory covered by an empty
        tmpfs in the process's own mount namespace, so that it cannot see what is there."""
        if hide is not None:
            script = f"mount -t tmpfs hidden {hide} && exec \"$@\""
            args = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *args]
        # an embedded Ray of an earlier test may have left its single-node switch in this environment
        inherited = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        process = subprocess.Popen(["ip", "netns", "exec", self.netns(host), *args], env={**inherited, **(env or {})},
                                   stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def run(self, host: str, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns(host), *args], **kwargs)

    def stop(self, processes: list[subprocess.Popen] | None = None) -> None:
        """SIGTERM to each process group started here, then SIGKILL to the groups left after 3 s (a
        cluster's daemons share their launcher's group). 3 s, not more: the two `ray start --block`
        never end within 10 s of SIGTERM here and were killed at that deadline anyway."""
        chosen = self.processes if processes is None else processes
        for process in chosen:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for process in chosen:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes = [p for p in self.processes if p not in chosen]

    def remove(self) -> None:
        """Stop every process, then delete the namespaces (their veth pairs go with them) and the bridge."""
        self.stop()
        for name in self.hosts:
            with contextlib.suppress(OSError):
                ip("netns", "del", self.netns(name))
            with contextlib.suppress(OSError):  # gone with its namespace, unless something still holds that
                ip("link", "del", self.veth(name))
        with contextlib.suppress(OSError):
            ip("link", "del", self.bridge)

    def listeners(self, pids: set[int]) -> list[Listener]:
        """Each TCP listener of `pids`, by `ss -ltnp` in the root namespace and in every host's."""
        found = []
        for where in [None, *self.hosts]:
            command = ["ss", "-ltnpH"]
            done = (self.run(where, command, capture_output=True, text=True, timeout=30) if where
                    else subprocess.run(command, capture_output=True, text=True, timeout=30))
            for line in done.stdout.splitlines():
                columns = line.split()
                owners = frozenset(int(pid) for pid in re.findall(r"pid=(\d+)", line)) & pids
                if len(columns) >= 4 and owners:
                    found.append(Listener(where or "root", columns[3], owners, " ".join(columns[5:])[:160]))
        return found


@dataclass(frozen=True)
class Listener:
    namespace: str  # "root" or a host's name
    local: str  # address:port as ss prints it
    pids: frozenset[int]
    processes: str  # ss's users:(...) column

    @property
    def port(self) -> int:
        return int(self.local.rsplit(":", 1)[1])


def address_allowed(local: str) -> bool:
    """A listener's address: 127.0.0.1 (or its IPv6-mapped form) or one in SUBNET; never a wildcard."""
    host = local.rsplit(":", 1)[0].strip("[]").split("%")[0]
    if host in ("*", "0.0.0.0", "::"):
        return False
    address = ipaddress.ip_address(host)
    address = getattr(address, "ipv4_mapped", None) or address
    return address == ipaddress.ip_address("127.0.0.1") or address in SUBNET


def process_tree(roots: list[int]) -> set[int]:
    """`roots` and every descendant, read from /proc (all namespaces here share one process namespace)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return set(roots) | descendants(roots, parents)
