"""A real S3-compatible server for tests: moto in server mode, one process on 127.0.0.1 that the tests
start and stop by pid, and the AWS variables that point hybridflow and every engine at it. S3Endpoint
holds what a test does with any S3 server (tests/support/versitygw.py is the second one)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REGION = "us-east-1"
BOOTSTRAP_KEY, BOOTSTRAP_SECRET = "hf-bootstrap", "hf-bootstrap-secret"  # before authentication is on
ALL_OF_S3 = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'


class S3Endpoint:
    """An S3 server the tests started: its endpoint and the keys made for the run, and the few things
    tests do with it through boto3 and pyarrow (never through hybridflow)."""

    name = "s3"
    scheme = "s3"  # how URIs name it
    endpoint: str
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """The standard AWS variables for this server (what a user sets): no storage: section needed."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": REGION,
                # nothing of the machine's own AWS setup may leak into a test
                "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=REGION)

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=self.endpoint, access_key=self.access_key,
                                 secret_key=self.secret_key, region=REGION)

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def put_table(self, key: str, table: pa.Table) -> None:
        """A Parquet file at s3://key (bucket/...), written by pyarrow."""
        pq.write_table(table, key, filesystem=self.filesystem())

    def put_bytes(self, key: str, data: bytes) -> None:
        bucket, _, name = key.partition("/")
        self.client().put_object(Bucket=bucket, Key=name, Body=data)

    def bucket_names(self) -> list[str]:
        return [b["Name"] for b in self.client().list_buckets()["Buckets"]]

    def get_bytes(self, key: str) -> bytes:
        bucket, _, name = key.partition("/")
        return self.client().get_object(Bucket=bucket, Key=name)["Body"].read()

    def keys(self, prefix: str) -> list[str]:
        bucket, _, rest = prefix.partition("/")
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=rest)
        return sorted(f"{bucket}/{item['Key']}" for page in pages for item in page.get("Contents", []))


class S3Server(S3Endpoint):
    """moto in server mode."""

    name = "moto"

    def __init__(self, log: Path, host: str = "127.0.0.1", authenticate: bool = True) -> None:
        self.log, self.host = log, host  # host: an address other hosts (network namespaces) reach it on
        # authenticate=False: any key is taken and no signature checked (behind a proxy that edits requests)
        self.authenticate = authenticate
        self.port = free_port(host)
        self.endpoint = f"http://{host}:{self.port}"
        self.process: subprocess.Popen | None = None
        self.access_key, self.secret_key = BOOTSTRAP_KEY, BOOTSTRAP_SECRET

    def start(self) -> S3Server:
        # moto checks credentials once it has served this many requests: the three that make the one
        # user whose key the tests use, allowed everything on S3 (wrong keys are then refused, 403)
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3" if self.authenticate else "inf"}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", self.host, "-p",
                                             str(self.port)], stdout=out, stderr=out, env=env, start_new_session=True)
        wait_for_port(self.process, self.host, self.port, "moto server", self.log)
        if self.authenticate:
            self._make_user()
        return self

    def _make_user(self) -> None:
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, aws_access_key_id=BOOTSTRAP_KEY,
                           aws_secret_access_key=BOOTSTRAP_SECRET, region_name=REGION)
        iam.create_user(UserName="hybridflow-tests")
        iam.put_user_policy(UserName="hybridflow-tests", PolicyName="s3", PolicyDocument=ALL_OF_S3)
        key = iam.create_access_key(UserName="hybridflow-tests")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def stop(self) -> None:
        stop_group(self.process)


def stop_group(process: subprocess.Popen | None) -> None:
    """Stop a server started in a session of its own, by its pid: SIGTERM, then SIGKILL after 10 s."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_port(process: subprocess.Popen, host: str, port: int, what: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_group(process)  # one that never answered is not left running: no fixture will stop it
                raise RuntimeError(f"{what} did not start; see {log}") from None
            time.sleep(0.05)


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
