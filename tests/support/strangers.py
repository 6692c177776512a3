"""A stranger on another host trying each engine's cluster without the run's credentials: what it got
("refused: ..." or "accepted"), for tests of clusters that must let no one else in. Each try uses the
engine's own client, as someone on the network would."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time

# a Spark application that registers with a master, with no secret of its own
SPARK_APP = '''
import sys
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master(sys.argv[1]).config("spark.driver.host", sys.argv[2])
         .config("spark.driver.bindAddress", sys.argv[2]).config("spark.ui.enabled", "false")
         .config("spark.cores.max", "1").config("spark.executor.memory", "512m").getOrCreate())
print("ACCEPTED", spark.sparkContext.applicationId, flush=True)
spark.stop()
'''
SPARK_REFUSED = ("Failed to connect to master", "All masters are unresponsive")


def stranger_env() -> dict[str, str]:
    """This process's environment without any engine credential (Ray's token) a run may have set."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("RAY_AUTH") and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}


def try_dask(head: str, port: int = 8786) -> list[str]:
    """A client over plain TCP, and one over TLS with certificates of its own."""
    from distributed import Client
    from distributed.security import Security

    outcomes = []
    for address, security in ((f"tcp://{head}:{port}", None), (f"tls://{head}:{port}", Security.temporary())):
        try:
            with Client(address, security=security, timeout=10) as client:
                client.scheduler_info()
                outcomes.append(f"{address}: accepted")
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, it did not get in
            outcomes.append(f"{address}: refused: {type(exc).__name__}")
    return outcomes


def try_ray(head: str, port: int = 6379) -> str:
    """`ray status` against the head with no token."""
    try:
        done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", "--address", f"{head}:{port}"],
                              env=stranger_env(), capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return "refused: no answer within 90 s"
    said = (done.stdout + done.stderr).strip().splitlines()
    return "accepted" if done.returncode == 0 else f"refused: {said[-1] if said else done.returncode}"


def try_spark(master: str, driver: str, timeout: float = 150) -> str:
    """An application registering with the master, no secret given: accepted once its SparkContext is
    up; refused when the master will not talk to it; unclear when it said neither."""
    env = {**stranger_env(), "SPARK_LOCAL_IP": driver, "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    process = subprocess.Popen([sys.executable, "-c", SPARK_APP, master, driver], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            line = process.stdout.readline() if ready else ""
            if ready and not line:
                break
            lines.append(line)
            if line.startswith("ACCEPTED"):
                return "accepted"
            if any(said in line for said in SPARK_REFUSED):
                return f"refused: {line.strip()[:200]}"
        return f"unclear: {(''.join(lines).strip().splitlines() or ['nothing said'])[-1][:200]}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
        process.wait()


def port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False
