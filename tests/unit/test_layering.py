"""The code's shape, checked on every run: ruff's rules pass, each engine's library is imported by its
own backend module only and nothing below the CLI imports it (import-linter contracts in
pyproject.toml), and no module outside hybridflow/backends and hybridflow/engines knows an engine: none
names one, imports an engine's backend module, or branches on which engine a stage runs on. They ask the
registry, and the engine's declaration (hybridflow.engines.<name>.ENGINE) says what it needs."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from hybridflow.engines import BUILT_IN

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
    for path in CORE:
        tree = ast.parse(path.read_text())
        # the `python:` data check is a kind of check that shares its name with an engine, said once
        kinds = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and [getattr(t, "id", None) for t in n.targets] == ["PYTHON_CHECK"]}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in BUILT_IN_ENGINES and id(node) not in kinds:
                named.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert named == []


# everything but the engines' backends and their declarations with the registry, which lists the built-in ones
CORE = [path for path in sorted((ROOT / "hybridflow").rglob("*.py"))
        if "backends" not in path.parts and "engines" not in path.parts]
# the Backend interface and what every engine shares: a stage's ctx, GPU choice, pandas frames, stage logs,
# data checks as measures (checkplan)
INTERFACE = {"hybridflow.backends", "hybridflow.backends.base", "hybridflow.backends.context",
             "hybridflow.backends.engineoutput", "hybridflow.backends.engineerrors",  # engines.log; the user's error
             "hybridflow.backends.gpu", "hybridflow.backends.pandas_frames", "hybridflow.backends.stagelog",
             "hybridflow.backends.stagemlflow",  # ctx.mlflow's record of a stage's calls
             "hybridflow.backends.checkplan"}
# what a branch on a stage's engine would test (not `engine`: read(engine="arrow") picks a result type)
ENGINE_IDENTITY = {"backend", "backend_name", "engine_name"}


def test_no_core_module_imports_an_engines_backend_module():
    import grimp

    graph = grimp.build_graph("hybridflow")
    reached = sorted(f"{module} imports {imported}" for module in graph.modules
                     if not module.startswith("hybridflow.backends")
                     for imported in graph.find_modules_directly_imported_by(module)
                     if imported.startswith("hybridflow.backends.") and imported not in INTERFACE)
    assert reached == []


def _identity(node: ast.AST) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name if name in ENGINE_IDENTITY else None


def _names_text(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_text(element) for element in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_no_core_module_branches_on_which_engine_runs():
    """`if spec.backend == "spark"`, `backend in ("dask", "ray")`: whatever the name, a plugin engine
    would never take that branch; the engine's declaration says what the branch would decide."""
    branches = []
    for path in CORE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(map(_identity, operands)) and any(map(_names_text, operands)):
                    branches.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert branches == []


def test_the_behaviour_checks_catch_what_they_are_for():
    """The check above, held against code that does branch on an engine (the guard must be able to fail)."""
    caught = [node for node in ast.walk(ast.parse('if spec.backend == "arrow" or backend_name in ("x", "y"): pass'))
              if isinstance(node, ast.Compare) and any(map(_identity, [node.left, *node.comparators]))
              and any(map(_names_text, [node.left, *node.comparators]))]
    assert len(caught) == 2
