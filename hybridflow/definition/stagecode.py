"""Finding a stage's function under the pipeline root: statically for `validate`, for real for `run`.

Only code under root is ever imported, and a module is checked to really come
from there (not from a same-named package elsewhere on sys.path).
"""

from __future__ import annotations

import ast
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..diagnostics import did_you_mean
from ..errors import ConfigError
from . import signature


def module_file(root: Path, module: str) -> Path | None:
    """root/a/b.py or root/a/b/__init__.py for module a.b, if present."""
    base = root.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):  # Python prefers the package too
        if candidate.is_file():
            return candidate
    return None


@dataclass
class StaticTarget:
    """What `ast` can tell about module:function without running the module."""

    file: Path | None
    params: list[signature.Parameter] | None  # None: defined in a way we cannot read statically
    error: str | None = None
    error_line: int | None = None  # a line in `file` (for syntax errors)


def inspect_target(root: Path, target: str) -> StaticTarget:
    module, function = target.split(":")
    file = module_file(root, module)
    if file is None:
        expected = Path(*module.split(".")).with_suffix(".py")
        return StaticTarget(None, None, f"module '{module}' not found under root {root} (expected {expected})")
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))  # bytes: honours a coding: line
    except (SyntaxError, ValueError) as exc:
        return StaticTarget(file, None, f"syntax error in {file.name}: {getattr(exc, 'msg', exc)}",
                            getattr(exc, "lineno", None) or 1)
    defined: dict[str, ast.AST] = {}
    for node in _module_level(tree.body):
        for name in _bound_names(node):
            defined.setdefault(name, node)
    node = defined.get(function)
    if node is None and "*" in defined:
        return StaticTarget(file, None)  # may come from a star import: checked when the run imports it
    if node is None:
        functions = [n for n, d in defined.items() if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        hint = did_you_mean(function, functions)
        return StaticTarget(file, None, f"module '{module}' has no function '{function}'{hint}")
    if isinstance(node, ast.AsyncFunctionDef):
        return StaticTarget(file, None, f"'{target}' is an async function: stage functions are plain def")
    if isinstance(node, ast.FunctionDef):
        return StaticTarget(file, signature.from_ast(node))
    return StaticTarget(file, None)  # imported or assigned: checked when the run imports it


def _module_level(body: list[ast.stmt]):
    """Statements that run at import time, including those inside if/try/with blocks."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers"):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from _module_level(getattr(node, block, []) or [])


def _bound_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    return []


def import_function(root: Path, target: str) -> Callable:
    """Import module:function from root (root goes first on sys.path for the import)."""
    module_name, function = target.split(":")
    root = root.resolve()
    _forget_foreign(module_name, root)
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import '{module_name}' for {target}: {exc}",
                          hint=f"stage modules are imported from root {root}") from exc
    finally:
        sys.path.remove(str(root))
    origin = Path(getattr(module, "__file__", "") or "").resolve()
    if not origin.is_relative_to(root):
        raise ConfigError(f"module '{module_name}' resolved to {origin}, outside the pipeline root {root}",
                          hint="rename the module so it does not clash with an installed package")
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(f"'{target}' is not a function{did_you_mean(function, dir(module))}")
    return fn


def _forget_foreign(module_name: str, root: Path) -> None:
    """Drop cached modules of this name that came from another root (two pipelines, one process)."""
    top = module_name.split(".")[0]
    if module_file(root, top) is None and not (root / top).is_dir():
        return  # root does not define this name, so nothing cached can be shadowing it
    # a copy taken at once (dict.copy allocates nothing per item, so no collection can run a finalizer
    # midway): another thread may be importing meanwhile (the MLflow sender)
    for name, module in sys.modules.copy().items():
        if name != top and not name.startswith(top + "."):
            continue
        file = getattr(module, "__file__", None)
        paths = [Path(file)] if file else [Path(p) for p in getattr(module, "__path__", [])]
        if not any(p.resolve().is_relative_to(root) for p in paths):
            sys.modules.pop(name, None)
