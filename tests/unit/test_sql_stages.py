"""SQL stages (`run: sql/x.sql`): what validate says of a query, what counts as a change of it, and
its params bound by name (never formatted into the text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.definition import sqlstage
from hybridflow.definition.codereach import CodeIndex
from tests.support.projects import errors_of

QUERY = """-- revenue per customer
WITH big AS (SELECT * FROM orders WHERE amount >= :min_amount)
SELECT b.customer, SUM(b.amount) AS revenue, CAST(MAX(b.amount) AS INT)::BIGINT AS top, ':not_a_param' AS s
FROM big b JOIN customers c ON c.customer = b.customer
GROUP BY b.customer
"""


def pipeline_with_query(project, query: str, *, backend: str = "spark", params: str = "{min_amount: 1}",
                        inputs: str = "[orders, customers]") -> Path:
    project.write("sql/q.sql", query)
    project.write("data/orders.csv", "customer,amount\na,1\n")
    project.write("data/customers.csv", "customer\na\n")
    return project.pipeline(f"""
        name: sql
        root: .
        datasets:
          orders: {{path: data/orders.csv, format: csv, schema: {{customer: string, amount: double}}}}
          customers: {{path: data/customers.csv, format: csv, schema: {{customer: string}}}}
        stages:
          revenue:
            backend: {backend}
            run: sql/q.sql
            inputs: {inputs}
            outputs: [revenue]
            params: {params}
    """)


def test_a_query_that_reads_its_inputs_with_its_params_is_valid(project):
    assert errors_of(pipeline_with_query(project, QUERY)) == []


def test_a_table_that_is_not_an_input_is_named_at_its_place_with_a_suggestion(project):
    path = pipeline_with_query(project, QUERY.replace("JOIN customers c", "JOIN\n  custmers c"))
    [error] = errors_of(path)
    assert "sql/q.sql:5:3: error: table 'custmers' is not an input of stage 'revenue'" in error
    assert "(did you mean 'customers'?)" in error


def test_a_param_the_stage_does_not_have_is_named_at_its_place(project):
    path = pipeline_with_query(project, QUERY, params="{min_amout: 1}")
    [error] = errors_of(path)
    assert "sql/q.sql:2:51: error: ':min_amount' is not a param of stage 'revenue'" in error


@pytest.mark.parametrize("query, expected", [
    ("SELECT customer FROM orders WHERE", "sql/q.sql:1:"),  # does not parse: where
    ("SELECT 1 FROM orders; SELECT 2 FROM orders", "one query, not 2"),
    ("DROP TABLE orders", "a query (SELECT ...), not DROP"),
])
def test_a_query_that_does_not_parse_or_is_not_one_select_is_refused(project, query, expected):
    [error] = errors_of(pipeline_with_query(project, query))
    assert expected in error


def test_a_backend_that_runs_no_sql_and_a_missing_file_are_config_errors(project):
    [error] = errors_of(pipeline_with_query(project, QUERY, backend="dask"))
    assert "runs a SQL query, which backend 'dask' cannot" in error and "spark" in error
    path = pipeline_with_query(project, QUERY)
    (project.root / "sql/q.sql").unlink()
    [error] = errors_of(path)
    assert "SQL file 'sql/q.sql' not found" in error


def test_comments_and_whitespace_do_not_change_a_querys_fingerprint_and_its_tokens_do(project):
    pipeline_with_query(project, QUERY)
    index = CodeIndex(project.root)
    before = index.reach("sql/q.sql").digests
    project.write("sql/q.sql", "/* reformatted */\n" + QUERY.replace("\n", "\n\n   ") + "-- the end\n")
    assert CodeIndex(project.root).reach("sql/q.sql").digests == before
    project.write("sql/q.sql", QUERY.replace(">= :min_amount", "> :min_amount"))
    assert CodeIndex(project.root).reach("sql/q.sql").digests != before


def test_params_are_found_by_name_and_rewritten_for_engines_that_spell_them_otherwise(tmp_path):
    query = sqlstage.parse(tmp_path / "q.sql", QUERY, "duckdb")
    assert query.param_names == ["min_amount"]
    assert [t.name for t in query.tables] == ["orders", "customers"]
    rewritten = query.with_params_as("$")
    assert "amount >= $min_amount)" in rewritten
    assert "::BIGINT" in rewritten and "':not_a_param'" in rewritten  # casts and strings untouched
