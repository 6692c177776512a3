"""External inputs in object storage (s3:// paths), read by every engine from a real S3 server (moto in
server mode on 127.0.0.1), reached through the standard AWS variables only: the same values as the
data put there, skipped while unchanged (content named by ETags), incremental over new partitions,
and one line with a documented exit code when the bucket, the credentials or the server is wrong."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pyarrow as pa
import pytest

import hybridflow
from tests.support.projects import last_run_record
from tests.support.s3server import S3Endpoint
from tests.support.s3stores import every_cloud, every_store

pytestmark = pytest.mark.timeout(900)

ENGINES = ("python", "dask", "ray", "duckdb", "polars")
EVENTS = pa.schema([("customer", pa.string()), ("amount", pa.float64()), ("ts", pa.timestamp("us")),
                    ("note", pa.string())])
WEEKS = (dt.date(2026, 11, 2), dt.date(2026, 11, 9))


S3_BUCKETS = ("lake",)  # made when the s3 fixture (conftest.py) starts its server


def week_rows(week: dt.date) -> pa.Table:
    n = 5
    return pa.table({"customer": [f"c{i % 3}" for i in range(n)],
                     "amount": [float(i) + week.day / 100 for i in range(n)],
                     "ts": [dt.datetime.combine(week, dt.time(i, 30)) for i in range(n)],
                     "note": [None if i == 2 else f"ünï {i}" for i in range(n)]}, schema=EVENTS)


def put_week(s3: S3Endpoint, prefix: str, week: dt.date) -> None:
    s3.put_table(f"{prefix}/week={week.isoformat()}/part-0.parquet", week_rows(week))


STAGES = '''
import ray


def on_pandas(events, customers):
    return events.merge(customers, on="customer")


def on_dask(events, customers):
    return events.merge(customers, on="customer")


def on_ray(events, customers):
    tiers = {row["customer"]: row["tier"] for row in customers.take_all()}
    return events.map_batches(lambda b: b.assign(tier=b["customer"].map(tiers)), batch_format="pandas")


def on_duckdb(events, customers):
    return events.join(customers, "customer")


def on_polars(events, customers):
    return events.join(customers, on="customer")


def on_spark(events, customers):
    return events.join(customers, "customer")


def weekly(events):
    return events.groupby("week", as_index=False).agg(total=("amount", "sum"), rows=("amount", "size"))
'''


def pipeline_text(prefix: str, engines=ENGINES, scheme: str = "s3") -> str:
    stages = "\n".join(f"""  {engine}_join:
    run: mypkg.steps:{'on_pandas' if engine == 'python' else 'on_' + engine}
    backend: {engine}
    inputs: [events, customers]
    outputs: [joined_{engine}]""" for engine in engines)
    return f"""
name: s3in
workdir: .hf
backends:
  spark: {{master: "local[1]", conf: {{spark.sql.shuffle.partitions: 2}}}}
  dask: {{n_workers: 1, threads_per_worker: 1}}
  ray: {{num_cpus: 1}}
datasets:
  events:
    path: {scheme}://{prefix}/events
    partition_by: [week]
    schema: {{customer: string, amount: double, ts: "timestamp[us]", note: string, week: date32}}
  customers:
    path: {scheme}://{prefix}/customers.csv
    format: csv
    schema: {{customer: string, tier: int64}}
  weekly_totals:
    partition_by: [week]
stages:
{stages}
  weekly:
    run: mypkg.steps:weekly
    inputs: [events]
    outputs: [weekly_totals]
    incremental: true
