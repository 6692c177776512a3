"""What a stage function reaches in the project's code, unit by unit, each hashed by its parsed code.

A unit is keyed "path:label": a top-level function or class ("pkg/steps.py:function report"), a
module's module-level code ("pkg/steps.py:module-level code"), or a whole file that does not parse
("pkg/steps.py:file"). From the stage function, the names each unit reads are followed to the
units they name, across project modules and their imports; importing a module reaches its
module-level code, which runs on import. Where names cannot be followed (a star import, a module
used bare, globals()/eval), all of a module counts. Parsed code leaves out comments, docstrings and
formatting. Installed packages are not project code and are not followed: the top-level names of
the modules outside the project that the reached code imports are kept instead (libraries.py finds
the distributions, and their versions, that provide them).
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import sqlstage
from .sqlstage import is_sql
from .stagecode import module_file

MODULE_LEVEL = "module-level code"
WHOLE_FILE = "file"
EVERYTHING = "*"  # a target naming all of a module: it is reached in ways names cannot follow
IMPORTED = ""  # a target naming only a module's import: its module-level code runs
# Builtins that reach a module's names by string, so whatever they reach cannot be told
DYNAMIC = frozenset({"globals", "vars", "eval", "exec"})
# Decorators that only wrap the function they get. Any other one is handed the function on import
# and may keep it where any stage can reach it (a registry), so that def counts as module-level code.
WRAPPING = frozenset({"cache", "lru_cache", "cached_property", "contextmanager", "asynccontextmanager",
                      "dataclass", "total_ordering", "overload", "jit", "njit"})
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

Target = tuple[str, str]  # (module, a name in it, EVERYTHING or IMPORTED)
Binding = tuple[str, str | None]  # what an import binds: (module, name), or (module, None) for the module


@dataclass
class ReachedCode:
    digests: dict[str, str]  # unit key -> sha256 of its parsed code
    reads_params: bool  # whether any of it reads a `.params` attribute (ctx.params)
    imports: frozenset[str] = frozenset()  # top-level names of the modules outside the project it imports
    reads_calendar: bool = False  # whether any of it reads a `.scheduled_for` attribute (ctx.scheduled_for)


@dataclass
class _Unit:
    key: str
    digest: str
    targets: list[Target]  # what running it may reach
    reads_params: bool
    reads_calendar: bool = True


@dataclass
class _Module:
    top: _Unit  # the module-level code, or the whole file when it does not parse
    units: dict[str, _Unit]  # top-level def or class -> its unit
    bindings: dict[str, Binding]  # module-level imports


class CodeIndex:
    """The code under root that a stage function can reach: its own function, the functions,
    classes and modules it names (transitively, across project modules), and the module-level code
    of every project module imported on the way (which runs on import)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, Path | None] = {}
        self._modules: dict[str, _Module | None] = {}

    def reach(self, target: str) -> ReachedCode:
        if is_sql(target):  # a query reaches no Python: its own text is its code
            return ReachedCode({f"{target}:{sqlstage.UNIT}": sqlstage.code_digest(self.root, target)}, False)
        module, function = target.split(":")
        reached: dict[str, _Unit] = {}
        queue: list[Target] = [(module, function)]
        seen: set[Target] = set()
        outside: set[str] = set()
        while queue:
            item = queue.pop()
            if item in seen:
                continue
            seen.add(item)
            top = item[0].split(".")[0]
            if top not in outside and self._module(item[0]) is None and not self._in_project(top):
                outside.add(top)
            units, more = self._step(*item)
            for unit in units:
                if unit.key not in reached:
                    reached[unit.key] = unit
                    queue += unit.targets
            queue += more
        return ReachedCode({key: unit.digest for key, unit in reached.items()},
                           any(unit.reads_params for unit in reached.values()), frozenset(outside),
                           any(unit.reads_calendar for unit in reached.values()))

    def _step(self, name: str, wanted: str) -> tuple[list[_Unit], list[Target]]:
        """The units that reaching `wanted` in module `name` adds, and what else it reaches."""
        module = self._module(name)
        if module is None:  # not project code: installed packages are not fingerprinted
            return [], []
        if wanted == IMPORTED:  # importing a.b.c runs a/__init__ and a/b/__init__ first
            parts = name.split(".")
            return [module.top], [(".".join(parts[:depth]), IMPORTED) for depth in range(1, len(parts))]
        if wanted == EVERYTHING:  # its re-exported names too: getattr(module, name) may pick one
            return list(module.units.values()), [(name, IMPORTED), *(b for b in module.bindings.values() if b[1])]
        more = [(name, IMPORTED)]
        if wanted in module.bindings:  # re-exported: follow it to where it is defined
            source, bound = module.bindings[wanted]
            more.append((source, EVERYTHING if bound is None else bound))
        return [module.units[wanted]] if wanted in module.units else [], more

    def _in_project(self, top: str) -> bool:
        """A module or package of the project (even one installed too, with pip install -e)."""
        return self._file(top) is not None or (self.root / top).is_dir()

    def _file(self, module: str) -> Path | None:
        if module not in self._files:
            self._files[module] = module_file(self.root, module)
        return self._files[module]

    def _module(self, name: str) -> _Module | None:
        if name not in self._modules:
            file = self._file(name)
            self._modules[name] = None if file is None else \
                _Reader(self.root, name, file, lambda module: self._file(module) is not None).read()
        return self._modules[name]


