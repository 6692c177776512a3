"""A stage's fingerprint: everything that decides its output, so an unchanged stage can be skipped.

Parts: the code (each function, class and module-level code the stage function can reach, by its
parsed code, so comments, docstrings and formatting never count), the params the function can see,
the settings that change results (backend, requested GPU mode, Spark conf, the datasets'
declarations), and the content digests of its inputs. The fingerprint is stored in each output's
manifest; a stage whose outputs all carry the fingerprint it has now is skipped, and the parts let
`plan` say in words what changed. Values that came from ${env:...} are stored only as a keyed hash.

The versions of the libraries the stage runs on (libraries.py) are kept beside the digest, not in
it, and compared by themselves (the planner): a record made before they were kept, or a pipeline
that turns `rerun_on_library_upgrade` off or on, never makes every stage run again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets as tokens
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError
from . import libraries, signature, sqlstage
from .codereach import WHOLE_FILE
from .stagecode import inspect_target

SECRET_PREFIX = "secret:"


@dataclass
class Fingerprint:
    code: dict[str, str]  # code unit ("pkg/steps.py:function report") -> sha256 of its parsed code
    params: dict[str, Any]  # the params the function can see, secrets hashed
    settings: dict[str, Any]  # backend, requested gpu mode, spark conf, dataset declarations
    inputs: dict[str, str]  # dataset -> content digest (an incremental stage's partitioned input excluded)
    datums: dict[str, str] | None = None  # incremental: partition of the partitioned input -> digest
    libraries: dict[str, str] = field(default_factory=dict)  # distribution -> version (not in the digest)
    base: str = field(init=False)
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        self.base = _sha({"code": self.code, "params": self.params, "settings": self.settings,
                          "inputs": self.inputs})
        self.digest = self.base if self.datums is None else _sha({"base": self.base, "datums": self.datums})

    def record(self) -> dict[str, Any]:
        """What an output's manifest keeps."""
        return {"digest": self.digest, "base": self.base, "code": self.code, "params": self.params,
                "settings": self.settings, "inputs": self.inputs, "datums": self.datums,
                "libraries": self.libraries}


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


class SecretHasher:
    """Replaces values that contain a secret with a keyed hash: equal secrets compare equal, and the
    stored fingerprint cannot be used to guess a short secret. The key stays in the workdir (0600)."""

    def __init__(self, key_file: Path, secrets: frozenset[str], agree=None) -> None:
        self.secrets = secrets
        self.key_file = key_file
        # a workdir in object storage holds the key every machine uses: agree(this machine's key, as
        # hex) returns the workdir's, storing this one there when it has none
        self.agree = agree
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
            if self.agree is not None:
                shared = bytes.fromhex(self.agree(self._key.hex()))
                if shared != self._key:
                    self.key_file.write_text(shared.hex())
                    self._key = shared
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
    reads a `.params` attribute (`reads_params`, from codereach.CodeIndex). A query sees those it names."""
    if sqlstage.is_sql(target):
        named = sqlstage.param_names(root, target)
        return {k: v for k, v in params.items() if named is None or k in named}
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


def upgrades(records: list[dict[str, Any]], new: Fingerprint) -> list[str]:
    """'xgboost 3.1.0 -> 3.2.0' for each library whose version differs from the one an output's
    record names. A record without versions (made before they were kept) counts as unchanged."""
    changes: list[str] = []
    for record in records:
        changes += [c for c in libraries.upgrades(record.get("libraries") or {}, new.libraries) if c not in changes]
    return changes


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
            reasons += _changed_units(path, before, after)
    return reasons


def _changed_units(path: str, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed among the code units (functions, classes, the module's top level) of one file."""
    reasons = []
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
