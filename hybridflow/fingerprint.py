"""A stage's fingerprint: everything that decides its output, so an unchanged stage can be skipped.

Parts: the code (each function, class and module-level code the stage function can reach, by its
parsed code, so comments, docstrings and formatting never count), the params the function can see,
the settings that change results (backend, requested GPU mode, Spark conf, the datasets'
declarations), and the content digests of its inputs. The fingerprint is stored in each output's
manifest; a stage whose outputs all carry the fingerprint it has now is skipped, and the parts let
`plan` say in words what changed. Values that came from ${env:...} are stored only as a keyed hash.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import secrets as tokens
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import signature
from .errors import DataError
from .stagecode import inspect_target, module_file

SECRET_PREFIX = "secret:"


@dataclass
class Fingerprint:
    code: dict[str, str]  # code unit ("pkg/steps.py:function report") -> sha256 of its parsed code
    params: dict[str, Any]  # the params the function can see, secrets hashed
    settings: dict[str, Any]  # backend, requested gpu mode, spark conf, dataset declarations
    inputs: dict[str, str]  # dataset -> content digest (an incremental stage's partitioned input excluded)
    datums: dict[str, str] | None = None  # incremental: partition of the partitioned input -> digest
    base: str = field(init=False)
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        self.base = _sha({"code": self.code, "params": self.params, "settings": self.settings,
                          "inputs": self.inputs})
        self.digest = self.base if self.datums is None else _sha({"base": self.base, "datums": self.datums})

    def record(self) -> dict[str, Any]:
        """What an output's manifest keeps."""
        return {"digest": self.digest, "base": self.base, "code": self.code, "params": self.params,
                "settings": self.settings, "inputs": self.inputs, "datums": self.datums}


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# -- code -------------------------------------------------------------------------------------------
# A stage's code is a set of units, each keyed "path:label": a top-level function or class
# ("pkg/steps.py:function report"), a module's module-level code ("pkg/steps.py:module-level code"),
# or a whole file that does not parse ("pkg/steps.py:file"). A unit is hashed by its parsed code.

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


@dataclass
class _Unit:
    key: str
    digest: str
    targets: list[Target]  # what running it may reach
    reads_params: bool


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
        module, function = target.split(":")
        reached: dict[str, _Unit] = {}
        queue: list[Target] = [(module, function)]
        seen: set[Target] = set()
        while queue:
            item = queue.pop()
            if item in seen:
                continue
            seen.add(item)
            units, more = self._step(*item)
            for unit in units:
                if unit.key not in reached:
                    reached[unit.key] = unit
                    queue += unit.targets
            queue += more
        return ReachedCode({key: unit.digest for key, unit in reached.items()},
                           any(unit.reads_params for unit in reached.values()))

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
        reads_params = any(isinstance(n, ast.Attribute) and n.attr == "params"
                           for node in nodes for n in ast.walk(node))
        return _Unit(f"{self.path}:{label}", digest, targets, reads_params)

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


