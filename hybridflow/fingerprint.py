"""A stage's fingerprint: everything that decides its output, so an unchanged stage can be skipped.

Parts: the code (the function's module and every project module it imports, by content), the params
the function can see, the settings that change results (backend, GPU, Spark conf, the datasets'
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
from typing import Any

from . import signature
from .errors import DataError
from .stagecode import inspect_target, module_file

SECRET_PREFIX = "secret:"


@dataclass
class Fingerprint:
    code: dict[str, str]  # file relative to root -> sha256
    params: dict[str, Any]  # the params the function can see, secrets hashed
    settings: dict[str, Any]  # backend, gpu, spark conf, dataset declarations
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


class CodeFiles:
    """The project files a stage's module runs on import: itself, its packages' __init__ files, and
    every module under root it imports (at any depth, including imports inside functions)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._hashes: dict[Path, str] = {}
        self._imports: dict[Path, list[str]] = {}
        self._reads_params: dict[Path, bool] = {}  # filled by the same parse as _imports

    def of(self, target: str) -> dict[str, str]:
        found: dict[Path, str] = {}
        queue = [target.split(":")[0]]
        while queue:
            module = queue.pop()
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                name = ".".join(parts[:depth])
                file = module_file(self.root, name)
                if file is None or file in found:
                    continue
                found[file] = self._hash(file)
                queue += [m for m in self._imported(file, name) if module_file(self.root, m) is not None]
        return {file.relative_to(self.root).as_posix(): digest for file, digest in found.items()}

    def reads_params(self, files) -> bool:
        """Whether any of these files (as returned by of()) reads a `.params` attribute: ctx.params, or
        ctx handed to a helper that does. A file that cannot be parsed is assumed to."""
        return any(self._reads_params[self.root / f] for f in files)

    def _hash(self, file: Path) -> str:
        if file not in self._hashes:
            self._hashes[file] = hashlib.sha256(file.read_bytes()).hexdigest()
        return self._hashes[file]

    def _imported(self, file: Path, module: str) -> list[str]:
        if file not in self._imports:
            package = module if file.name == "__init__.py" else module.rpartition(".")[0]
            try:
                tree = ast.parse(file.read_bytes())
                self._reads_params[file] = False
            except (SyntaxError, ValueError):
                tree = ast.Module(body=[], type_ignores=[])  # the import fails at run time and says why
                self._reads_params[file] = True  # unreadable: assume the worst
            names: list[str] = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "params":
                    self._reads_params[file] = True
                elif isinstance(node, ast.Import):
                    names += [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = _resolve_relative(package, node.module, node.level)
                    if base:
                        names.append(base)
                        names += [f"{base}.{alias.name}" for alias in node.names]  # may be submodules
            self._imports[file] = names
        return self._imports[file]


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
    reads a `.params` attribute anywhere (`reads_params`, from CodeFiles)."""
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
    reasons: list[str] = []
    old_code, new_code = old.get("code", {}), new.code
    for path in sorted(set(old_code) | set(new_code)):
        if path not in old_code:
            reasons.append(f"{path} is now imported")
        elif path not in new_code:
            reasons.append(f"{path} is no longer imported")
        elif old_code[path] != new_code[path]:
            reasons.append(f"{path} changed")
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
