"""SQL stages: `run: sql/orders.sql`, a query file under the pipeline root, on an engine that runs SQL
(its Engine declares `sql_dialect`).

Each input of the stage is a view named after its dataset; params are bound by name, written
`:name` in the query on every engine (the engine binds the values itself: never string formatting);
the query's result is the stage's one output. The file is read here with sqlglot's parser in the
engine's dialect, for `validate` (tables that are not inputs, unknown params, each at file:line:col)
and for fingerprints, which hash the query's tokens: comments and whitespace do not count. What sqlglot reads of a
query is remembered on this machine by the digest of its text (sqlcache.py).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..diagnostics import Problem, did_you_mean
from ..errors import ConfigError
from . import sqlcache

SUFFIX = ".sql"
UNIT = "query"  # the label of a query in fingerprints' code digests ("sql/orders.sql:query")


def is_sql(target: str) -> bool:
    return target.endswith(SUFFIX)


@dataclass(frozen=True)
class Ref:
    """A name in the query: a table read, or a param, and where it is."""

    name: str
    line: int
    col: int
    start: int  # character offsets of the reference in the text (a param's include its colon)
    end: int


@dataclass(frozen=True)
class SqlQuery:
    file: Path
    text: str
    tables: tuple[Ref, ...]  # tables the query reads (not its own CTEs)
    params: tuple[Ref, ...]  # :name references

    @property
    def param_names(self) -> list[str]:
        return list(dict.fromkeys(p.name for p in self.params))

    def with_params_as(self, prefix: str) -> str:
        """The text with each `:name` written `<prefix>name` (DuckDB's `$name`)."""
        text = self.text
        for param in sorted(self.params, key=lambda p: p.start, reverse=True):
            text = text[:param.start] + prefix + param.name + text[param.end + 1:]
        return text


def sql_function(root: Path, target: str, backend, inputs: list[str], params: dict[str, Any]) -> Callable[..., Any]:
    """A stage function (its `inputs` by name -> the query's result) that runs `target` on `backend`."""
    from .. import engines as registry

    dialect = registry.engine(backend.name).sql_dialect
    try:
        query = read_query(root, target, dialect)
    except SqlProblem as exc:
        raise ConfigError(f"{file_of(root, target)}:{exc.line}:{exc.col}: {exc.message}") from None
    missing = [name for name in query.param_names if name not in params]
    if missing:
        raise ConfigError(f"{file_of(root, target)}: ':{missing[0]}' is not a param of the stage")
    bound = {name: params[name] for name in query.param_names}

    def run_query(**given: Any) -> Any:  # the inputs, and the params the executor passes to **kwargs
        return backend.run_sql(query, {name: given[name] for name in inputs}, bound)

    return run_query


class SqlProblem(Exception):
    def __init__(self, message: str, line: int = 1, col: int = 1) -> None:
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


def file_of(root: Path, target: str) -> Path:
    return root / target


def read_query(root: Path, target: str, dialect: str) -> SqlQuery:
    """The query of `target` parsed in `dialect`; SqlProblem (with its place) when it does not parse,
    is not exactly one query, or the file cannot be read."""
    file = file_of(root, target)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SqlProblem(f"SQL file '{target}' not found under root {root}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SqlProblem(f"cannot read SQL file '{target}': {exc}") from None
    return parse(file, text, dialect)


def parse(file: Path, text: str, dialect: str) -> SqlQuery:
    """The query of `text`, parsed once per process: `validate`'s checks and the stage's run share it."""
    return _parse(file, text, dialect)


@functools.lru_cache(maxsize=256)
def _parse(file: Path, text: str, dialect: str) -> SqlQuery:
    facts = sqlcache.recall("query", text, dialect)
    try:
        problem = facts["problem"]
        tables, params = _refs(facts["tables"]), _refs(facts["params"])
    except (TypeError, KeyError, ValueError):  # not remembered, or not in this version's shape
        facts = _read_query(text, dialect)
        sqlcache.remember("query", text, dialect, facts)
        problem, tables, params = facts["problem"], _refs(facts["tables"]), _refs(facts["params"])
    if problem is not None:
        raise SqlProblem(*problem)
    return SqlQuery(file, text, tables, params)


def _refs(found) -> tuple[Ref, ...]:
    return tuple(Ref(str(name), int(line), int(col), int(start), int(end)) for name, line, col, start, end in found)


def _read_query(text: str, dialect: str) -> dict[str, Any]:
    """What sqlglot reads in `text`, as JSON: the tables and the params, or the problem (message,
    line, col) that makes it no query of a SQL stage."""
    try:
        tables, params = _parse_with_sqlglot(text, dialect)
    except SqlProblem as exc:
        return {"problem": [exc.message, exc.line, exc.col], "tables": [], "params": []}
    return {"problem": None, "tables": [_fields(r) for r in tables], "params": [_fields(r) for r in params]}


def _fields(ref: Ref) -> list:
    return [ref.name, ref.line, ref.col, ref.start, ref.end]


def _parse_with_sqlglot(text: str, dialect: str) -> tuple[tuple[Ref, ...], tuple[Ref, ...]]:
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    try:
        tokens = sqlglot.tokenize(text, read=dialect)
        statements = [s for s in sqlglot.parse(text, read=dialect) if s is not None]
    except ParseError as exc:
        where = (exc.errors or [{}])[0]
        line, col = where.get("line") or 1, where.get("col") or 1
        raise SqlProblem(f"the query does not parse: {where.get('description') or exc}", line, col) from None
    except TokenError as exc:
        raise SqlProblem(f"the query does not parse: {exc}") from None
    if len(statements) != 1:
        raise SqlProblem(f"a SQL stage's file holds one query, not {len(statements)}")
    query = statements[0]
    if not isinstance(query, exp.Query):
        raise SqlProblem(f"a SQL stage's file holds a query (SELECT ...), not {query.key.upper()}")
    ctes = {cte.alias_or_name.lower() for cte in query.find_all(exp.CTE)}
    tables = tuple(_ref(text, table.name, table.this.meta.get("start"))
                   for table in query.find_all(exp.Table)
                   if table.name and table.name.lower() not in ctes and not table.args.get("db"))
    return tuple(sorted(tables, key=lambda r: r.start)), _params(text, tokens)


def _tokens_read(root: Path, target: str) -> dict[str, Any] | None:
    """What fingerprints keep of a query file's tokens in no particular dialect (`:name` and comments
    read alike in all): the digest of their texts and the params; None when the file cannot be read
    or tokenized (fingerprints must not fail)."""
    try:
        text = file_of(root, target).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return _token_facts(text)


@functools.lru_cache(maxsize=256)
def _token_facts(text: str) -> dict[str, Any] | None:
    facts = sqlcache.recall("tokens", text, "")
    if isinstance(facts, dict) and isinstance(facts.get("digest"), str) and isinstance(facts.get("params"), list):
        return facts
    from sqlglot.errors import TokenError

    try:
        import sqlglot

        tokens = tuple(sqlglot.tokenize(text))
    except TokenError:
        return None
    normalized = " ".join(token.text for token in tokens)
    facts = {"digest": hashlib.sha256(normalized.encode()).hexdigest(),
             "params": sorted({ref.name for ref in _params(text, tokens)})}
    sqlcache.remember("tokens", text, "", facts)
    return facts


def code_digest(root: Path, target: str) -> str:
    """The query's tokens, hashed: what a change of the query changes, and only that."""
    found = _tokens_read(root, target)
    return found["digest"] if found else hashlib.sha256(b"unreadable").hexdigest()


def param_names(root: Path, target: str) -> set[str] | None:
    """The params the query names (None when it cannot be read: then every param counts)."""
    found = _tokens_read(root, target)
    return {str(name) for name in found["params"]} if found else None


def _params(text: str, tokens) -> tuple[Ref, ...]:
    """`:name` where the colon and the name touch (`::` casts are one token of their own)."""
    from sqlglot.tokens import TokenType

    found = []
    for colon, name in zip(tokens, tokens[1:]):
        if colon.token_type == TokenType.COLON and name.start == colon.end + 1 and name.text.isidentifier():
            found.append(Ref(name.text, *_line_col(text, colon.start), colon.start, name.end))
    return tuple(found)


def _ref(text: str, name: str, start: int | None) -> Ref:
    start = start if start is not None else max(text.find(name), 0)
    return Ref(name, *_line_col(text, start), start, start + len(name) - 1)


def _line_col(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def problems(root: Path, target: str, dialect: str, inputs: list[str], params: set[str], stage: str,
             shown: str) -> list[Problem]:
    """What `validate` reports of a SQL stage's file, each at its place in the file (`shown`)."""
    try:
        query = read_query(root, target, dialect)
    except SqlProblem as exc:
        return [Problem(shown, exc.line, exc.col, f"{exc.message} (the query of stage '{stage}')")]
    found = []
    by_name = {name.lower() for name in inputs}
    for table in query.tables:
        if table.name.lower() not in by_name:
            found.append(Problem(shown, table.line, table.col,
                                 f"table '{table.name}' is not an input of stage '{stage}'"
                                 f"{did_you_mean(table.name, inputs)} (its inputs: {', '.join(inputs) or 'none'})"))
    for param in query.params:
        if param.name not in params:
            message = f"':{param.name}' is not a param of stage '{stage}'{did_you_mean(param.name, params)}"
            found.append(Problem(shown, param.line, param.col, message))
    return found
