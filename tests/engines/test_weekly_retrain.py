"""The weekly retrain end to end, from the CLI, on a small generated dataset: Spark ETL checked
against pandas, model quality the planted signal supports, tuning no worse than the defaults, and
the champion/challenger decision over two runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog
from tests.support.listeners import run_sampled
from tests.support.projects import last_run_record

REPO = Path(__file__).resolve().parents[2]
LISTENERS: dict = {}  # project -> the ListenerSampler of its first run

# Each run of the retrain starts Spark, Dask and Ray (cli() allows one 900 s): pytest's global timeout
# must not end a test, or the module fixture's first run, before the waits below do.
pytestmark = pytest.mark.timeout(1200)


def cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "configs/weekly_retrain.yaml", *args],
                          cwd=project, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def retrained(tmp_path_factory):
    project = tmp_path_factory.mktemp("retrain")
    for part in ("configs", "stages", "scripts"):
        shutil.copytree(REPO / part, project / part)
    subprocess.run([sys.executable, "scripts/generate_retrain_data.py", "--customers", "1200", "--weeks", "12"],
                   cwd=project, check=True, capture_output=True)
    done, listeners = run_sampled([sys.executable, "-m", "hybridflow.cli", "run", "configs/weekly_retrain.yaml",
                                   "--param", "num_samples=4"], timeout=900, cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    LISTENERS[project] = listeners  # what every stage's processes listened on, for the test below
    return project


def test_every_listener_of_the_example_is_on_loopback(retrained):
    # Spark, Dask (with XGBoost), Ray Tune: all embedded, so nothing may listen beyond this machine
    listeners = LISTENERS[retrained]
    assert listeners.seen, "the sampler saw no listener at all: it did not sample the run"
    assert listeners.problems() == []


def dataset(project: Path, name: str) -> pd.DataFrame:
    return read_arrow(Catalog(project / ".hybridflow" / "weekly-retrain").current(name).source()).to_pandas()


def files(project: Path, name: str) -> Path:
    return Catalog(project / ".hybridflow" / "weekly-retrain").current(name).directory


def test_etl_equals_an_independent_pandas_computation(retrained):
    raw = pads.dataset(retrained / "data/retrain/events", format="parquet", partitioning="hive").to_table().to_pandas()
    quality = dataset(retrained, "etl_quality")
    assert len(quality) == raw["delivery_week"].nunique()  # one row per delivery
    quality = quality[["raw_rows", "duplicate_rows", "malformed_rows"]].sum()
    malformed = raw["customer_id"].isna() | (raw["amount"].map(lambda a: a is not None and a < 0))
    assert quality["raw_rows"] == len(raw)
    assert quality["duplicate_rows"] == len(raw) - raw["event_id"].nunique()
    assert quality["malformed_rows"] == int(malformed.sum())
    clean = raw.drop_duplicates("event_id")
    clean = clean[~(clean["customer_id"].isna() | clean["amount"].map(lambda a: a is not None and a < 0))]
    ts = pd.to_datetime(clean["ts"], utc=True)
    clean = clean.assign(week=(ts.dt.floor("D") - pd.to_timedelta(ts.dt.day_of_week, "D")).dt.date,
                         day=ts.dt.date)
    grouped = clean.groupby(["customer_id", "week"])
    expected = pd.DataFrame({
        "events": grouped.size(),
        "tickets": grouped["event_type"].agg(lambda s: int((s == "support_ticket").sum())),
        "purchases": grouped["event_type"].agg(lambda s: int((s == "purchase").sum())),
        "revenue": grouped["amount"].agg(lambda s: sum(a for a in s if a is not None)),
        "active_days": grouped["day"].nunique(),
    }).reset_index().sort_values(["customer_id", "week"]).reset_index(drop=True)
    actual = combined_customer_weeks(dataset(retrained, "customer_weeks"))
    assert actual["customer_id"].tolist() == expected["customer_id"].astype(int).tolist()
    assert actual["week"].tolist() == expected["week"].tolist()
    for column in ("events", "tickets", "purchases", "active_days"):
        assert actual[column].tolist() == expected[column].tolist(), column
    assert actual["revenue"].tolist() == [type(actual["revenue"][0])(str(v)) for v in expected["revenue"]]
    assert set(actual["plan"]) == {"free", "pro", "team"}  # joined with customers


def combined_customer_weeks(rows: pd.DataFrame) -> pd.DataFrame:
    """The ETL's per-delivery rows added up per customer-week (as the features stage does)."""
    grouped = rows.groupby(["customer_id", "week"])
    combined = grouped[["events", "tickets", "purchases", "revenue"]].sum()
    combined["active_days"] = grouped["active_day_mask"].agg(lambda m: bin(int(np.bitwise_or.reduce(m))).count("1"))
    combined["plan"] = grouped["plan"].first()
    return combined.reset_index().sort_values(["customer_id", "week"]).reset_index(drop=True)


