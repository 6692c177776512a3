"""A workdir in object storage (workdir: s3://...), against a real S3 server (moto in server mode on
127.0.0.1): every engine publishes there with the same results as a local workdir; a runner with no
local state (a new machine) sees the earlier runs, skips what is unchanged, processes only new
partitions and resumes a failed run; two runners never run the pipeline at once (exit 75); a commit
that loses a race to another writer, or a store that stops answering, is one line with nothing
half-published; SIGKILL at any moment leaves each dataset at its old or its new version, and the
next run and gc clean up."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hybridflow
from hybridflow.engines.spark import s3_jars
from tests.objectstore.test_s3_inputs import ENGINES, STAGES, WEEKS, expected_join, pipeline_text, put_week
from tests.support.maven import repository_of, serving
from tests.support.s3server import S3Endpoint, S3Server
from tests.support.s3stores import every_cloud, every_store

pytestmark = pytest.mark.timeout(900)


def hf(project, s3: S3Endpoint, *args: str, cache: Path, env: dict | None = None, wait: bool = True):
    environ = {**os.environ, **s3.env(), "HYBRIDFLOW_CACHE": str(cache), **(env or {})}
    command = [sys.executable, "-m", "hybridflow.cli", *args]
    if not wait:
        return subprocess.Popen(command, cwd=project.root, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(command, cwd=project.root, env=environ, capture_output=True, text=True, timeout=600)


def statuses(summary: str) -> dict[str, str]:
    """{stage: status} from a run's summary table."""
    return {found[1]: found[2] for found in re.finditer(r"│ (\w+)\s+│ \w+\s+│ ([\w ]+?)\s+│", summary)}


def current_versions(s3: S3Endpoint, prefix: str) -> dict[str, str]:
    return json.loads(s3.get_bytes(f"{prefix}/CURRENT"))["datasets"]


@every_cloud
def test_every_engine_publishes_to_s3_and_a_fresh_machine_skips_resumes_and_adds_partitions(project, s3, tmp_path):
    bucket = s3.bucket("lake-workdir")
    for week in WEEKS:
        put_week(s3, f"{bucket}/events", week)
    s3.put_bytes(f"{bucket}/customers.csv", b"customer,tier\nc0,1\nc1,2\nc2,3\n")
    project.stages(STAGES)
    file = project.pipeline(pipeline_text(bucket, scheme=s3.scheme).replace("workdir: .hf",
                                                                             f"workdir: {s3.scheme}://{bucket}/team"))
    first_machine = tmp_path / "machine-1"

    done = hf(project, s3, "run", "pipeline.yaml", cache=first_machine)
    assert done.returncode == 0, done.stdout + done.stderr
    assert s3.secret_key not in done.stdout + done.stderr
    assert not (project.root / ".hybridflow").exists()
    # nor in anything the run kept on this machine (run records, logs, reports, engines' settings)
    kept = [p for p in first_machine.rglob("*") if p.is_file() and s3.secret_key.encode() in p.read_bytes()]
    assert kept == []
    environ = {**s3.env(), "HYBRIDFLOW_CACHE": str(first_machine)}
    os.environ.update(environ)  # hybridflow.read in this process reaches the store as the runs did
    try:
        for engine in ENGINES:
            table = hybridflow.read(file, f"joined_{engine}", engine="arrow")
            got = sorted(table.select(["customer", "amount", "ts", "note", "week", "tier"]).to_pylist(),
                         key=lambda r: (r["week"], r["ts"]))
            assert got == expected_join(WEEKS), engine
    finally:
        for name in environ:
            os.environ.pop(name, None)
    versions = current_versions(s3, f"{bucket}/team/s3in")
    assert set(versions) == {*(f"joined_{e}" for e in ENGINES), "weekly_totals"}
    keys = s3.keys(f"{bucket}/team/")
    for dataset, version in versions.items():
        assert f"{bucket}/team/s3in/datasets/{dataset}/versions/{version}/_manifest.json" in keys
    assert not [k for k in keys if "staging" in k or "LEASE" in k]

    # a new machine: nothing local; the runs are listed, every stage is skipped
    second_machine = tmp_path / "machine-2"
    listed = hf(project, s3, "runs", "-w", f"{s3.scheme}://{bucket}/team", cache=second_machine)
    assert listed.returncode == 0 and "success" in listed.stdout, listed.stdout + listed.stderr
    again = hf(project, s3, "run", "pipeline.yaml", cache=second_machine)
    assert again.returncode == 0, again.stdout + again.stderr
    assert set(statuses(again.stdout).values()) == {"skipped"}, again.stdout

    # a third machine after a new week: only the new partition of the incremental stage is processed
    new_week = dt.date(2026, 11, 16)
    put_week(s3, f"{bucket}/events", new_week)
    third_machine = tmp_path / "machine-3"
    added = hf(project, s3, "run", "pipeline.yaml", "--only", "weekly", cache=third_machine)
    assert added.returncode == 0, added.stdout + added.stderr
    shown = hf(project, s3, "logs", "last", "weekly", "-f", "pipeline.yaml", cache=third_machine)
    assert "1 partition written, 2 carried over" in shown.stdout, shown.stdout + shown.stderr


