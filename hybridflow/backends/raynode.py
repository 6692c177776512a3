"""A Ray node on this host for a driver attached to a cluster on other hosts.

A Ray driver talks to the cluster through a raylet of its own host (ray.init finds it by the node's
address); a host outside the cluster has none, and ray.init would wait for one and fail. So hybridflow
joins this host to the cluster for the run, with no CPUs or GPUs (no task of the cluster is scheduled
here by resources), on the address that routes to the cluster, and stops it when the engine stops.
Where this host already runs a node of that address (the driver runs on the head, say), that one is used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..engines.ray import STARTED
from ..errors import UnavailableError

START_TIMEOUT = 120.0


def runs_here(node_ip: str) -> bool:
    """Whether a raylet of this host serves `node_ip` (read from /proc: its command line says)."""
    wanted = f"--node_ip_address={node_ip}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            words = (entry / "cmdline").read_bytes().split(b"\0")
            if words and words[0].endswith(b"/raylet") and wanted in words:
                return True
    return False


class DriverNode:
    """`ray start --block` joining `address` as node `node_ip`, in its own process group, its output
    in `log`; stop() ends it and removes its temp directory."""

    def __init__(self, address: str, node_ip: str, log: Path) -> None:
        # short: Ray's socket paths must fit in 107 bytes; owner-only, like a local instance's
        self.temp_dir = tempfile.mkdtemp(prefix="hybridflow-ray-node-")
        # Ray refuses to join a cluster where this is 0 (hybridflow sets it for a local instance)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        # ended with the thread that starts it (the engine's starter lives as long as its engine), also
        # when the runner is killed -9: in a session of its own, nothing else would end it
        dies_with_us = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
        command = [*dies_with_us, sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--address", address,
                   "--node-ip-address", node_ip, "--num-cpus", "0", "--num-gpus", "0", "--disable-usage-stats",
                   "--temp-dir", self.temp_dir]
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_started(self, address: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while STARTED not in self._output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                last = (self._output().strip().splitlines() or ["no output"])[-1]
                self.stop()
                raise UnavailableError(f"ray cannot join this host to the cluster at {address}: {last}",
                                       hint=f"see {self.log}")
            time.sleep(0.25)

    def _output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to its process group (ray start stops the raylet it started), SIGKILL after 30 s."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
