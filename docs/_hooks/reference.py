"""MkDocs hook: the reference tables, generated from the code at build time so they are never written twice.

A page asks for a table with an HTML comment on a line of its own, `<!-- generated: NAME -->`, which the
hook replaces with the table's markdown; an unknown NAME fails the build. The tables:

- `pipeline-keys`: every key of the pipeline file, from its JSON schema (`hybridflow.schema()`, the
  pydantic model), with its type, default, description and its example from
  docs/reference/key-examples.yaml (a key without one, or an example of a key that is gone, fails the
  build; tests/docs/test_key_examples.py validates each example in a pipeline file);
- `cli`: every command of the Typer app with its usage, help and options;
- `exit-codes`: the `ExitCode` enum with the comment beside each member in hybridflow/errors.py;
- `pandas-dtypes`: what a pandas stage gets for each Arrow type, by converting a sample table with
  hybridflow's own conversion (hybridflow.backends.pandas_frames.to_pandas).
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
KEY_EXAMPLES = DOCS / "reference" / "key-examples.yaml"  # one example per key: see key_examples()


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda match: _generate(match[1], page.file.src_uri), markdown)


def _generate(name: str, page: str) -> str:
    makers = {"pipeline-keys": pipeline_keys, "cli": cli_reference, "exit-codes": exit_codes,
              "pandas-dtypes": pandas_dtypes}
    if name not in makers:
        raise ValueError(f"{page}: no generated table named '{name}' (known: {', '.join(makers)})")
    return makers[name]()


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _prose(text: Any) -> str:
    """A cell of prose: braces outside code are shown as written (attr_list would take a trailing
    `{...}` for the cell's attributes and drop it)."""
    parts = _cell(text).split("`")
    return "`".join(part if i % 2 else part.replace("{", "&#123;") for i, part in enumerate(parts))


# --- the pipeline file --------------------------------------------------------------------------------

def pipeline_keys() -> str:
    import hybridflow

    schema = hybridflow.schema()
    examples = key_examples()
    out = []
    sections = key_sections(schema)
    shared = [path for path, _ in sections if "<" in path]
    for path, props in sections:
        out.append(f"### `{path or 'top level'}`\n")
        out.append("| key | type | default | description and example |")
        out.append("|---|---|---|---|")
        for key, prop in props.items():
            full = f"{path}.{key}" if path else key
            described = _prose(prop.get("description", "") or _description_of(prop, schema["$defs"]))
            kind = _cell(_type_of(prop, schema["$defs"]))
            listed = next((s for s in shared if "<" not in full and _placeholders(s).fullmatch(full)), None)
            if listed:  # one engine's key whose section every engine shares: point at it
                kind = f"mapping: [`{listed}`](#{_slug(listed)})"
            out.append(f"| `{key}` | {kind} | {_default_of(prop)} | "
                       f"{described}{'<br>' if described else ''}`{_cell(flow(examples[full]))}` |")
        out.append("")
    return "\n".join(out)


def _placeholders(path: str) -> re.Pattern:
    return re.compile(re.escape(path).replace(re.escape("<engine>"), r"\w+").replace(re.escape("<name>"), r"\w+"))


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading of this text."""
    return re.sub(r"[^\w\s-]", "", heading).strip().lower().replace(" ", "-")


def key_sections(schema: dict) -> list[tuple[str, dict]]:
    """The reference's sections, (path, {key: its schema}), in the file's order. A section that several
    parents share (each engine's `cluster:`) is listed once, its differing part of the path written
    `<engine>` (under backends) or `<name>`."""
    walked: list[tuple[str, dict, str | None]] = []
    _walk(schema, schema["$defs"], "", None, walked)
    by_def: dict[str, list[str]] = {}
    for path, _, name in walked:
        if name is not None:
            by_def.setdefault(name, []).append(path)
    sections, listed = [], set()
    for path, props, name in walked:
        paths = by_def.get(name, [path]) if name is not None else [path]
        if len(paths) > 1:
            path = _shared_path(paths)
        if path not in listed:
            listed.add(path)
            sections.append((path, props))
    return sections


def _shared_path(paths: list[str]) -> str:
    columns = zip(*(path.split(".") for path in paths), strict=True)
    parts: list[str] = []
    for column in columns:
        parts.append(column[0] if len(set(column)) == 1 else ("<engine>" if parts == ["backends"] else "<name>"))
    return ".".join(parts)


def key_paths(schema: dict) -> list[str]:
    """Every key the reference lists, as `section.key` (the names key-examples.yaml is keyed by)."""
    return [f"{path}.{key}" if path else key for path, props in key_sections(schema) for key in props]


def key_examples() -> dict[str, dict]:
    """docs/reference/key-examples.yaml, checked against the schema: every key has exactly one example,
    a mapping that holds the key itself (and any sibling it needs); none names a key that is gone."""
    import hybridflow
    from hybridflow.definition.yamlsource import load_yaml

    examples, _, problems = load_yaml(KEY_EXAMPLES.read_text(), str(KEY_EXAMPLES))  # as hybridflow reads: `on:` a key
    if problems:
        raise ValueError("; ".join(map(str, problems)))
    known = key_paths(hybridflow.schema())
    missing = [path for path in known if path not in examples]
    stale = [path for path in examples if path not in known]
    wrong = [path for path, example in examples.items()
             if not isinstance(example, dict) or path.rsplit(".", 1)[-1] not in example]
    problems = ([f"no example for {', '.join(missing)}"] if missing else []) + \
        ([f"examples for keys the pipeline file no longer has: {', '.join(stale)}"] if stale else []) + \
        ([f"an example must be a mapping holding its own key: {', '.join(wrong)}"] if wrong else [])
    if problems:
        raise ValueError(f"{KEY_EXAMPLES.relative_to(DOCS.parent)}: " + "; ".join(problems))
    return examples


class _Yaml12Dumper(yaml.SafeDumper):
    """Writes `on:` as hybridflow reads it (a key): only true and false are booleans."""


_Yaml12Dumper.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeDumper.yaml_implicit_resolvers.items()}
_Yaml12Dumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|false)$"), list("tf"))


def flow(example: dict) -> str:
    """An example as one line of YAML, its braces dropped: `provider: ssh, hosts: [{host: a}]`."""
    return yaml.dump(example, Dumper=_Yaml12Dumper, default_flow_style=True, sort_keys=False,
                     width=10_000).strip()[1:-1]


def _resolve(prop: dict, defs: dict) -> dict:
    if "$ref" in prop:
        return defs[prop["$ref"].rsplit("/", 1)[1]]
    return prop


def _object_of(prop: dict, defs: dict) -> dict | None:
    """The object schema a key holds (through $ref and `X | None`), or None for a plain value."""
    for option in [prop, *prop.get("anyOf", [])]:
        option = _resolve(option, defs)
        if option.get("type") == "object" and "properties" in option:
            return option
    return None


def _mapping_of(prop: dict, defs: dict) -> dict | None:
    """For `name -> object` mappings (datasets, stages): the object schema of each value."""
    values = prop.get("additionalProperties")
    if isinstance(values, dict):
        return _object_of(values, defs)
    return None


def _def_name(prop: dict) -> str | None:
    """The $defs name of the object schema a key holds, if it holds a named one."""
    for option in [prop, *prop.get("anyOf", [])]:
        if "$ref" in option:
            return option["$ref"].rsplit("/", 1)[1]
    return None


def _walk(schema: dict, defs: dict, path: str, name: str | None, sections: list) -> None:
    props = schema["properties"]
    sections.append((path, props, name))
    for key, prop in props.items():
        full = f"{path}.{key}" if path else key
        if (inner := _object_of(prop, defs)) is not None:
            _walk(inner, defs, full, _def_name(prop), sections)
        elif (values := _mapping_of(prop, defs)) is not None:
            _walk(values, defs, f"{full}.<name>", _def_name(prop["additionalProperties"]), sections)
        elif (array := _array_of(prop)) is not None and (items := _object_of(array["items"], defs)) is not None:
            _walk(items, defs, f"{full}[]", _def_name(array["items"]), sections)


def _array_of(prop: dict) -> dict | None:
    """The list schema a key holds (a list, or a list or null), if its items are described."""
    for option in [prop, *prop.get("anyOf", [])]:
        if option.get("type") == "array" and "items" in option:
            return option
    return None


def _type_of(prop: dict, defs: dict) -> str:
    if "anyOf" in prop:
        kinds = [_type_of(option, defs) for option in prop["anyOf"] if option.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds))
    if "$ref" in prop:
        return "mapping (below)"
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return "one of " + ", ".join(f"`{value}`" for value in prop["enum"])
    kind = prop.get("type", "any")
    if kind == "array":
        items = prop.get("items", {})
        return f"list of {_type_of(items, defs)}" if items else "list"
    if kind == "object":
        values = prop.get("additionalProperties")
        if isinstance(values, dict) and ("$ref" in values or "properties" in values):
            return "mapping of name to mapping (below)"
        return "mapping (below)" if "properties" in prop else "mapping"
    if kind == "string" and "(ms|s|m|h|d)" in prop.get("pattern", ""):
        return "duration: 90s, 30m, 1h30m"
    if kind == "string" and "pattern" in prop and "description" not in prop:
        return f"string matching `{prop['pattern']}`"
    return {"integer": "integer", "number": "number", "boolean": "boolean", "string": "string"}.get(kind, kind)


def _default_of(prop: dict) -> str:
    if "default" not in prop:
        return "required" if prop.get("minProperties") or prop.get("title") in ("Name", "Run", "Cron") else "—"
    return f"`{json.dumps(prop['default'])}`"


def _description_of(prop: dict, defs: dict) -> str:
    inner = _object_of(prop, defs)
    return (inner or {}).get("description", "")


# --- the command line ---------------------------------------------------------------------------------

def cli_reference() -> str:
    import typer

    from hybridflow.cli import app

    root = typer.main.get_command(app)  # Typer's own copy of click: duck-typed below, never `import click`
    out: list[str] = []
    _command(root, "hybridflow", out, root.context_class(root, info_name="hybridflow"))
    return "\n".join(out)


def _command(command, name: str, out: list[str], ctx) -> None:
    if name != "hybridflow":
        out.append(f"### `{name}`\n")
        out.append((command.help or "").strip().replace("\b\n", "") + "\n")
        out.append(f"```text\n{command.get_usage(ctx).strip()}\n```\n")
        records = [param.get_help_record(ctx) for param in command.params if not param.hidden]
        records = [record for record in records if record]
        if records:
            out.append("| argument or option | what it does |")
            out.append("|---|---|")
            out.extend(f"| `{_cell(decl)}` | {_cell(help_text)} |" for decl, help_text in records)
            out.append("")
    for sub_name in command.list_commands(ctx) if hasattr(command, "list_commands") else ():
        sub = command.get_command(ctx, sub_name)
        if sub is not None and not sub.hidden:
            _command(sub, f"{name} {sub_name}", out, sub.context_class(sub, info_name=sub_name, parent=ctx))


# --- exit codes ---------------------------------------------------------------------------------------

def exit_codes() -> str:
    """The enum's members with the comment written beside each (the source's own words)."""
    import hybridflow.errors as errors

    source = Path(errors.__file__).read_text()
    comments: dict[str, str] = {}
    in_enum, member = False, None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.string == "ExitCode" and token.line.startswith("class "):
            in_enum = True
        elif in_enum and token.type == tokenize.NAME and token.start[1] == 4 and token.string.isupper():
            member = token.string
        elif in_enum and token.type == tokenize.COMMENT and member:
            comments[member] = token.string.lstrip("# ")
            member = None
        elif in_enum and token.type == tokenize.DEDENT and token.start[1] == 0:
            break
    rows = ["| code | name | meaning |", "|---|---|---|"]
    for code in errors.ExitCode:
        meaning = comments.get(code.name)
        if not meaning and code != 0:
            raise ValueError(f"hybridflow/errors.py: ExitCode.{code.name} has no comment saying what it means")
        rows.append(f"| {int(code)} | `{code.name}` | {_cell(meaning or 'success')} |")
    return "\n".join(rows) + "\n"


# --- the Parquet contract: what pandas stages get -----------------------------------------------------

def pandas_dtypes() -> str:
    import datetime
    import decimal

    import pyarrow as pa

    from hybridflow.backends.pandas_frames import to_pandas

    samples = [
        ("int8", pa.int8(), 1), ("int64", pa.int64(), 1), ("uint8", pa.uint8(), 1), ("uint64", pa.uint64(), 1),
        ("bool", pa.bool_(), True), ("float32", pa.float32(), 1.5), ("float64", pa.float64(), 1.5),
        ("float64 holding NaN", pa.float64(), float("nan")),
        ("timestamp[us, tz=UTC]", pa.timestamp("us", tz="UTC"), datetime.datetime(2026, 11, 16)),
        ("timestamp[us]", pa.timestamp("us"), datetime.datetime(2026, 11, 16)),
        ("duration[us]", pa.duration("us"), datetime.timedelta(seconds=1)),
        ("string", pa.string(), "a"), ("large_string", pa.large_string(), "a"),
        ("decimal(10,2)", pa.decimal128(10, 2), decimal.Decimal("1.50")),
        ("date32", pa.date32(), datetime.date(2026, 11, 16)), ("time64[us]", pa.time64("us"), datetime.time(3)),
        ("binary", pa.binary(), b"a"), ("list<int64>", pa.list_(pa.int64()), [1]),
        ("struct<a: int64>", pa.struct([("a", pa.int64())]), {"a": 1}),
        ("float16", pa.float16(), None),
    ]
    rows = ["| Arrow type | without nulls | with nulls |", "|---|---|---|"]
    for label, arrow_type, value in samples:
        if arrow_type == pa.float16():  # no Python scalar converts to a half float: build it from numpy
            import numpy as np

            full = pa.array(np.array([1.5], dtype=np.float16))
            with_null = pa.array(np.array([1.5, 0], dtype=np.float16), mask=np.array([False, True]))
        else:
            full = pa.array([value], type=arrow_type)
            with_null = pa.array([value, None], type=arrow_type)
        got = [str(to_pandas(pa.table({"c": column})).dtypes["c"]) for column in (full, with_null)]
        rows.append(f"| `{label}` | `{_cell(got[0])}` | `{_cell(got[1])}` |")
    return "\n".join(rows) + "\n"