FLAKY = '''
import os
import time

import pandas as pd


def make(rows=3):
    return pd.DataFrame({"a": list(range(rows))})


def check(a):
    if os.environ.get("HF_FAIL_CHECK"):
        raise RuntimeError("check failed on purpose")
    return a.assign(b=a["a"] * 2)


def slow(b, gate="", seconds=0):
    """Holds its run open for `seconds`, then until the file `gate` exists (none given: at once)."""
    time.sleep(seconds)
    deadline = time.monotonic() + 300
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate file {gate} did not appear within 300 s")
        time.sleep(0.05)
    return b
'''

SMALL = '''
name: small
workdir: {scheme}://{bucket}/{prefix}
stages:
  make: {{run: "mypkg.steps:make", outputs: [a]}}
  check: {{run: "mypkg.steps:check", inputs: [a], outputs: [b]}}
  slow: {{run: "mypkg.steps:slow", inputs: [b], outputs: [c], params: {{gate: ""}}}}
'''


def small(project, s3: S3Endpoint, prefix: str) -> str:
    bucket = "small-workdirs"
    if bucket not in s3.bucket_names():
        s3.bucket(bucket)
    project.stages(FLAKY)
    project.pipeline(SMALL.format(bucket=bucket, prefix=prefix, scheme=s3.scheme))
    return f"{bucket}/{prefix}"


@every_cloud
def test_a_failed_run_is_resumed_from_another_machine(project, s3, tmp_path):
    small(project, s3, "resume")
    failed = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1", env={"HF_FAIL_CHECK": "1"})
    assert failed.returncode == 1, failed.stdout + failed.stderr
    resumed = hf(project, s3, "run", "pipeline.yaml", "--resume", cache=tmp_path / "m2")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert statuses(resumed.stdout) == {"make": "skipped", "check": "done", "slow": "done"}, resumed.stdout
    # the report's line names the workdir in the store (not this machine's cache), and that opens it anywhere
    workdir = f"{s3.scheme}://small-workdirs/resume"
    assert f"(hybridflow report -w {workdir} --open opens it)" in resumed.stdout, resumed.stdout
    reported = hf(project, s3, "report", "-w", workdir, cache=tmp_path / "m3")
    assert reported.returncode == 0 and Path(reported.stdout.strip()).is_file(), reported.stdout + reported.stderr
    # the store was proved to honour conditional writes before it was trusted, and the answer kept
    kept = s3.get_bytes("small-workdirs/resume/.hybridflow/store-check.json")
    assert json.loads(kept)[s3.endpoint]["honoured"] is True


