-- One row per customer: spend, order counts, and recency, with customers who never ordered kept (COALESCE).
WITH spend AS (
    SELECT
        custkey,
        SUM(revenue) AS revenue,
        COUNT(*) AS orders,
        SUM(CASE WHEN size_class = 'large' THEN 1 ELSE 0 END) AS large_orders,
        MAX(orderdate) AS last_order
    FROM order_revenue
    GROUP BY custkey
)
SELECT
    c.c_custkey AS custkey,
    c.c_nationkey AS nationkey,
    c.c_mktsegment AS segment,
    CAST(COALESCE(spend.revenue, 0) AS DECIMAL(18, 4)) AS revenue,
    CAST(COALESCE(spend.orders, 0) AS BIGINT) AS orders,
    CAST(COALESCE(spend.large_orders, 0) AS BIGINT) AS large_orders,
    spend.last_order,
    CAST(c.c_acctbal AS DECIMAL(18, 2)) AS acctbal
FROM customer c
LEFT JOIN spend ON spend.custkey = c.c_custkey
