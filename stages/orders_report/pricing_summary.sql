-- TPC-H Q1, the pricing summary report: what was billed, shipped and returned up to a ship date.
SELECT
    l_returnflag AS returnflag,
    l_linestatus AS linestatus,
    CAST(SUM(l_quantity) AS DECIMAL(18, 2)) AS sum_qty,
    CAST(SUM(l_extendedprice) AS DECIMAL(18, 2)) AS sum_base_price,
    CAST(SUM(l_extendedprice * (1 - l_discount)) AS DECIMAL(18, 4)) AS sum_disc_price,
    CAST(SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS DECIMAL(18, 6)) AS sum_charge,
    CAST(AVG(l_quantity) AS DECIMAL(18, 4)) AS avg_qty,
    CAST(AVG(l_extendedprice) AS DECIMAL(18, 4)) AS avg_price,
    CAST(AVG(l_discount) AS DECIMAL(18, 4)) AS avg_disc,
    COUNT(*) AS count_order
FROM lineitem
WHERE l_shipdate <= CAST(:ship_date AS DATE)
GROUP BY l_returnflag, l_linestatus
ORDER BY l_returnflag, l_linestatus