@every_cloud
def test_two_runners_on_two_machines_never_run_the_pipeline_at_once(project, s3, tmp_path):
    small(project, s3, "lease")
    # the first run holds the lease until the test opens its gate (6 s of sleep could end before a slow
    # machine's second run had started)
    gate = tmp_path / "gate"
    first = hf(project, s3, "run", "pipeline.yaml", "--param", f"slow.gate={gate}", cache=tmp_path / "m1", wait=False)
    try:
        deadline = time.monotonic() + 120
        while not [k for k in s3.keys("small-workdirs/lease/") if k.endswith("/LEASE")]:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.1)
        second = hf(project, s3, "run", "pipeline.yaml", "--force", cache=tmp_path / "m2")
        assert first.poll() is None, "the first run ended before its gate was opened"
    finally:
        gate.touch()  # never leave the first run waiting, even when an assertion above failed
    assert second.returncode == 75, second.stdout + second.stderr
    assert "another run of this pipeline is in progress" in second.stderr and "Traceback" not in second.stderr
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, out + err
    assert not [k for k in s3.keys("small-workdirs/lease/") if k.endswith("/LEASE")]  # released
    third = hf(project, s3, "run", "pipeline.yaml", "--force", cache=tmp_path / "m2")
    assert third.returncode == 0, third.stdout + third.stderr


@every_store
def test_a_commit_that_loses_a_race_publishes_nothing_and_says_so(project, s3, tmp_path):
    prefix = small(project, s3, "race")
    done = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    before = current_versions(s3, f"{prefix}/small")
    bucket, key = prefix.split("/")[0], prefix.split("/", 1)[1] + "/small/CURRENT"
    # another writer replaces CURRENT while the stage runs (its lease lost, say): the commit's
    # compare-and-swap must fail, not overwrite what the other writer made current
    project.write("mypkg/steps.py", FLAKY + f'''

def racing(a):
    import boto3
    client = boto3.client("s3")
    body = client.get_object(Bucket="{bucket}", Key="{key}")["Body"].read()
    client.put_object(Bucket="{bucket}", Key="{key}", Body=body + b"\\n")  # same datasets, a new ETag
    return a.assign(b=a["a"] * 3)
''')
    project.pipeline(SMALL.format(bucket=bucket, prefix="race", scheme=s3.scheme).replace("mypkg.steps:check",
                                                                                           "mypkg.steps:racing"))
    raced = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert raced.returncode == 75, raced.stdout + raced.stderr
    assert "another run committed" in raced.stdout + raced.stderr and "Traceback" not in raced.stderr
    assert current_versions(s3, f"{prefix}/small") == before
    collected = hf(project, s3, "gc", "pipeline.yaml", "--keep", "1", cache=tmp_path / "m1")
    assert collected.returncode == 0 and "b@" in collected.stdout, collected.stdout + collected.stderr
    assert len(s3.keys(f"{prefix}/small/datasets/b/versions/")) == 2  # the current one: its data and manifest


