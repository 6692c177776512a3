"""The weekly retrain example as a user meets it, without starting an engine: its schedule installs,
its tuning and training are seeded from the file, and its promotion reason shows why."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridflow.cli import app
from hybridflow.definition.config import load_pipeline

REPO = Path(__file__).resolve().parents[2]
RETRAIN = REPO / "configs" / "weekly_retrain.yaml"
cli = CliRunner()


def test_the_weekly_retrain_installs_its_weekly_schedule(fake_crontab):
    installed = cli.invoke(app, ["schedule", "install", str(RETRAIN)])
    assert installed.exit_code == 0, installed.output
    assert "installed weekly-retrain: '0 3 * * 1' (UTC)" in installed.output
    table = fake_crontab.read_text()
    assert f'"file": "{RETRAIN}"' in table and " run --trigger cron " in table, table
    listed = cli.invoke(app, ["schedule", "list"], terminal_width=300)
    assert listed.exit_code == 0 and "weekly-retrain" in listed.output and "0 3 * * 1" in listed.output
    assert cli.invoke(app, ["schedule", "remove", "weekly-retrain"]).exit_code == 0
    assert "weekly-retrain" not in fake_crontab.read_text()


def test_tuning_and_training_are_seeded_from_the_file():
    from stages.retrain.train import train
    from stages.retrain.tune import tune_xgboost

    pipeline = load_pipeline(RETRAIN)
    seeds = {stage: pipeline.params_for(stage).get("seed") for stage in ("tune", "train")}
    assert seeds == {"tune": 7, "train": 7}
    for stage in (tune_xgboost, train):  # the seed is in their signatures, so it counts in their fingerprints
        assert "seed" in inspect.signature(stage).parameters


@pytest.mark.parametrize("challenger, champion, reason", [
    (0.91, None, "no champion yet"),
    (0.96762, 0.96758, "challenger ROC AUC 0.96762 vs champion 0.96758 (+0.00004): promoted"),
    (0.96758, 0.96762, "challenger ROC AUC 0.96758 vs champion 0.96762 (-0.00004): not higher, the champion is kept"),
    (0.9676, 0.9676, "challenger ROC AUC 0.9676 vs champion 0.9676 (equal): not higher, the champion is kept"),
    (0.8, 0.7, "challenger ROC AUC 0.8000 vs champion 0.7000 (+0.1000): promoted"),
])
def test_the_promotion_reason_shows_enough_digits_to_tell_the_models_apart(challenger, champion, reason):
    from stages.retrain.evaluate import decision_reason

    assert decision_reason(challenger, champion) == reason
