"""How hybridflow knows Ray before starting it (a local instance, an address, or a cluster brought up
over SSH): its settings (backends.ray in the pipeline file), the stage `hybridflow init` writes for it, the
commands of its own cluster processes, and its Engine declaration. Light to import: the backend,
hybridflow.backends.ray, is imported when a run creates one."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ..settings import EngineSection, GpuMode, Params
from . import ClusterLaunch, Engine

STARTED = "Ray runtime started."  # what `ray start` prints once its raylet is up


class RaySettings(EngineSection):
    cluster_address_field: ClassVar[str | None] = "address"
    address: str | None = Field(None, description="head address (host:6379); default: a local instance")
    num_cpus: int | None = Field(None, ge=1)
    num_gpus: int | None = Field(None, ge=0)
    init: Params = Field(default_factory=dict, description="extra keyword arguments for ray.init")
    gpu: GpuMode = False
    advertise_address: str | None = Field(
        None, description="attached to a head on another host: the address of this host the cluster "
                          "connects back to (default: the one that routes to the head)")
    auth_token: str | None = Field(None, description="attached to a head with token authentication: its token "
                                                     "(from ${env:...})")


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Scoring on Ray: a ray.data.Dataset in and out, scored in parallel batches."""

import pandas as pd
import ray.data


def score({input}: ray.data.Dataset) -> ray.data.Dataset:
    def add_score(batch: pd.DataFrame) -> pd.DataFrame:
        return batch.assign(score=batch["amount"] / 50.0)

    return {input}.map_batches(add_score, batch_format="pandas")
'''

def cluster_launch(python: str, head: str, port: int | None, name: str, idle_timeout: float,
                   scratch: str = "") -> ClusterLaunch:
    """`ray start` of a head and of worker nodes, each bound to its host's address, no dashboard, with
    token authentication (a token made for the cluster, read from a file in its private folder); the
    nodes' session files in that folder (short: Ray's socket paths must fit in 107 bytes)."""
    import secrets

    port = port or 6379
    token = secrets.token_hex(32)

    def start(host: str, *args: str) -> list[str]:
        return ["env", "-u", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={scratch}/ray-token",
                python, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address", host,
                "--disable-usage-stats", "--temp-dir", f"{scratch}/ray", *args]

    # Ray's daemons outlive a SIGTERM by more than 10 s, so any grace is spent in full; by the time a
    # cluster goes down its work is in the store: half a second
    return ClusterLaunch(f"{head}:{port}", port,
                         start(head, "--head", "--port", str(port), "--include-dashboard=false"),
                         lambda host: start(host, "--address", f"{head}:{port}"), grace=0.5,
                         files={"ray-token": token}, attach={"auth_token": token}, secrets=(token,),
                         head_ready=STARTED, joined=STARTED)


ENGINE = Engine(
    name="ray", module="hybridflow.backends.ray", example=(EXAMPLE_STAGE, "score"),
    settings=RaySettings, description="Ray: a local instance or a head's address",
    frame_types="ray.data.Dataset", requires=("ray",), extra="ray", distributions=("ray",), gpu=True,
    attached=lambda settings: bool(settings.address), cluster_launch=cluster_launch,
)
