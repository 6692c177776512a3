"""A store is checked before it is trusted, against a real S3 server (moto on 127.0.0.1) and a
fault-injecting proxy in front of it (tests/support/s3proxy.py): a store that ignores conditional
writes is refused (exit 69) before any lease is taken, and the check is kept in the workdir; the
bucket's content is data, never paths outside the cache; incomplete multipart uploads are aborted; a
batch delete that fails for some keys is reported; a fresh machine reads only the run records it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.s3proxy import S3Proxy
from tests.support.s3server import S3Server

pytestmark = pytest.mark.timeout(600)

STEPS = '''
import pandas as pd


def make(rows=3):
    return pd.DataFrame({"a": list(range(rows))})


def fail(a):
    raise RuntimeError("failed on purpose")
'''

PIPELINE = '''
name: small
workdir: s3://{bucket}/{prefix}
stages:
  make: {{run: "mypkg.steps:make", outputs: [a]}}
'''


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto without signature checks: the proxy's edits must reach it (a signed header removed)."""
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log", authenticate=False).start()
    try:
        server.bucket("trust")
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(s3, request):
    started = S3Proxy(s3.endpoint, **getattr(request, "param", {})).start()
    try:
        yield started
    finally:
        started.stop()


def hf(project, env: dict, *args: str, cache: Path) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env, "HYBRIDFLOW_CACHE": str(cache), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, env=environ,
                          capture_output=True, text=True, timeout=300)


def small(project, prefix: str, steps: str = STEPS, pipeline: str = PIPELINE) -> None:
    project.stages(steps)
    project.pipeline(pipeline.format(bucket="trust", prefix=prefix))


@pytest.mark.parametrize("proxy", [{"strip_conditions": True}], indirect=True)
def test_a_store_that_ignores_conditional_writes_is_refused_before_any_lease(project, s3, proxy, tmp_path):
    small(project, "stripped")
    done = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 69, done.stdout + done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert proxy.endpoint in line and "If-None-Match" in line and "If-Match" in line, line
    assert "Traceback" not in done.stderr
    assert s3.keys("trust/stripped/") == []  # no lease, no probe left behind, no answer kept
    collected = hf(project, proxy.env(s3), "gc", "pipeline.yaml", cache=tmp_path / "m1")
    assert collected.returncode == 69, collected.stdout + collected.stderr
    doctor = hf(project, proxy.env(s3), "doctor", "pipeline.yaml", cache=tmp_path / "m1")
    assert "ignores If-None-Match" in doctor.stdout + doctor.stderr, doctor.stdout + doctor.stderr


def test_a_store_that_honours_them_is_checked_once_and_the_answer_kept_per_endpoint(project, s3, proxy, tmp_path):
    small(project, "honoured")
    first = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert proxy.requested("PUT", "/.hybridflow/store-probe-")  # probed...
    keys = s3.keys("trust/honoured/.hybridflow/")
    assert keys == ["trust/honoured/.hybridflow/store-check.json"], keys  # ...and the probe deleted
    kept = json.loads(s3.client().get_object(Bucket="trust", Key="honoured/.hybridflow/store-check.json")["Body"].read())
    assert kept[proxy.endpoint]["honoured"] is True

    proxy.requests.clear()
    again = hf(project, proxy.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m2")  # another machine
    assert again.returncode == 0, again.stdout + again.stderr
    assert not proxy.requested("PUT", "/.hybridflow/store-probe-")  # the kept answer: one GET

    # the same workdir through a gateway that drops the conditions: another endpoint, checked afresh
    stripping = S3Proxy(s3.endpoint, strip_conditions=True).start()
    try:
        refused = hf(project, stripping.env(s3), "run", "pipeline.yaml", cache=tmp_path / "m3")
    finally:
        stripping.stop()
    assert refused.returncode == 69 and stripping.endpoint in refused.stderr, refused.stdout + refused.stderr

    proxy.requests.clear()
    doctor = hf(project, proxy.env(s3), "doctor", "pipeline.yaml", cache=tmp_path / "m2")
    assert "conditional writes" in doctor.stdout and proxy.requested("PUT", "/.hybridflow/store-probe-"), doctor.stdout
    assert s3.keys("trust/honoured/.hybridflow/") == ["trust/honoured/.hybridflow/store-check.json"]
