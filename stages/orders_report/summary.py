"""The report's last step, in-process: the top nations by revenue, as a small table."""

import pandas as pd


def top_nations(nation_totals: pd.DataFrame, top: int) -> pd.DataFrame:
    ranked = nation_totals.sort_values(["revenue_rank", "nation"]).head(top)
    return ranked[["nation", "revenue", "revenue_share"]].reset_index(drop=True)
