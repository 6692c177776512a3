"""Training on Dask: XGBoost fitted with the tuned parameters on the training and validation weeks."""

from __future__ import annotations

import json

from .features import FEATURES


def train(customer_features, best_params, ctx):
    import xgboost.dask  # noqa: F401  (the Dask interface is a submodule)
    import xgboost as xgb

    params = json.loads(best_params["params"].compute().iloc[0])
    rows = customer_features[customer_features["split"].isin(["train", "valid"])]
    # persisted once: Dask may plan a column subset of a parquet read with fewer partitions, and
    # XGBoost needs features and labels partitioned alike
    rows = rows[FEATURES + ["churned"]].persist()
    model = xgb.dask.DaskXGBClassifier(**params, tree_method="hist", eval_metric="auc")
    model.client = ctx.dask
    model.fit(rows[FEATURES].astype("float64"), rows["churned"].astype("int64"))
    out = ctx.output_path("model")
    model.get_booster().save_model(str(out / "model.json"))
    (out / "model_info.json").write_text(json.dumps({"features": FEATURES, "params": params,
                                                     "trained_by_run": ctx.run_id}, indent=2))
