"""What sqlglot reads of a query is remembered on the machine (HYBRIDFLOW_CACHE) by the digest of the
query's text: a later process validates and fingerprints the same query without importing sqlglot,
and an edited query (even one of the same size, written in the same second) is read again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.unit.test_sql_stages import QUERY, pipeline_with_query

# validates the pipeline, fingerprints its query; prints the errors, the digest and whether sqlglot was imported
CHECK = """
import json, sys
from pathlib import Path
from hybridflow.errors import ConfigError
from hybridflow.definition import sqlstage
from hybridflow.definition.config import load_pipeline
try:
    load_pipeline(Path(sys.argv[1]))
    errors = []
except ConfigError as exc:
    errors = [str(p) for p in exc.problems if p.severity == "error"]
root = Path(sys.argv[1]).parent
print(json.dumps({"errors": errors, "digest": sqlstage.code_digest(root, "sql/q.sql"),
                  "params": sorted(sqlstage.param_names(root, "sql/q.sql")),
                  "sqlglot": "sqlglot" in sys.modules}))
"""


def check(path: Path, cache: Path) -> dict:
    env = {**os.environ, "HYBRIDFLOW_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", CHECK, str(path)], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def test_a_query_read_once_is_validated_and_fingerprinted_again_without_sqlglot(project, tmp_path):
    path = pipeline_with_query(project, QUERY)
    first = check(path, tmp_path / "cache")
    again = check(path, tmp_path / "cache")
    assert first["sqlglot"] and not again["sqlglot"]
    assert again == {**first, "sqlglot": False}
    assert first["errors"] == [] and first["params"] == ["min_amount"]
    assert all(f.stat().st_mode & 0o077 == 0 for f in (tmp_path / "cache" / "sql").rglob("*.json"))


def test_an_edited_query_of_the_same_size_is_read_again(project, tmp_path):
    path = pipeline_with_query(project, QUERY)
    before = check(path, tmp_path / "cache")
    query = project.root / "sql" / "q.sql"
    stat = query.stat()
    query.write_text(QUERY.replace("JOIN customers c", "JOIN custoMERZ c"))  # same size, another table
    os.utime(query, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    after = check(path, tmp_path / "cache")
    assert after["sqlglot"]
    assert after["digest"] != before["digest"]
    [error] = after["errors"]
    assert "table 'custoMERZ' is not an input of stage 'revenue'" in error


def test_a_query_that_does_not_parse_says_where_from_the_cache_too(project, tmp_path):
    path = pipeline_with_query(project, "SELECT customer FROM orders WHERE")
    first = check(path, tmp_path / "cache")
    again = check(path, tmp_path / "cache")
    assert not again["sqlglot"] and again["errors"] == first["errors"]
    assert "sql/q.sql:1:" in first["errors"][0] and "does not parse" in first["errors"][0]


def test_a_damaged_cache_entry_is_read_again_from_the_query(project, tmp_path):
    path = pipeline_with_query(project, QUERY.replace("JOIN customers c", "JOIN custmers c"))
    first = check(path, tmp_path / "cache")
    entries = list((tmp_path / "cache" / "sql").rglob("*.json"))
    assert entries
    for number, entry in enumerate(entries):
        entry.write_text(["{not json", '{"problem": null, "tables": [["x"]], "params": []}', "[]"][number % 3])
    again = check(path, tmp_path / "cache")
    assert again == first  # sqlglot read it again, and said the same