def test_sigkill_at_random_moments_leaves_old_or_new_versions_and_the_next_run_recovers(project, s3, tmp_path):
    prefix = small(project, s3, "kill")
    cache = tmp_path / "m1"
    clock = time.monotonic()
    done = hf(project, s3, "run", "pipeline.yaml", cache=cache)
    took = time.monotonic() - clock  # the kills' moments scale with this machine's speed
    assert done.returncode == 0, done.stdout + done.stderr
    old = current_versions(s3, f"{prefix}/small")
    seen = {name: {version} for name, version in old.items()}
    rng = random.Random(7)
    for kill in range(10):
        before = current_versions(s3, f"{prefix}/small")
        run = hf(project, s3, "run", "pipeline.yaml", "--force", cache=cache, wait=False)
        if kill % 3 == 1:  # right after a commit is seen in the store, whatever the machine's speed
            deadline = time.monotonic() + 120
            while current_versions(s3, f"{prefix}/small") == before and run.poll() is None:
                assert time.monotonic() < deadline, "no commit within 120 s"
                time.sleep(0.02)
        else:  # anywhere in the run, from its start to about its end
            time.sleep(rng.uniform(0.05, 1.0) * took)
        with contextlib.suppress(ProcessLookupError):  # a run that already ended
            os.killpg(run.pid, signal.SIGKILL)  # the supervising parent and the run's process alike
        run.communicate()
        bucket, key = prefix.split("/", 1)
        for name, version in current_versions(s3, f"{prefix}/small").items():
            seen[name].add(version)
            directory = f"{key}/small/datasets/{name}/versions/{version}"
            answer = s3.client().get_object(Bucket=bucket, Key=f"{directory}/_manifest.json")
            manifest = json.loads(answer["Body"].read())
            for entry in manifest["files"]:  # every file the current manifest names is there, whole
                head = s3.client().head_object(Bucket=bucket, Key=f"{directory}/{entry['path']}")
                assert head["ContentLength"] == entry["size"]
    assert any(len(versions) > 1 for versions in seen.values())  # the kills after a commit kept it
    recovered = hf(project, s3, "run", "pipeline.yaml", "--force", cache=cache)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    # no grace: the uploads the killed runs left without a manifest go too (no writer is slow here)
    collected = hf(project, s3, "gc", "pipeline.yaml", "--keep", "1", cache=cache,
                   env={"HYBRIDFLOW_GC_GRACE_SECONDS": "0"})
    assert collected.returncode == 0, collected.stdout + collected.stderr
    current = current_versions(s3, f"{prefix}/small")
    for name, version in current.items():
        left = {k.split("/versions/")[1].split("/")[0] for k in s3.keys(f"{prefix}/small/datasets/{name}/versions/")}
        assert left == {version}, (name, left)


def test_a_store_that_stops_answering_mid_run_is_one_line_and_publishes_nothing(project, tmp_path):
    server = S3Server(tmp_path / "moto.log").start()
    try:
        small(project, server, "dying")
        project.write("mypkg/steps.py", FLAKY + f'''

def dying(a):
    import os, signal
    os.killpg({server.process.pid}, signal.SIGKILL)
    return a
''')
        small_text = SMALL.format(bucket="small-workdirs", prefix="dying", scheme="s3")
        project.pipeline(small_text.replace("mypkg.steps:check", "mypkg.steps:dying"))
        done = hf(project, server, "run", "pipeline.yaml", cache=tmp_path / "m1")
        assert done.returncode == 69, done.stdout + done.stderr
        assert "does not answer" in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr
    finally:
        server.stop()


def test_secret_params_and_logs_agree_across_machines(project, s3, tmp_path):
    prefix = small(project, s3, "secrets")
    project.pipeline((project.root / "pipeline.yaml").read_text().replace(
        'outputs: [a]}', 'outputs: [a], params: {rows: 3, token: "${env:HF_TEST_TOKEN}"}}'))
    project.write("mypkg/steps.py", FLAKY.replace("def make(rows=3):", "def make(rows=3, token=None):"))
    secret = {"HF_TEST_TOKEN": "tok-0123456789abcdef"}
    first = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1", env=secret)
    assert first.returncode == 0, first.stdout + first.stderr
    # the report reads the versions' manifests from the store: b's lineage names a's version
    report = Path(re.search(r"report: (\S+report\.html)", first.stdout)[1]).read_text()
    assert f"a@{current_versions(s3, f'{prefix}/small')['a']}" in report
    again = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m2", env=secret)
    assert again.returncode == 0 and set(statuses(again.stdout).values()) == {"skipped"}, again.stdout
    assert "tok-0123456789abcdef" not in "".join(s3.keys(f"{prefix}/")) + str(current_versions(s3, f"{prefix}/small"))
    # the first run's log of stage make, from a third machine: downloaded from the workdir
    [run_id] = re.findall(r"small run (\S+): success", first.stdout)
    shown = hf(project, s3, "logs", run_id, "make", "-f", "pipeline.yaml", cache=tmp_path / "m3", env=secret)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "calling mypkg.steps:make" in shown.stdout and "(log missing)" not in shown.stdout, shown.stdout


@pytest.fixture
def maven():
    """A Maven repository on 127.0.0.1 holding the real s3a jars (those this machine fetched for CI)."""
    version = s3_jars.hadoop_version()
    real = s3_jars.ensure(version, s3_jars.repository_url(), s3_jars.cache_root())
    with serving(repository_of(real, version)) as server:
        server.jars = real
        yield server