class SecretHasher:
    """Replaces values that contain a secret with a keyed hash: equal secrets compare equal, and the
    stored fingerprint cannot be used to guess a short secret. The key stays in the workdir (0600)."""

    def __init__(self, key_file: Path, secrets: frozenset[str]) -> None:
        self.secrets = secrets
        self.key_file = key_file
        self._key: bytes | None = None

    def value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {self.value(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        if value is not None and any(s and s in str(value) for s in self.secrets):  # also a secret parsed as a number
            return SECRET_PREFIX + hmac.new(self._secret_key(), str(value).encode(), "sha256").hexdigest()[:24]
        return value

    def _secret_key(self) -> bytes:
        if self._key is None:
            self._key = self._read_key()
            if self._key is None:
                # written whole under a temporary name, then linked into place: a concurrent creator
                # or a crash never leaves a short key behind, and the first key made wins
                self.key_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.key_file.with_name(f".{self.key_file.name}.{os.getpid()}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(tokens.token_hex(32))
                    handle.flush()
                    os.fsync(handle.fileno())
                try:
                    os.link(tmp, self.key_file)
                except FileExistsError:
                    pass
                finally:
                    tmp.unlink()
                self._key = self._read_key()
                if self._key is None:
                    raise DataError(f"{self.key_file} does not hold a 32-byte key",
                                    hint="delete it: a new key is made (every stage that uses a secret runs again)")
        return self._key

    def _read_key(self) -> bytes | None:
        try:
            key = bytes.fromhex(self.key_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return key if len(key) == 32 else None


def visible_params(root: Path, target: str, params: dict[str, Any], reads_params: bool) -> dict[str, Any]:
    """The params a stage function can see: those named in its signature, and all of them when it
    takes **kwargs, when its signature cannot be read statically, or when it takes ctx and its code
    reads a `.params` attribute (`reads_params`, from CodeIndex)."""
    parameters = inspect_target(root, target).params
    if parameters is None or any(p.kind == "var_keyword" for p in parameters):
        return dict(params)
    if reads_params and any(p.name == signature.CTX for p in parameters):
        return dict(params)
    names = {p.name for p in parameters}
    return {k: v for k, v in params.items() if k in names}


def explain(old: dict[str, Any] | None, new: Fingerprint) -> list[str]:
    """Why a stage must run again, in words, from its last fingerprint and the current one."""
    if not old:
        return ["never run"]
    reasons = _changed_code(old.get("code") or {}, new.code)
    reasons += _changed_values("params", old.get("params", {}), new.params)
    reasons += _changed_values("settings", _flat(old.get("settings", {})), _flat(new.settings))
    old_inputs = old.get("inputs", {})
    for dataset in sorted(set(old_inputs) | set(new.inputs)):
        if dataset not in old_inputs:
            reasons.append(f"input {dataset} is new to the stage")
        elif dataset not in new.inputs:
            reasons.append(f"input {dataset} was removed from the stage")
        elif old_inputs[dataset] != new.inputs[dataset]:
            reasons.append(f"input {dataset} has a new version")
    return reasons


def _changed_code(old: dict[str, str], new: dict[str, str]) -> list[str]:
    if not isinstance(old, dict) or any(":" not in key for key in old):  # keyed by file until code units
        return ["its code was fingerprinted by an older version of hybridflow"]
    old_files, new_files = _by_file(old), _by_file(new)
    reasons: list[str] = []
    for path in sorted(set(old_files) | set(new_files)):
        before, after = old_files.get(path), new_files.get(path)
        if before is None:
            reasons.append(f"{path} is now imported")
        elif after is None:
            reasons.append(f"{path} is no longer imported")
        elif WHOLE_FILE in before or WHOLE_FILE in after:  # it does not parse, now or then
            if before != after:
                reasons.append(f"{path} changed")
        else:
            for label in sorted(set(before) | set(after)):
                if label not in before:
                    reasons.append(f"{label} in {path} is now used")
                elif label not in after:
                    reasons.append(f"{label} in {path} is no longer used")
                elif before[label] != after[label]:
                    reasons.append(f"{label} in {path} changed")
    return reasons


def _by_file(code: dict[str, str]) -> dict[str, dict[str, str]]:
    files: dict[str, dict[str, str]] = {}
    for key, digest in code.items():
        path, _, label = key.rpartition(":")
        files.setdefault(path, {})[label] = digest
    return files


def _changed_values(prefix: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    reasons = []
    for key in sorted(set(old) | set(new), key=str):
        if key not in old:
            reasons.append(f"{prefix}.{key} added ({_show(new[key])})")
        elif key not in new:
            reasons.append(f"{prefix}.{key} removed (was {_show(old[key])})")
        elif _sha(old[key]) != _sha(new[key]):
            reasons.append(f"{prefix}.{key} changed {_show(old[key])} -> {_show(new[key])}")
    return reasons


def _show(value: Any) -> str:
    if isinstance(value, str) and value.startswith(SECRET_PREFIX):
        return "(secret)"
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        return {prefix: value} if prefix else {}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat
