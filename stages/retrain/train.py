"""Training on Dask: XGBoost fitted with the tuned parameters on the training and validation weeks.

Reproducible: the same data, parameters and `seed` give the same model, byte for byte. Distributed XGBoost
builds its histograms and row samples per worker, so its result depends on which rows landed on which
worker, and the Dask scheduler places partitions as it pleases: the rows are trained as one partition
(XGBoost then uses the worker that holds it, with its threads), in a fixed order."""

from __future__ import annotations

import json

from .features import FEATURES


def train(customer_features, best_params, seed: int, ctx):
    import xgboost.dask  # noqa: F401  (the Dask interface is a submodule)
    import xgboost as xgb

    params = json.loads(best_params["params"].compute().iloc[0])
    rows = customer_features[customer_features["split"].isin(["train", "valid"])]
    # one partition, persisted: the same rows in the same order on one worker on every run (partitions
    # follow the published files' order), and features and labels partitioned alike
    rows = rows[FEATURES + ["churned"]].repartition(npartitions=1).persist()
    model = xgb.dask.DaskXGBClassifier(**params, tree_method="hist", eval_metric="auc", random_state=seed)
    model.client = ctx.dask
    model.fit(rows[FEATURES].astype("float64"), rows["churned"].astype("int64"))
    out = ctx.output_path("model")
    model.get_booster().save_model(str(out / "model.json"))
    (out / "model_info.json").write_text(json.dumps({"features": FEATURES, "params": params, "seed": seed,
                                                     "trained_by_run": ctx.run_id}, indent=2))
