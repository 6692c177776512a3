-- Totals per nation, and each nation's share of all revenue.
SELECT
    n.n_name AS nation,
    COUNT(*) AS customers,
    CAST(SUM(f.orders) AS BIGINT) AS orders,
    CAST(SUM(f.revenue) AS DECIMAL(18, 4)) AS revenue,
    -- in doubles: Spark divides decimals as decimals (to 10 places), DuckDB as doubles
    CAST(SUM(f.revenue) AS DOUBLE) / SUM(CAST(SUM(f.revenue) AS DOUBLE)) OVER () AS revenue_share,
    CAST(RANK() OVER (ORDER BY SUM(f.revenue) DESC) AS BIGINT) AS revenue_rank
FROM customer_features f
JOIN nation n ON n.n_nationkey = f.nationkey
GROUP BY n.n_name
