"""The calendar and backfills with the workdir in object storage (a real S3 server, moto on 127.0.0.1):
a fresh machine finds the ticks missed since another machine's last scheduled run, a hold recorded by
one machine is seen and released by another, and a backfill's chunks are run records in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.runs.test_backfill import PIPELINE as DELIVERIES
from tests.runs.test_backfill import STAGES as BACKFILL_STAGES
from tests.runs.test_backfill import WEEKS, deliver
from tests.runs.test_calendar import PIPELINE, STAGES
from tests.support.s3server import S3Endpoint

pytestmark = pytest.mark.timeout(900)
SUNDAY = datetime.fromisoformat("2026-11-22T02:00:05+00:00")
WEEK = timedelta(days=7)


def hf(project, s3: S3Endpoint, machine: Path, *args, now: datetime | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, **s3.env(), "HYBRIDFLOW_CACHE": str(machine), "COLUMNS": "250"}
    if now is not None:
        environ["HYBRIDFLOW_NOW"] = now.isoformat()
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *map(str, args)], cwd=project.root, env=environ,
                          capture_output=True, text=True, timeout=600)


def records(s3: S3Endpoint, bucket: str) -> list[dict]:
    """The run records in the store, oldest first."""
    client = s3.client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="wd/runs/").get("Contents", [])
                  if o["Key"].endswith(".json"))
    return [json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())["run"] for key in keys]


def test_machines_share_missed_ticks_and_a_hold_through_the_store(project, s3, tmp_path):
    bucket = s3.bucket("calendar-workdir")
    project.stages(STAGES)
    for week in range(8):
        day = (SUNDAY + week * WEEK).date().isoformat()
        project.write(f"in/{day}.csv", f"day,rows\n{day},{week}\n")
    path = project.pipeline(PIPELINE.format(catchup="latest", on_failure="hold") + f"workdir: s3://{bucket}/wd\n")
    first, second, third = (tmp_path / f"machine-{n}" for n in (1, 2, 3))

    assert hf(project, s3, first, "run", "--trigger", "cron", path, now=SUNDAY).returncode == 0
    done = hf(project, s3, second, "run", "--trigger", "cron", path, now=SUNDAY + 3 * WEEK)  # a new machine
    assert done.returncode == 0, done.stderr
    caught = records(s3, bucket)[-1]
    assert caught["scheduled_for"] == "2026-12-13T03:00:00+01:00"
    assert json.loads(caught["calendar"])["missed"] == ["2026-11-29T03:00:00+01:00", "2026-12-06T03:00:00+01:00"]

    (project.root / "FAIL").touch()
    assert hf(project, s3, first, "run", "--trigger", "cron", path, now=SUNDAY + 4 * WEEK).returncode != 0
    held = hf(project, s3, second, "run", "--trigger", "cron", path, now=SUNDAY + 5 * WEEK)
    assert held.returncode == 0 and "held: run" in held.stderr, held.stderr
    assert records(s3, bucket)[-1]["status"] == "held"
    assert "held: run" in hf(project, s3, third, "doctor", path).stdout
    released = hf(project, s3, third, "schedule", "release", path)
    assert released.returncode == 0, released.stderr
    (project.root / "FAIL").unlink()
    assert hf(project, s3, first, "run", "--trigger", "cron", path, now=SUNDAY + 6 * WEEK).returncode == 0
    assert [r["status"] for r in records(s3, bucket)][-3:] == ["held", "released", "success"]


def test_a_backfill_in_object_storage_keeps_other_partitions_and_resumes(project, s3, tmp_path):
    bucket = s3.bucket("backfill-workdir")
    project.stages(BACKFILL_STAGES)
    project.pipeline(DELIVERIES + f"workdir: s3://{bucket}/wd\n")
    for i, week in enumerate(WEEKS):
        deliver(project, week, list(range(i + 1)))
    machine = tmp_path / "machine"
    assert hf(project, s3, machine, "run", "pipeline.yaml").returncode == 0

    def files() -> dict[str, str]:
        client = s3.client()
        pointer = json.loads(client.get_object(Bucket=bucket, Key="wd/deliveries/CURRENT")["Body"].read())
        version = pointer["datasets"]["per_week"]
        manifest = json.loads(client.get_object(
            Bucket=bucket, Key=f"wd/deliveries/datasets/per_week/versions/{version}/_manifest.json")["Body"].read())
        return {f["path"].split("/")[0]: f["sha256"] for f in manifest["files"] if "/" in f["path"]}

    before = files()
    (project.root / "KILL").touch()
    killed = hf(project, s3, machine, "backfill", "pipeline.yaml", "--partitions", f"week={WEEKS[0]}..{WEEKS[3]}",
                "--chunk", "2")
    assert killed.returncode != 0
    (project.root / "KILL").unlink()
    resumed = hf(project, s3, tmp_path / "another-machine", "backfill", "pipeline.yaml", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    after = files()
    assert after[f"week={WEEKS[4]}"] == before[f"week={WEEKS[4]}"]
    assert all(after[f"week={w}"] != before[f"week={w}"] for w in WEEKS[:4])
    # sorted: run ids order runs by the second they started in, and two chunks can start in the same one
    chunks = sorted((json.loads(r["calendar"])["chunk"], r["status"]) for r in records(s3, bucket)
                    if r["trigger"] == "backfill")
    assert chunks == [(1, "success"), (2, "killed"), (2, "success")]