@pytest.mark.parametrize("s3", ["versitygw"], indirect=True)
def test_the_weekly_retrain_on_s3_from_fresh_machines_skips_everything_then_runs_only_a_new_week(s3, maven, tmp_path):
    """The example, its workdir in the store: run; a new clone with no local state skips every stage;
    after a new delivery, another new clone processes only the new partitions. It is the test of Spark's
    incremental carry-over through s3a and of the example's `kind: files` outputs in a store; on
    versitygw, the server that is not the reference: moto's own ways are what the other tests of this
    folder meet, and Spark writing through s3a to moto is in tests/engines/test_backends.py.
    The first run starts with no s3a jars on the machine: it fetches them itself (from a Maven repository
    served here, holding the real jars), before its engines start, and says so on the terminal."""
    repo = Path(__file__).resolve().parents[2]
    bucket = s3.bucket("retrain-workdir")
    version, real = s3_jars.hadoop_version(), maven.jars
    jars = tmp_path / "jars"  # empty: this machine has never fetched them

    def clone(name: str) -> Path:
        project = tmp_path / name
        for part in ("configs", "stages", "scripts"):
            shutil.copytree(repo / part, project / part, ignore=shutil.ignore_patterns("__pycache__"))
        if (tmp_path / "data").exists():
            shutil.copytree(tmp_path / "data", project / "data")
        return project

    def retrain(project: Path, *args: str) -> subprocess.CompletedProcess:
        environ = {**os.environ, **s3.env(), "HYBRIDFLOW_CACHE": str(project / ".cache"),
                   "HYBRIDFLOW_WORKDIR": f"s3://{bucket}/team", s3_jars.CACHE_VARIABLE: str(jars),
                   s3_jars.REPOSITORY_VARIABLE: maven.url}
        environ.pop(s3_jars.FOLDER_VARIABLE, None)
        return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "configs/weekly_retrain.yaml",
                               "--param", "num_samples=2", *args], cwd=project, env=environ, capture_output=True,
                              text=True, timeout=900)

    first = clone("clone-1")
    subprocess.run([sys.executable, "scripts/generate_retrain_data.py", "--customers", "600", "--weeks", "8"],
                   cwd=first, check=True, capture_output=True)
    done = retrain(first)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (first / ".hybridflow").exists()
    assert re.search(r"fetching .*hadoop-aws.* from 127\.0\.0\.1:\d+", done.stderr), done.stderr
    assert sorted(jar.name for jar in (jars / f"hadoop-{version}").glob("*.jar")) == sorted(j.name for j in real)
    maven.requests.clear()
    shutil.copytree(first / "data", tmp_path / "data")  # the raw data a new clone finds (it is the user's)

    second = clone("clone-2")
    again = retrain(second)
    assert again.returncode == 0, again.stdout + again.stderr
    assert set(statuses(again.stdout).values()) == {"skipped"}, again.stdout

    subprocess.run([sys.executable, "scripts/generate_retrain_data.py", "--customers", "600", "--append-week",
                    "--out", str(tmp_path / "data" / "retrain")], cwd=second, check=True, capture_output=True)
    third = clone("clone-3")
    week = retrain(third, "--only", "etl")
    assert week.returncode == 0, week.stdout + week.stderr
    assert maven.requests == []  # fetched once for the machine
    logs = subprocess.run([sys.executable, "-m", "hybridflow.cli", "logs", "last", "etl", "-f",
                           "configs/weekly_retrain.yaml"], cwd=third, capture_output=True, text=True,
                          env={**os.environ, **s3.env(), "HYBRIDFLOW_CACHE": str(third / ".cache"),
                               "HYBRIDFLOW_WORKDIR": f"s3://{bucket}/team"})
    assert re.search(r"output customer_weeks: 2 partitions written, [1-9]\d* carried over, 0 removed", logs.stdout), \
        logs.stdout + logs.stderr