def test_model_learns_the_planted_signal_and_tuning_beats_the_defaults(retrained):
    metrics = json.loads((files(retrained, "evaluation") / "metrics.json").read_text())
    assert metrics["challenger"]["roc_auc"] > 0.85, metrics
    assert (files(retrained, "evaluation") / "evaluation.png").stat().st_size > 10_000
    trials = dataset(retrained, "trials")
    best = dataset(retrained, "best_params").iloc[0]
    assert len(trials) == 4 and trials["is_default"].sum() == 1
    default_auc = trials.loc[trials["is_default"], "valid_auc"].iloc[0]
    assert best["valid_auc"] == trials["valid_auc"].max() >= default_auc

    # the same comparison on the held-out test weeks, with an independently trained default model
    from sklearn.metrics import roc_auc_score
    from xgboost import XGBClassifier

    from stages.retrain.features import FEATURES

    frame = dataset(retrained, "customer_features")
    fit = frame[frame["split"].isin(["train", "valid"])]
    test = frame[frame["split"] == "test"]
    default = XGBClassifier(n_jobs=1, tree_method="hist").fit(fit[FEATURES], fit["churned"].astype(int))
    default_test_auc = roc_auc_score(test["churned"], default.predict_proba(test[FEATURES])[:, 1])
    assert metrics["challenger"]["roc_auc"] >= default_test_auc - 0.01, (metrics, default_test_auc)


