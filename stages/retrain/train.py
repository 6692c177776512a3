"""Training on Dask: XGBoost fitted with the tuned parameters on the training and validation weeks.

Reproducible: the same data, parameters and `seed` give the same model, byte for byte. Distributed XGBoost
builds its histograms and row samples per worker, so its result depends on which rows landed on which
worker, and the Dask scheduler places partitions as it pleases: the rows are trained as one partition,
in a fixed order, by one task on the worker that holds it (with its threads).

That task fits a plain XGBClassifier rather than going through xgboost.dask: XGBoost's collective
(the tracker and each worker's peer listener) binds every network interface, which XGBoost has no
setting against, and with one partition there is nothing for it to do. A stage that trains on many
workers should pass coll_cfg=xgboost.collective.Config(tracker_host_ip="127.0.0.1") and knows
its workers still listen on all interfaces while they train (see the README's engines section)."""

from __future__ import annotations

import json

from .features import FEATURES


def _fit(rows, params: dict, seed: int):
    """Runs on the Dask worker that holds the rows; returns the trained booster's JSON."""
    import xgboost as xgb

    model = xgb.XGBClassifier(**params, tree_method="hist", eval_metric="auc", random_state=seed)
    model.fit(rows[FEATURES].astype("float64"), rows["churned"].astype("int64"))
    return bytes(model.get_booster().save_raw("json"))


def train(customer_features, best_params, seed: int, ctx):
    import dask

    params = json.loads(best_params["params"].compute().iloc[0])
    rows = customer_features[customer_features["split"].isin(["train", "valid"])]
    # one partition: the same rows in the same order on every run (partitions follow the published
    # files' order)
    (part,) = rows[FEATURES + ["churned"]].repartition(npartitions=1).to_delayed()
    booster = dask.delayed(_fit)(part, params, seed).compute()
    ctx.mlflow.log_params(params)  # the tuned parameters, on the train stage's MLflow run (with mlflow:)
    out = ctx.output_path("model")
    (out / "model.json").write_bytes(booster)
    (out / "model_info.json").write_text(json.dumps({"features": FEATURES, "params": params, "seed": seed,
                                                     "trained_by_run": ctx.run_id}, indent=2))
