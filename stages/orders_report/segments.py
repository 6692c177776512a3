"""Market segments on Dask, from the per-customer table the SQL stages built: how spend spreads."""

import dask.dataframe as dd


def segments(customer_features: dd.DataFrame, active_orders: int) -> dd.DataFrame:
    """Per market segment: customers, active customers (at least `active_orders` orders), revenue and
    its mean per active customer, and the share of customers with a large order."""
    frame = customer_features.assign(
        revenue=customer_features["revenue"].astype("float64"),
        active=(customer_features["orders"] >= active_orders).astype("int64"),
        any_large=(customer_features["large_orders"] > 0).astype("int64"),
    )
    grouped = frame.groupby("segment").agg(
        customers=("custkey", "count"), active=("active", "sum"), revenue=("revenue", "sum"),
        with_large_order=("any_large", "sum"))
    grouped = grouped.assign(revenue_per_active=grouped["revenue"] / grouped["active"].where(grouped["active"] > 0),
                             large_order_share=grouped["with_large_order"] / grouped["customers"])
    return grouped.reset_index()
