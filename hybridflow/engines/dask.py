"""How hybridflow knows Dask before starting it (a local cluster, an address, or a cluster brought up
over SSH): its settings (backends.dask in the pipeline file), the stage `hybridflow init` writes for it, the
commands of its own cluster processes, and its Engine declaration. Light to import: the backend,
hybridflow.backends.dask, is imported when a run creates one."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ..settings import EngineSection, GpuMode, Section
from . import ClusterLaunch, Engine


class DaskTls(Section):
    """A client's TLS credentials for a scheduler at tls://: PEM text, or paths of PEM files."""

    ca: str = Field(description="the certificate authority the scheduler's certificate is signed by")
    cert: str = Field(description="the client's certificate")
    key: str = Field(description="the client's private key")


# The scheduler always serves HTTP (health, metrics), on 8787 unless told otherwise, even with no
# dashboard address: keep it off the dashboard's port, on a free loopback port, with no dashboard.
class DaskSettings(EngineSection):
    cluster_address_field: ClassVar[str | None] = "address"
    address: str | None = Field(None, description="scheduler address (tcp://host:8786); default: a local cluster")
    n_workers: int | None = Field(None, ge=1)
    threads_per_worker: int | None = Field(None, ge=1)
    processes: bool | None = None
    memory_limit: str | None = None
    gpu: GpuMode = False
    rmm_pool_size: str | None = None
    advertise_address: str | None = Field(
        None, description="attached to a scheduler on another host: the address of this host the client "
                          "connects from (default: the one that routes to the scheduler)")
    tls: DaskTls | None = Field(None, description="attached to a scheduler at tls://: the client's credentials")


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Features on Dask: a dask DataFrame in and out (computed when hybridflow writes it)."""

import dask.dataframe as dd


def features({input}: dd.DataFrame) -> dd.DataFrame:
    return {input}.assign(big_spender={input}["amount"] > {input}["amount"].mean())
'''

LOOPBACK_HTTP = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]


def cluster_launch(python: str, head: str, port: int | None, name: str, idle_timeout: float,
                   scratch: str = "") -> ClusterLaunch:
    """A scheduler that ends itself after `idle_timeout` seconds without work, and workers that end
    themselves a minute after they lose it: a cluster whose runner died goes away on its own. TLS
    everywhere, with a key and certificate made for the cluster (client, scheduler and workers):
    no one without them connects. The HTTP servers they always run (health, metrics), no dashboard,
    on loopback."""
    from distributed.security import Security

    port = port or 8786
    address = f"tls://{head}:{port}"
    made = Security.temporary()  # one self-signed certificate, its own authority, for every role
    tls = ["--tls-ca-file", f"{scratch}/dask-ca.pem", "--tls-cert", f"{scratch}/dask-cert.pem",
           "--tls-key", f"{scratch}/dask-key.pem"]
    return ClusterLaunch(
        address, port,
        [python, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls", "--host", head, "--port", str(port),
         *tls, *LOOPBACK_HTTP, "--idle-timeout", f"{idle_timeout:g}s"],
        lambda host: [python, "-m", "distributed.cli.dask_worker", address, "--host", host, *tls, *LOOPBACK_HTTP,
                      "--death-timeout", "60"],
        files={"dask-ca.pem": made.tls_ca_file, "dask-cert.pem": made.tls_scheduler_cert,
               "dask-key.pem": made.tls_scheduler_key},
        attach={"tls": DaskTls(ca=made.tls_ca_file, cert=made.tls_client_cert, key=made.tls_client_key)},
        secrets=(made.tls_client_key,), head_ready="Scheduler at:", joined="Registered to:")


ENGINE = Engine(
    name="dask", module="hybridflow.backends.dask", example=(EXAMPLE_STAGE, "features"),
    settings=DaskSettings, description="Dask: a local cluster or a scheduler's address",
    frame_types="dask.dataframe.DataFrame", requires=("distributed",), extra="dask",
    distributions=("dask", "distributed"),
    gpu=True, gpu_packages=("cudf", "dask_cudf", "dask_cuda"),
    attached_gpu_packages=("cudf", "dask_cudf"),  # the client builds cuDF frames itself
    attached=lambda settings: bool(settings.address), cluster_launch=cluster_launch,
)
