"""Safe YAML loading that remembers where every key and value came from.

PyYAML alone loses line numbers, silently keeps the last of two duplicate keys
and, with the wrong loader, executes tags. We compose the node tree with the safe
loader, reject any tag outside the YAML core schema, report duplicate keys at
both places, and record a line:col for every path so later checks can say where.
Hostile files are refused while composing, before anything recursive or expanded is built:
nesting is bounded, and so is the number of nodes that aliases would add once expanded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..diagnostics import Problem

Path = tuple  # a tuple of mapping keys (str) and sequence indexes (int)

_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")}
_MERGE_TAG = _CORE + "merge"

# A pipeline file is a few KB, with a handful of levels and anchors: these bounds are far above
# any real one, and low enough that a hostile file is refused in milliseconds.
MAX_FILE_BYTES = 1024 * 1024
MAX_DEPTH = 100  # mappings and lists inside each other, aliases expanded
MAX_ALIASED_NODES = 10_000  # nodes that all aliases together add once expanded (a "billion laughs")


@dataclass(frozen=True)
class Mark:
    line: int
    col: int


@dataclass
class SourceMap:
    """Where each path of the loaded document is in its file (1-based line and column)."""

    file: str
    keys: dict[Path, Mark] = field(default_factory=dict)
    values: dict[Path, Mark] = field(default_factory=dict)

    def value_at(self, path: Path) -> Mark:
        """The value's position, or the nearest enclosing one we know."""
        return self._nearest(self.values, tuple(path))

    def key_at(self, path: Path) -> Mark:
        """The key's position (for unknown or misspelt keys), falling back to the value's."""
        path = tuple(path)
        return self.keys.get(path) or self._nearest(self.values, path)

    def problem(self, path: Path, message: str, *, severity="error", at_key=False) -> Problem:
        mark = self.key_at(path) if at_key else self.value_at(path)
        return Problem(self.file, mark.line, mark.col, message, severity)

    @staticmethod
    def _nearest(table: dict[Path, Mark], path: Path) -> Mark:
        while path and path not in table:
            path = path[:-1]
        return table.get(path, Mark(1, 1))


