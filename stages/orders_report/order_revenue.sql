-- Revenue of every order (discounts applied), its size class, and its rank among its customer's orders.
WITH lines AS (
    SELECT
        l_orderkey,
        SUM(l_extendedprice * (1 - l_discount)) AS revenue,
        COUNT(*) AS line_count,
        MAX(l_shipdate) AS last_ship
    FROM lineitem
    GROUP BY l_orderkey
)
SELECT
    o.o_orderkey AS orderkey,
    o.o_custkey AS custkey,
    o.o_orderdate AS orderdate,
    CAST(lines.revenue AS DECIMAL(18, 4)) AS revenue,
    CAST(lines.line_count AS BIGINT) AS line_count,
    CAST(EXTRACT(YEAR FROM o.o_orderdate) AS INT) AS order_year,
    lines.last_ship,
    CASE
        WHEN lines.revenue >= :large_order THEN 'large'
        WHEN lines.revenue >= :large_order / 4 THEN 'medium'
        ELSE 'small'
    END AS size_class,
    CAST(ROW_NUMBER() OVER (PARTITION BY o.o_custkey ORDER BY lines.revenue DESC, o.o_orderkey) AS BIGINT)
        AS rank_in_customer
FROM orders o
JOIN lines ON lines.l_orderkey = o.o_orderkey