def test_champion_is_kept_unless_the_challenger_is_better(retrained):
    first = json.loads((files(retrained, "champion") / "decision.json").read_text())
    assert first["promoted"] and first["champion"] is None and first["reason"] == "no champion yet"
    model = (files(retrained, "model") / "model.json").read_bytes()
    assert (files(retrained, "champion") / "model.json").read_bytes() == model

    # Evaluate again: the challenger is now the champion's own model, so it is not better: kept.
    done = cli(retrained, "--param", "num_samples=4", "--only", "evaluate", "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    second = json.loads((files(retrained, "champion") / "decision.json").read_text())
    assert second["promoted"] is False
    assert np.isclose(second["champion"]["roc_auc"], first["challenger"]["roc_auc"])
    assert second["challenger"]["roc_auc"] == second["champion"]["roc_auc"]
    assert (files(retrained, "champion") / "model.json").read_bytes() == model

    # Tune, train and evaluate again: the tuning is seeded (`seed`), so the same trials, the same model,
    # and a challenger that ties with the champion.
    trials = dataset(retrained, "trials")
    again = cli(retrained, "--param", "num_samples=4", "--from", "tune", "--force")
    assert again.returncode == 0, again.stdout + again.stderr
    pd.testing.assert_frame_equal(dataset(retrained, "trials"), trials)
    assert (files(retrained, "model") / "model.json").read_bytes() == model
    third = json.loads((files(retrained, "champion") / "decision.json").read_text())
    assert third["promoted"] is False, third
    assert third["reason"].endswith("(equal): not higher, the champion is kept"), third["reason"]
    assert (files(retrained, "champion") / "model.json").read_bytes() == model


def test_an_unchanged_second_run_skips_every_stage_and_starts_no_engine(retrained):
    plan = subprocess.run([sys.executable, "-m", "hybridflow.cli", "plan", "configs/weekly_retrain.yaml",
                           "--param", "num_samples=4"], cwd=retrained, capture_output=True, text=True, timeout=240)
    assert "0 of 5 stages to run, 5 up to date" in plan.stdout, plan.stdout + plan.stderr
    # the fixture's run used --param num_samples=4: only the stages that can see num_samples change
    changed = subprocess.run([sys.executable, "-m", "hybridflow.cli", "plan", "configs/weekly_retrain.yaml",
                              "--param", "num_samples=5"], cwd=retrained, capture_output=True, text=True, timeout=240)
    assert "params.num_samples changed 4 -> 5" in changed.stdout, changed.stdout
    assert "3 of 5 stages to run, 2 up to date" in changed.stdout, changed.stdout  # tune, then what it feeds
    done = cli(retrained, "--param", "num_samples=4")
    assert done.returncode == 0, done.stdout + done.stderr
    run, stages = last_run_record(retrained / ".hybridflow")
    assert {s["status"] for s in stages.values()} == {"skipped"}, stages
    assert all(s["skip_reason"].startswith("unchanged since run ") for s in stages.values())
    assert all(s["engine_start"] is None for s in stages.values())
    assert "engine" not in done.stderr and not (Path(run["run_dir"]) / "logs" / "engines.log").exists()


def test_a_new_delivery_is_processed_alone_and_equals_a_full_rerun(retrained, tmp_path):
    catalog = Catalog(retrained / ".hybridflow" / "weekly-retrain")
    before = catalog.current("customer_weeks")
    subprocess.run([sys.executable, "scripts/generate_retrain_data.py", "--customers", "1200", "--append-week"],
                   cwd=retrained, check=True, capture_output=True)
    done = cli(retrained, "--only", "etl")
    assert done.returncode == 0, done.stdout + done.stderr
    _, stages = last_run_record(retrained / ".hybridflow")
    # the new week's events land in the partition of the week before (which held only late events
    # until now) and its late events in a new one: exactly those two are processed
    assert stages["etl"]["status"] == "done"
    assert stages["etl"]["skip_reason"] == ("2 of 14 partitions of raw_events new or changed "
                                            "(delivery_week=2026-11-23, delivery_week=2026-11-30)")
    log = Path(stages["etl"]["log_path"]).read_text()
    assert "output customer_weeks: 2 partitions written, 12 carried over, 0 removed" in log
    after = catalog.current("customer_weeks")
    kept = {f["path"]: f["sha256"] for f in before.manifest["files"] if "2026-11-23" not in f["path"]}
    now = {f["path"]: f["sha256"] for f in after.manifest["files"]}
    assert all(now.get(path) == digest for path, digest in kept.items())  # carried over untouched
    assert any("delivery_week=2026-11-30" in path for path in now)

    # the same raw data processed from scratch in a fresh project gives the same tables
    fresh = tmp_path / "fresh"
    for part in ("configs", "stages", "scripts", "data"):
        shutil.copytree(retrained / part, fresh / part)
    scratch = cli(fresh, "--only", "etl")
    assert scratch.returncode == 0, scratch.stdout + scratch.stderr
    for name in ("customer_weeks", "etl_quality"):
        incremental, full = dataset(retrained, name), dataset(fresh, name)
        keys = list(incremental.columns)
        assert len(incremental) == len(full) > 0
        pd.testing.assert_frame_equal(incremental.sort_values(keys).reset_index(drop=True),
                                      full[keys].sort_values(keys).reset_index(drop=True))


def test_a_backfill_of_two_deliveries_reprocesses_exactly_them(retrained):
    catalog = Catalog(retrained / ".hybridflow" / "weekly-retrain")
    before = catalog.current("customer_weeks").manifest["files"]
    weeks = sorted({f["path"].split("/")[0].removeprefix("delivery_week=") for f in before if "/" in f["path"]})
    chosen = weeks[3:5]
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "backfill", "configs/weekly_retrain.yaml",
                           "--partitions", f"delivery_week={chosen[0]}..{chosen[1]}", "--to", "etl"],
                          cwd=retrained, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    _, stages = last_run_record(retrained / ".hybridflow")
    assert stages["etl"]["skip_reason"] == ("backfill of 2 partition(s) of raw_events "
                                            f"(delivery_week={chosen[0]}, delivery_week={chosen[1]})")
    after = catalog.current("customer_weeks").manifest["files"]

    def by_week(files, inside: bool) -> dict[str, str]:
        return {f["path"]: f["sha256"] for f in files
                if "/" in f["path"] and (f["path"].split("/")[0].split("=")[1] in chosen) == inside}

    assert by_week(after, inside=False) == by_week(before, inside=False)  # every other delivery: the same files
    assert by_week(after, inside=True) and not set(by_week(after, inside=True)) & set(by_week(before, inside=True))
