"""The example pipeline python -> spark -> dask -> ray -> python, run from the CLI as a user would:
its results checked against plain pandas, and no engine process left behind after a run that
succeeds, fails or is interrupted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog
from tests.support.engines import assert_nothing_left
from tests.support.listeners import ListenerSampler
from tests.support.projects import last_run_record

REPO = Path(__file__).resolve().parents[2]

# A whole run starts Spark, Dask and Ray: on a loaded 2-core machine it may take minutes, and the
# waits below (up to 480 s for a run) must end before pytest's global timeout does.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def example(tmp_path) -> Path:
    for part in ("configs", "stages", "data"):
        shutil.copytree(REPO / part, tmp_path / part)
    return tmp_path


def start_run(example: Path, *args: str) -> tuple[subprocess.Popen, str]:
    marker = f"HYBRIDFLOW_TEST_RUN={uuid.uuid4().hex}"
    env = {**os.environ, "HYBRIDFLOW_TEST_RUN": marker.split("=")[1]}
    process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", "configs/three_engines.yaml", *args],
                               cwd=example, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, marker


def finish(run: subprocess.Popen, seconds: float, what: str) -> str:
    """The run's output once it has ended; a failure naming `what` if it has not within `seconds`."""
    try:
        output, _ = run.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        run.kill()
        output, _ = run.communicate()
        pytest.fail(f"{what} did not end within {seconds} s; its output:\n{output}")
    return output


def dataset(example: Path, name: str) -> pd.DataFrame:
    version = Catalog(example / ".hybridflow" / "three-engines").current(name)
    return read_arrow(version.source()).to_pandas()


def expected_customer_weeks(csv: Path) -> pd.DataFrame:
    raw = pd.read_csv(csv, dtype={"customer_id": "Int64"})
    raw["ts"] = pd.to_datetime(raw["ts"], utc=True)
    raw["amount"] = raw["amount"].map(lambda v: Decimal(str(v)) if pd.notna(v) else None)
    clean = raw.sort_values("ts").drop_duplicates("event_id")
    clean = clean[clean["customer_id"].notna() & clean["amount"].map(lambda a: a is None or a >= 0)]
    clean = clean.assign(week=(clean["ts"].dt.floor("D") - pd.to_timedelta(clean["ts"].dt.day_of_week, "D")).dt.date)
    grouped = clean.groupby(["customer_id", "week"])
    return pd.DataFrame({
        "events": grouped.size(),
        "purchases": grouped["event_type"].agg(lambda s: int((s == "purchase").sum())),
        "tickets": grouped["event_type"].agg(lambda s: int((s == "support_ticket").sum())),
        # SQL's SUM: NULL when every amount is NULL
        "revenue": grouped["amount"].agg(lambda s: sum(a for a in s if a is not None) if s.notna().any() else None),
    }).reset_index()


def test_three_engine_pipeline_gives_the_pandas_answer_and_leaves_no_process(example):
    run, marker = start_run(example)
    with ListenerSampler(run.pid) as listeners:  # every stage's processes: loopback only, no dashboards
        output = finish(run, 480, "the three-engine run")
    assert run.returncode == 0, output
    for engine in ("spark", "dask", "ray"):
        assert f"engine {engine} started in" in output
    assert_nothing_left(marker, 60)
    names = " ".join(name for found in listeners.seen.values() for name in found)
    assert "java" in names and "ray" in names, listeners.seen  # the engines' own processes were sampled
    assert listeners.problems() == []

    actual = dataset(example, "customer_weeks").sort_values(["customer_id", "week"]).reset_index(drop=True)
    expected = expected_customer_weeks(example / "data/sample/events.csv")
    expected = expected.sort_values(["customer_id", "week"]).reset_index(drop=True)
    assert actual["customer_id"].tolist() == [int(c) for c in expected["customer_id"]]
    assert actual["week"].tolist() == expected["week"].tolist()
    for column in ("events", "purchases", "tickets"):
        assert actual[column].tolist() == expected[column].tolist(), column
    assert actual["revenue"].tolist() == expected["revenue"].tolist()

    scores = dataset(example, "scores").sort_values(["customer_id", "week"]).reset_index(drop=True)
    tickets_total = expected.groupby("customer_id")["tickets"].cumsum()
    rolling = expected.groupby("customer_id")["events"].transform(lambda s: s.rolling(2, min_periods=1).mean())
    assert scores["risk"].round(9).tolist() == (1.5 * tickets_total - rolling).round(9).tolist()
    report = json.loads(next((example / ".hybridflow/three-engines/datasets/risk_report/versions").glob("*/risk.json"))
                        .read_text())
    assert report["week"] == str(expected["week"].max()) and len(report["riskiest"]) == 5

    # the engine work each phase ran, as `show` lists it: the ETL's lazy SQL runs no Spark job until it
    # is written; the Dask stage's publish is two graphs (the result persisted, counted and sampled
    # to size its files; then written), the Ray stage's three executions; the python stages
    # run no engine work and record none
    _, stages = last_run_record(example / ".hybridflow")
    work = {name: json.loads(stage["engine_work"] or "null") for name, stage in stages.items()}
    assert work["etl"]["read"] == 0 and work["etl"]["call"] == 0 and work["etl"]["publish"] >= 1, work
    assert work["features"] == {"read": 0, "call": 0, "publish": 2}, work
    assert work["score"] == {"read": 0, "call": 0, "publish": 3}, work  # Ray Data: materialize, sample, write
    assert work["load"] is None and work["report"] is None, work
    shown = subprocess.run([sys.executable, "-m", "hybridflow.cli", "show", "last", "--workdir", ".hybridflow"],
                           cwd=example, capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"})
    assert "engine work" in shown.stdout and "0 · 0 · 3" in shown.stdout, shown.stdout + shown.stderr


def test_failed_run_reports_the_users_error_and_leaves_no_process(example):
    run, marker = start_run(example, "--param", "window=0")
    output = finish(run, 480, "the run whose features stage fails")
    assert run.returncode == 1, output
    assert "features failed: ValueError:" in output and "stages/three_engines.py:" in output
    assert "resume with: hybridflow run configs/three_engines.yaml --resume" in output
    assert_nothing_left(marker, 60)


def test_interrupted_run_stops_every_engine(example):
    run, marker = start_run(example)
    logs = example / ".hybridflow/three-engines/runs"
    deadline = time.monotonic() + 420  # most of a whole run (see the 480 s above) comes before it
    while not list(logs.glob("*/logs/score.log")):
        assert run.poll() is None, f"the run ended before its ray stage started: {run.communicate()[0]}"
        assert time.monotonic() < deadline, "the ray stage did not start within 420 s"
        time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    output = finish(run, 180, "the run after SIGINT (it should stop its engines and exit)")
    assert run.returncode == 130, output
    record, _ = last_run_record(example / ".hybridflow")
    assert record["status"] == "interrupted"
    assert_nothing_left(marker, 60)
