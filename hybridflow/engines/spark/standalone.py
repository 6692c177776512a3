"""A Spark standalone cluster that hybridflow launches on hosts (`cluster:` under backends.spark): the
commands of its master and workers, and the shared secret they and the application authenticate
and encrypt with."""

from __future__ import annotations

from .. import ClusterLaunch

# spark-class of the pyspark the hosts' Python imports (its launcher scripts ship in the wheel)
_SPARK_CLASS = ("import os, sys, pyspark; bin = os.path.join(os.path.dirname(pyspark.__file__), 'bin'); "
                "os.execv(os.path.join(bin, 'spark-class'), ['spark-class', *sys.argv[1:]])")


def cluster_launch(python: str, head: str, port: int | None, name: str, idle_timeout: float,
                   scratch: str = "") -> ClusterLaunch:
    """A standalone master and workers, each bound to its host's address, authenticated with a secret
    made for the cluster (spark.authenticate, its traffic encrypted), the web UIs, which cannot be
    turned off, bound to loopback (SPARK_LOCAL_IP) on a free port, the workers' scratch in the
    cluster's private folder."""
    import secrets

    port = port or 7077
    secret = secrets.token_hex(32)
    properties = f"{scratch}/spark-auth.properties"

    def spark_class(*args: str) -> list[str]:
        return ["env", "SPARK_LOCAL_IP=127.0.0.1", f"SPARK_LOCAL_DIRS={scratch}/spark-local",
                f"PYSPARK_PYTHON={python}", python, "-c", _SPARK_CLASS, *args, "--webui-port", "0",
                "--properties-file", properties]

    return ClusterLaunch(
        f"spark://{head}:{port}", port,
        spark_class("org.apache.spark.deploy.master.Master", "--host", head, "--port", str(port)),
        lambda host: spark_class("org.apache.spark.deploy.worker.Worker", f"spark://{head}:{port}",
                                 "--host", host, "--work-dir", f"{scratch}/spark-work"),
        # a master that cannot bind its port exits (Spark would try the next ones, where nothing looks):
        # a port its last holder has not let go of yet is then waited for and the master started again
        files={"spark-auth.properties": "".join(f"{key}={value}\n" for key, value in
                                                {**auth_conf(secret), "spark.port.maxRetries": "0"}.items())},
        attach={"auth_secret": secret}, secrets=(secret,),
        head_ready="Starting Spark master at", joined="Successfully registered with master")


def auth_conf(secret: str) -> dict[str, str]:
    """What a master, its workers and the application share: the secret, and encryption with it."""
    return {"spark.authenticate": "true", "spark.authenticate.secret": secret,
            "spark.network.crypto.enabled": "true", "spark.master.rest.enabled": "false"}