def _mark(node: Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


class _Refused(yaml.MarkedYAMLError):
    """A bound hit while composing: reported with its own words, not as a syntax error."""


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader's composer, measuring as it goes so that nothing is ever expanded to be judged.

    Each collection's expanded size and height are computed from its children's, an alias counting
    as the node it refers to; composing is recursive, so depth is refused before it can overflow.
    """

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliased = 0
        self._measures: dict[int, tuple[int, int]] = {}  # id(collection) -> (nodes, height) once expanded

    def compose_node(self, parent, index):
        if not self.check_event(AliasEvent):
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)
        nodes, height = self._measure(node)
        self._aliased += nodes
        if self._aliased > MAX_ALIASED_NODES:
            raise _Refused(None, None, f"aliases would expand to more than {MAX_ALIASED_NODES:,} nodes with this "
                                       "one (an alias bomb?): a pipeline repeats far less through aliases", mark)
        if self._depth + height > MAX_DEPTH:
            raise _Refused(None, None, f"this alias nests the file more than {MAX_DEPTH} levels deep once "
                                       "expanded (flatten the structure)", mark)
        return node

    def compose_sequence_node(self, anchor):
        return self._nested(super().compose_sequence_node, anchor)

    def compose_mapping_node(self, anchor):
        return self._nested(super().compose_mapping_node, anchor)

    def _nested(self, compose, anchor) -> Node:
        if self._depth >= MAX_DEPTH:
            raise _Refused(None, None, f"mappings and lists are nested more than {MAX_DEPTH} levels deep "
                                       "(flatten the structure)", self.peek_event().start_mark)
        self._depth += 1
        try:
            node = compose(anchor)
        finally:
            self._depth -= 1
        children = node.value if isinstance(node, SequenceNode) else [n for pair in node.value for n in pair]
        measures = [self._measure(child) for child in children]
        self._measures[id(node)] = (1 + sum(n for n, _ in measures), 1 + max((h for _, h in measures), default=0))
        return node

    def _measure(self, node: Node) -> tuple[int, int]:
        # A collection not measured yet is still open: an alias back into it is a cycle, reported later.
        return self._measures.get(id(node), (1, 0))


class _Builder:
    def __init__(self, file: str) -> None:
        self.source = SourceMap(file)
        self.problems: list[Problem] = []
        self._scalars = SafeConstructor()
        self._open: set[int] = set()  # collections being built: an alias back to one is a cycle

    def fail(self, node: Node, message: str) -> None:
        mark = _mark(node)
        self.problems.append(Problem(self.source.file, mark.line, mark.col, message))

    def build(self, node: Node, path: Path) -> Any:
        self.source.values[path] = _mark(node)
        if node.tag not in _ALLOWED_TAGS:
            self.fail(node, f"YAML tag {node.tag.replace(_CORE, '!!')} is not allowed: pipeline files are "
                            "loaded safely and tags are never executed (remove the tag)")
            return None
        if isinstance(node, (MappingNode, SequenceNode)):
            if id(node) in self._open:
                self.fail(node, "this alias refers to a mapping or list that contains it: recursive YAML "
                                "structures are not allowed")
                return None
            self._open.add(id(node))
            try:
                if isinstance(node, MappingNode):
                    return self._mapping(node, path)
                return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
            finally:
                self._open.discard(id(node))
        try:
            return self._scalars.construct_object(node)
        except yaml.YAMLError as exc:
            self.fail(node, f"invalid value: {getattr(exc, 'problem', exc)}")
            return None

    def _mapping(self, node: MappingNode, path: Path) -> dict:
        explicit: dict[str, Any] = {}
        first_seen: dict[str, Node] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.update(self._merge_source(value_node, path))
                continue
            if not isinstance(key_node, ScalarNode):
                self.fail(key_node, "mapping keys must be plain strings")
                continue
            # Keys keep their source text: YAML 1.1 would turn a key like `on` or `NO` into a bool.
            key = key_node.value
            if key in first_seen:
                other = first_seen[key]
                self.fail(key_node, f"duplicate key '{key}' (first at line {_mark(other).line}); "
                                    "YAML would silently keep only the last one: remove one of them")
                self.fail(other, f"duplicate key '{key}' (again at line {_mark(key_node).line}); "
                                 "YAML would silently keep only the last one: remove one of them")
                continue
            first_seen[key] = key_node
            self.source.keys[path + (key,)] = _mark(key_node)
            explicit[key] = self.build(value_node, path + (key,))
        return {**merged, **explicit}

    def _merge_source(self, node: Node, path: Path) -> dict:
        sources = node.value if isinstance(node, SequenceNode) else [node]
        merged: dict = {}
        for source in reversed(sources):  # earlier sources win, as in YAML's merge key spec
            value = self.build(source, path)
            if isinstance(value, dict):
                merged.update(value)
            else:
                self.fail(source, "a merge key (<<) must refer to a mapping")
        return merged


def load_yaml(text: str, file: str) -> tuple[Any, SourceMap, list[Problem]]:
    """Parse one YAML document; returns (data, source map, problems). Never executes tags."""
    builder = _Builder(file)
    if len(text) > MAX_FILE_BYTES:  # characters: at least as many bytes
        return None, builder.source, [Problem(file, 1, 1, too_big())]
    try:
        root = yaml.compose(text, Loader=_BoundedLoader)
    except _Refused as exc:
        mark = exc.problem_mark
        return None, builder.source, [Problem(file, mark.line + 1, mark.column + 1, exc.problem)]
    except yaml.MarkedYAMLError as exc:
        return None, builder.source, [_syntax_problem(exc, file)]
    except yaml.YAMLError as exc:
        return None, builder.source, [Problem(file, 1, 1, f"YAML error: {exc}")]
    if root is None:
        return None, builder.source, [Problem(file, 1, 1, "the file is empty: a pipeline needs at least "
                                                           "'name' and 'stages'")]
    data = builder.build(root, ())
    return data, builder.source, builder.problems


def too_big(size: int | None = None) -> str:
    """The message for a file over MAX_FILE_BYTES (its size when known)."""
    actual = f"{size / 1024 / 1024:.1f} MiB" if size else "larger"
    return (f"a pipeline file may be at most {MAX_FILE_BYTES // 1024 // 1024} MiB and this one is {actual} "
            "(a pipeline is a few KB): is this the right file?")


def scalar_or_text(text: str) -> Any:
    """A command-line value read as a YAML scalar; a list, a mapping, a tag or bad YAML stays text."""
    try:
        node = yaml.compose(text, Loader=_BoundedLoader)
        if node is None:
            return None
        if not isinstance(node, ScalarNode) or node.tag not in _ALLOWED_TAGS:
            return text
        return SafeConstructor().construct_object(node)
    except yaml.YAMLError:
        return text


_OPENERS = {"flow sequence": ("[", "]"), "flow mapping": ("{", "}")}


def _syntax_problem(exc: yaml.MarkedYAMLError, file: str) -> Problem:
    """PyYAML's parser wording, turned into what went wrong and how to fix it."""
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    context, problem = str(exc.context or ""), str(exc.problem or "")
    for kind, (opening, closing) in _OPENERS.items():
        if kind in context and exc.context_mark is not None:
            opened = exc.context_mark
            return Problem(file, opened.line + 1, opened.column + 1,
                           f"YAML syntax error: the '{opening}' opened here is not closed before line {line} "
                           f"(add '{closing}', or separate items with ',')")
    if "expected <block end>" in problem:
        message = "this line's indentation does not line up with the keys above it (indent with spaces)"
    elif "mapping values are not allowed" in problem:
        message = "a ':' is not allowed here: check the indentation, or quote a value that contains ': '"
    elif "\\t" in problem or "tab" in problem:
        message = "tabs cannot indent YAML: indent with spaces"
    else:
        message = "; ".join(part for part in (context, problem) if part)
    return Problem(file, line, col, f"YAML syntax error: {message}")