class _Reader:
    """Splits one module into units and finds what each of them names."""

    def __init__(self, root: Path, name: str, file: Path, is_module: Callable[[str], bool]) -> None:
        self.name = name
        self.file = file
        self.is_module = is_module
        self.path = file.relative_to(root).as_posix()
        self.package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        self.defs: dict[str, list[ast.stmt]] = {}
        self.bindings: dict[str, Binding] = {}

    def read(self) -> _Module:
        source = self.file.read_bytes()
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):  # the import fails at run time and says why
            whole = _Unit(f"{self.path}:{WHOLE_FILE}", hashlib.sha256(source).hexdigest(), [], reads_params=True)
            return _Module(whole, {}, {})
        _strip_docstrings(tree)
        top: list[ast.stmt] = []
        for node in tree.body:
            if isinstance(node, DEFS) and all(_decorator_name(d) in WRAPPING for d in node.decorator_list):
                self.defs.setdefault(node.name, []).append(node)
            elif not _is_main_guard(node):
                top.append(node)
        self.bindings, _ = self._imports(top)
        units = {name: self._unit(f"{_kind(nodes[-1])} {name}", nodes) for name, nodes in self.defs.items()}
        return _Module(self._unit(MODULE_LEVEL, top), units, self.bindings)

    def _unit(self, label: str, nodes: list[ast.stmt]) -> _Unit:
        local, targets = self._imports(nodes)
        scope = {**self.bindings, **local}
        for node in nodes:
            for name, attributes in _references(node):
                targets += self._resolve(name, attributes, scope)
        digest = hashlib.sha256("\n".join(ast.dump(node) for node in nodes).encode()).hexdigest()
        attributes = {n.attr for node in nodes for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        return _Unit(f"{self.path}:{label}", digest, targets, "params" in attributes, "scheduled_for" in attributes)

    def _imports(self, nodes: list[ast.stmt]) -> tuple[dict[str, Binding], list[Target]]:
        """The names the imports among nodes bind, and the modules they import (all of a star-imported one)."""
        bindings: dict[str, Binding] = {}
        targets: list[Target] = []
        for node in (n for statement in nodes for n in ast.walk(statement)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.append((alias.name, IMPORTED))
                    if alias.asname:
                        bindings[alias.asname] = (alias.name, None)
                    else:  # import a.b binds a
                        bindings[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(self.package, node.module, node.level)
                if base is None:
                    continue
                targets.append((base, IMPORTED))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if alias.name == "*":
                        targets.append((base, EVERYTHING))
                    elif self.is_module(submodule):
                        targets.append((submodule, IMPORTED))
                        bindings[alias.asname or alias.name] = (submodule, None)
                    else:
                        bindings[alias.asname or alias.name] = (base, alias.name)
        return bindings, targets

    def _resolve(self, name: str, attributes: list[str], scope: dict[str, Binding]) -> list[Target]:
        """What a name read by the code reaches (a local variable that shadows one only adds a target)."""
        targets: list[Target] = []
        if name in scope:
            module, bound = scope[name]
            targets.append((module, bound) if bound is not None else self._attribute(module, attributes))
        if name in self.defs:
            targets.append((self.name, name))
        if not targets and name in DYNAMIC:
            targets.append((self.name, EVERYTHING))
        return targets

    def _attribute(self, module: str, attributes: list[str]) -> Target:
        """`module.sub.f` -> f in module.sub; a module used bare (getattr(module, ...)) -> all of it."""
        for attribute in attributes:
            if not self.is_module(f"{module}.{attribute}"):
                return module, attribute
            module = f"{module}.{attribute}"
        return module, EVERYTHING


def _references(tree: ast.AST):
    """Every name the code reads, with the attributes read from it: `a.b.c()` -> ("a", ["b", "c"])."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Attribute):
            attributes = []
            while isinstance(node, ast.Attribute):
                attributes.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                yield node.id, attributes[::-1]
                continue
        elif isinstance(node, ast.Name):
            yield node.id, []
        stack.extend(ast.iter_child_nodes(node))


def _strip_docstrings(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, *DEFS)) and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:]


def _kind(node: ast.stmt) -> str:
    return "class" if isinstance(node, ast.ClassDef) else "function"


def _decorator_name(node: ast.expr) -> str | None:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` does not run on import."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _resolve_relative(package: str, module: str | None, level: int) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None
