"""ETL on Spark: raw weekly event deliveries -> one clean row per customer and week."""

from __future__ import annotations


def weekly_etl(raw_events, customers, ctx):
    """Deduplicate, drop (and count) malformed rows, join customers, aggregate per customer-week.

    Late events are counted in the week they happened (from ts), not the week they were delivered.
    """
    from pyspark.sql import functions as F

    # coalesce: amount is NULL for non-purchases, and NULL < 0 is NULL, which would drop the row
    malformed = F.col("customer_id").isNull() | F.coalesce(F.col("amount") < 0, F.lit(False))
    events = raw_events
    quality = events.agg(
        F.count("*").alias("raw_rows"),
        (F.count("*") - F.countDistinct("event_id")).alias("duplicate_rows"),
        F.sum(malformed.cast("long")).alias("malformed_rows"),
    )
    clean = events.dropDuplicates(["event_id"]).where(~malformed).drop("week")
    is_type = lambda kind: F.sum((F.col("event_type") == kind).cast("long"))  # noqa: E731
    weekly = (
        clean.withColumn("week", F.to_date(F.date_trunc("week", "ts")))
        .groupBy("customer_id", "week")
        .agg(F.count("*").alias("events"), is_type("view").alias("views"), is_type("login").alias("logins"),
             is_type("purchase").alias("purchases"), is_type("support_ticket").alias("tickets"),
             F.coalesce(F.sum("amount"), F.lit(0).cast("decimal(20,2)")).alias("revenue"),
             F.countDistinct(F.to_date("ts")).alias("active_days"))
    )
    joined = weekly.join(customers, "customer_id", "inner")
    ctx.log.info("customer-weeks: %d", joined.count())
    return {"customer_weeks": joined, "etl_quality": quality}