"""


def run_cli(project, s3: S3Endpoint, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, **s3.env(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", *args], cwd=project.root,
                          env=environ, capture_output=True, text=True, timeout=600)


def expected_join(weeks) -> list[dict]:
    tiers = {"c0": 1, "c1": 2, "c2": 3}
    rows = []
    for week in weeks:
        for row in week_rows(week).to_pylist():
            rows.append({**row, "week": week, "tier": tiers[row["customer"]]})
    return sorted(rows, key=lambda r: (r["week"], r["ts"]))


@every_cloud
def test_every_engine_reads_s3_inputs_skips_them_unchanged_and_processes_only_new_partitions(project, s3):
    prefix = s3.bucket("inputs-all")
    for week in WEEKS:
        put_week(s3, f"{prefix}/events", week)
    s3.put_bytes(f"{prefix}/customers.csv", b"customer,tier\nc0,1\nc1,2\nc2,3\n")
    project.stages(STAGES)
    file = project.pipeline(pipeline_text(prefix, scheme=s3.scheme))

    done = run_cli(project, s3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert s3.secret_key not in done.stdout + done.stderr
    for engine in ENGINES:
        table = hybridflow.read(file, f"joined_{engine}", engine="arrow")
        got = sorted(table.select(["customer", "amount", "ts", "note", "week", "tier"]).to_pylist(),
                     key=lambda r: (r["week"], r["ts"]))
        assert got == expected_join(WEEKS), engine
        assert table.schema.field("week").type == pa.date32(), engine
    totals = {r["week"]: r["rows"] for r in hybridflow.read(file, "weekly_totals", engine="arrow").to_pylist()}
    assert totals == {week: 5 for week in WEEKS}

    again = run_cli(project, s3)
    assert again.returncode == 0, again.stdout + again.stderr
    _, stages = last_run_record(project.root / ".hf")
    assert {s["status"] for s in stages.values()} == {"skipped"}, stages

    new_week = dt.date(2026, 11, 16)
    put_week(s3, f"{prefix}/events", new_week)
    third = run_cli(project, s3, "--only", "weekly")
    assert third.returncode == 0, third.stdout + third.stderr
    _, stages = last_run_record(project.root / ".hf")
    assert stages["weekly"]["status"] == "done"
    log = (project.root / stages["weekly"]["log_path"]).read_text()
    assert "1 partition written, 2 carried over" in log
    totals = {r["week"]: r["rows"] for r in hybridflow.read(file, "weekly_totals", engine="arrow").to_pylist()}
    assert totals == {week: 5 for week in (*WEEKS, new_week)}


def python_only(prefix: str) -> str:
    return f"""
name: s3bad
datasets:
  events:
    path: s3://{prefix}/events
    partition_by: [week]
stages:
  weekly:
    run: mypkg.steps:weekly
    inputs: [events]
    outputs: [weekly_totals]
"""


@every_store
@pytest.mark.parametrize("case", ["no bucket", "bad credentials", "server down"])
def test_a_wrong_bucket_credential_or_endpoint_is_one_line_and_a_documented_exit_code(project, s3, case):
    prefix = "inputs-bad"
    if case != "no bucket":
        if prefix not in [b["Name"] for b in s3.client().list_buckets()["Buckets"]]:
            s3.bucket(prefix)
        put_week(s3, f"{prefix}/events", WEEKS[0])
    project.stages(STAGES)
    project.pipeline(python_only(prefix if case != "no bucket" else "no-such-bucket"))
    env = {"no bucket": {}, "bad credentials": {"AWS_SECRET_ACCESS_KEY": "wrong-secret-value"},
           "server down": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}}[case]
    done = run_cli(project, s3, env=env)
    expected = {"no bucket": 65, "bad credentials": 74, "server down": 69}[case]
    assert done.returncode == expected, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, done.stderr
    assert {"no bucket": "does not exist", "bad credentials": "refused access",
            "server down": "does not answer"}[case] in errors[0]
    assert s3.secret_key not in done.stdout + done.stderr and "wrong-secret-value" not in done.stdout + done.stderr


@every_store
def test_a_storage_section_overrides_the_variables_and_doctor_checks_each_bucket(project, s3):
    prefix = s3.bucket("inputs-storage")
    put_week(s3, f"{prefix}/events", WEEKS[0])
    project.stages(STAGES)
    project.pipeline(python_only(prefix) + f"storage: {{endpoint: '{s3.endpoint}', region: us-east-1}}\n")
    # no AWS_ENDPOINT_URL: only the storage: section says where the store is
    environ = {k: v for k, v in {**os.environ, **s3.env()}.items() if k != "AWS_ENDPOINT_URL"}
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                          env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = subprocess.run([sys.executable, "-m", "hybridflow.cli", "doctor", "pipeline.yaml"], cwd=project.root,
                             env=environ, capture_output=True, text=True, timeout=300)
    assert f"bucket {prefix} answers at {s3.endpoint}" in checked.stdout, checked.stdout + checked.stderr

    project.pipeline(python_only("no-such-bucket") + f"storage: {{endpoint: '{s3.endpoint}'}}\n")
    missing = subprocess.run([sys.executable, "-m", "hybridflow.cli", "doctor", "pipeline.yaml"], cwd=project.root,
                             env=environ, capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and "the bucket 'no-such-bucket'" in missing.stdout + missing.stderr, \
        missing.stdout + missing.stderr

    project.pipeline(python_only(prefix) + "storage: {endpoint: 'ftp://nowhere'}\n")
    invalid = subprocess.run([sys.executable, "-m", "hybridflow.cli", "validate", "pipeline.yaml"], cwd=project.root,
                             env=environ, capture_output=True, text=True, timeout=300)
    assert invalid.returncode == 78 and "pipeline.yaml:11:" in invalid.stdout + invalid.stderr, \
        invalid.stdout + invalid.stderr
