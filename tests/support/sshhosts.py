"""An sshd on each host of a network-namespace Topology (Debian's openssh-server, started on the host's
address with keys made for the occasion), for tests and benchmarks of clusters brought up over SSH."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .netns import Topology

SSHD = Path("/usr/sbin/sshd")
CLIENT_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
# what each engine's processes are given on the hosts (small: they share this machine's cores)
ENGINE_ARGS = {"spark": {"worker_args": ["--cores", "1", "--memory", "1g"]},
               "dask": {"worker_args": ["--nthreads", "1"]},
               "ray": {"head_args": ["--num-cpus", "0", "--object-store-memory", "100000000"],
                       "worker_args": ["--num-cpus", "1", "--object-store-memory", "100000000"]}}


def three_host_cluster(hosts: Topology, key: Path, engine: str) -> dict:
    """backends.<engine>.cluster over SSH on hosts a (the head), b and c as root, with the S3
    credentials from ${env:...} (Ray's token is the run's own)."""
    a, b, c = (hosts.hosts[name] for name in ("a", "b", "c"))
    return {"provider": "ssh", "hosts": [{"host": a, "head": True}, {"host": b}, {"host": c}], "user": "root",
            "key_file": str(key), "python": sys.executable, "ssh_options": CLIENT_OPTIONS,
            "env": {"AWS_ACCESS_KEY_ID": "${env:AWS_ACCESS_KEY_ID}",
                    "AWS_SECRET_ACCESS_KEY": "${env:AWS_SECRET_ACCESS_KEY}", "AWS_REGION": "us-east-1"},
            **ENGINE_ARGS[engine]}


def start_sshd(hosts: Topology, keys: Path, hide: Path | None = None) -> Path:
    """Start an sshd on each host (in a mount namespace where `hide` is an empty tmpfs) that lets root in
    with a client key made here; returns the client's private key once every host answers. They are
    stopped with the topology's other processes (hosts.stop())."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "client")], check=True)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    for name, address in hosts.hosts.items():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / f"host-{name}")], check=True)
        config = keys / f"sshd-{name}.conf"
        config.write_text(f"ListenAddress {address}\nHostKey {keys / f'host-{name}'}\n"
                          f"PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                          f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                          f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPidFile {keys / f'sshd-{name}.pid'}\n")
        hosts.launch(name, [str(SSHD), "-D", "-e", "-f", str(config)], keys / f"sshd-{name}.log", hide=hide)
    deadline = time.monotonic() + 30
    for name, address in hosts.hosts.items():
        while subprocess.run(ssh(keys / "client", address, "true"), capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {name} did not answer: {(keys / f'sshd-{name}.log').read_text()}")
            time.sleep(0.2)
    return keys / "client"


def ssh(key: Path, address: str, command: str) -> list[str]:
    return ["ssh", "-i", str(key), "-o", "BatchMode=yes", *CLIENT_OPTIONS, f"root@{address}", command]
