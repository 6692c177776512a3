"""Shell completion (typer's; `hybridflow --install-completion`): commands, stage names from the
pipeline file on the line, run ids from runs.db; a broken or missing file completes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hybridflow.store.state import RunStore

ROOT = Path(__file__).resolve().parents[2]


def completions(cwd: Path, line: str) -> list[str]:
    """What bash is offered for `line` (the word being typed is its last, '' after a space)."""
    words = line.split()
    current = len(words) if line.endswith(" ") else len(words) - 1
    env = {**os.environ, "PYTHONPATH": str(ROOT), "_HYBRIDFLOW_COMPLETE": "complete_bash",
           "COMP_WORDS": line, "COMP_CWORD": str(current)}
    done = subprocess.run([sys.executable, "-c", "from hybridflow.cli import app; app(prog_name='hybridflow')"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_commands_stage_names_and_run_ids_complete(project):
    project.pipeline('''
    name: shop
    stages:
      load: {run: "mypkg.steps:load", outputs: [raw]}
      clean: {run: "mypkg.steps:clean", inputs: [raw], outputs: [cleaned]}
      score: {run: "mypkg.steps:score", backend: python, inputs: [cleaned], outputs: [scores]}
    ''')
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    for run_id, started in (("20260101T000000Z-aaaaaa", "2026-01-01T00:00:00"),
                            ("20260102T000000Z-bbbbbb", "2026-01-02T00:00:00")):
        store.save_run(run_id=run_id, pipeline="shop", trigger="manual", started_at=started, status="success")
    root = project.root
    assert completions(root, "hybridflow r") == ["run", "resume", "runs", "report"]
    assert completions(root, "hybridflow run pipeline.yaml --only ") == ["load", "clean", "score"]
    assert completions(root, "hybridflow plan pipeline.yaml --from c") == ["clean"]
    assert completions(root, "hybridflow run pipeline.yaml --force load,") == ["load,clean", "load,score"]
    assert completions(root, "hybridflow logs last --pipeline pipeline.yaml s") == ["score"]
    assert completions(root, "hybridflow show ") == ["last", "20260102T000000Z-bbbbbb", "20260101T000000Z-aaaaaa"]
    assert completions(root, "hybridflow report 20260101") == ["20260101T000000Z-aaaaaa"]

    project.pipeline("stages: [not, a, mapping", name="broken.yaml")
    assert completions(root, "hybridflow run broken.yaml --only ") == []
    assert completions(root, "hybridflow run missing.yaml --only ") == []
    assert completions(root, "hybridflow show --workdir nowhere ") == ["last"]
