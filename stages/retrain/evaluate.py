"""Evaluation in-process: the new model against the current champion on the held-out test weeks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd


def _predict(model_dir: Path, frame: pd.DataFrame) -> np.ndarray:
    import xgboost as xgb

    info = json.loads((model_dir / "model_info.json").read_text())
    booster = xgb.Booster()
    booster.load_model(str(model_dir / "model.json"))
    return booster.predict(xgb.DMatrix(frame[info["features"]].astype("float64")))


def _metrics(y: np.ndarray, p: np.ndarray) -> dict:
    from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

    return {"roc_auc": float(roc_auc_score(y, p)), "pr_auc": float(average_precision_score(y, p)),
            "log_loss": float(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7))), "rows": int(len(y)),
            "positives": int(y.sum())}


def decimals_apart(a: float, b: float, least: int = 4) -> int:
    """How many decimals show `a` and `b` apart: at least `least`, more while they still read the same."""
    for decimals in range(least, 18):
        if f"{a:.{decimals}f}" != f"{b:.{decimals}f}":
            return decimals
    return least  # equal


def decision_reason(challenger: float, champion: float | None) -> str:
    """Why the challenger was promoted or not, with enough digits to see the difference."""
    if champion is None:
        return "no champion yet"
    decimals = decimals_apart(challenger, champion)
    difference = f"{challenger - champion:+.{decimals}f}" if challenger != champion else "equal"
    verdict = "promoted" if challenger > champion else "not higher, the champion is kept"
    return (f"challenger ROC AUC {challenger:.{decimals}f} vs champion {champion:.{decimals}f} "
            f"({difference}): {verdict}")


def evaluate(customer_features: pd.DataFrame, model: Path, ctx) -> None:
    """Promote the challenger only if its test ROC AUC beats the champion's on the same test weeks."""
    test = customer_features[customer_features["split"] == "test"]
    y = test["churned"].astype("int64").to_numpy()
    challenger = _metrics(y, _predict(model, test))
    previous = ctx.previous_output("champion")
    champion = _metrics(y, _predict(previous, test)) if previous else None
    promote = champion is None or challenger["roc_auc"] > champion["roc_auc"]
    reason = decision_reason(challenger["roc_auc"], champion["roc_auc"] if champion else None)
    decision = {"run_id": ctx.run_id, "promoted": promote, "challenger": challenger, "champion": champion,
                "reason": reason}
    ctx.log.info("decision: %s", decision["reason"])
    # seen in MLflow when the pipeline has `mlflow:` (nothing is sent without it)
    ctx.mlflow.log_metrics({f"challenger_{k}": v for k, v in challenger.items()})
    if champion:
        ctx.mlflow.log_metrics({f"champion_{k}": v for k, v in champion.items()})
    ctx.mlflow.set_tag("decision", reason)
    if promote:  # the registered model's version made from the model read here becomes the champion
        ctx.mlflow.set_model_alias("champion")
    winner = model if promote else previous
    out = ctx.output_path("champion")
    for name in ("model.json", "model_info.json"):
        shutil.copyfile(winner / name, out / name)
    (out / "decision.json").write_text(json.dumps(decision, indent=2))
    report = ctx.output_path("evaluation")
    (report / "metrics.json").write_text(json.dumps(decision, indent=2))
    _plots(report, model, test, y)


def _plots(out: Path, model: Path, test: pd.DataFrame, y: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import xgboost as xgb
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(y, _predict(model, test))
    booster = xgb.Booster()
    booster.load_model(str(model / "model.json"))
    gain = booster.get_score(importance_type="gain")
    names = json.loads((model / "model_info.json").read_text())["features"]
    importance = sorted(((gain.get(f"f{i}", gain.get(n, 0.0)), n) for i, n in enumerate(names)), reverse=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(fpr, tpr, label="challenger")
    left.plot([0, 1], [0, 1], linestyle="--", color="grey")
    left.set(title="ROC curve, test weeks", xlabel="false positive rate", ylabel="true positive rate")
    right.barh([n for _, n in importance][::-1], [g for g, _ in importance][::-1])
    right.set(title="feature importance (gain)")
    figure.tight_layout()
    figure.savefig(out / "evaluation.png", dpi=110)
    plt.close(figure)
