"""The code's shape, checked on every run: ruff's rules pass, each engine's library is imported by its
own backend module only and nothing below the CLI imports it (import-linter contracts in
pyproject.toml), and no module outside hybridflow/backends names an engine: they ask the registry."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from hybridflow.backends import BUILT_IN

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN_ENGINES = set(BUILT_IN)


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def test_ruff_finds_nothing():
    done = subprocess.run([tool("ruff"), "check", "hybridflow", "tests", "scripts", "stages"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_import_contracts_are_kept():
    done = subprocess.run([tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout + done.stderr


def test_no_module_outside_the_backends_names_an_engine():
    named = []
    for path in sorted((ROOT / "hybridflow").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in BUILT_IN_ENGINES:
                named.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert named == []
