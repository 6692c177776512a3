"""ETL on Spark: raw weekly deliveries -> per customer and week, the activity each delivery brought.

The stage is incremental: hybridflow calls it with only the deliveries (delivery_week partitions)
that are new or changed, and keeps its output for the others. So everything here is computed
within one delivery: duplicates are dropped per delivery, and the customer-week aggregates of a
delivery are partial; a late event counts in the week it happened (from ts), in the row of the
delivery that brought it. The features stage adds the deliveries of a customer-week together.
"""

from __future__ import annotations


def weekly_etl(raw_events, customers, ctx):
    """Deduplicate, drop (and count) malformed rows, join customers, aggregate per customer-week and
    delivery. active_day_mask has bit d set when the customer was active on weekday d (0 = Sunday):
    masks of two deliveries combine with OR, where day counts would count a day twice."""
    from pyspark.sql import functions as F

    # coalesce: amount is NULL for non-purchases, and NULL < 0 is NULL, which would drop the row
    malformed = F.col("customer_id").isNull() | F.coalesce(F.col("amount") < 0, F.lit(False))
    quality = raw_events.groupBy("delivery_week").agg(
        F.count("*").alias("raw_rows"),
        (F.count("*") - F.countDistinct("event_id")).alias("duplicate_rows"),
        F.sum(malformed.cast("long")).alias("malformed_rows"),
    )
    clean = raw_events.dropDuplicates(["delivery_week", "event_id"]).where(~malformed)
    is_type = lambda kind: F.sum((F.col("event_type") == kind).cast("long"))  # noqa: E731
    weekly = (
        clean.withColumn("week", F.to_date(F.date_trunc("week", "ts")))
        .groupBy("customer_id", "week", "delivery_week")
        .agg(F.count("*").alias("events"), is_type("view").alias("views"), is_type("login").alias("logins"),
             is_type("purchase").alias("purchases"), is_type("support_ticket").alias("tickets"),
             F.coalesce(F.sum("amount"), F.lit(0).cast("decimal(20,2)")).alias("revenue"),
             F.expr("bit_or(shiftleft(1, dayofweek(ts) - 1))").alias("active_day_mask"))
    )
    joined = weekly.join(customers, "customer_id", "inner")
    # no count() for the log: each would compute the whole plan once more (the manifests have the rows)
    return {"customer_weeks": joined, "etl_quality": quality}
