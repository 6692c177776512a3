"""Small throwaway projects (a pipeline file plus its stage module) in a test's tmp_path, and what
a run recorded in them."""

from __future__ import annotations

import textwrap
from pathlib import Path


def errors_of(path: Path) -> list[str]:
    """The error lines loading the pipeline file at `path` gives (none when it loads)."""
    from hybridflow.definition.config import load_pipeline
    from hybridflow.errors import ConfigError

    try:
        load_pipeline(path)
    except ConfigError as exc:
        return [str(p) for p in exc.problems if p.severity == "error"]
    return []


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    def pipeline(self, text: str, name: str = "pipeline.yaml") -> Path:
        return self.write(name, text)

    def stages(self, code: str, module: str = "steps") -> Path:
        self.write("mypkg/__init__.py", "")
        return self.write(f"mypkg/{module}.py", code)

    def home(self, pipeline: str) -> Path:
        return self.root / ".hybridflow" / pipeline


def last_run_record(workdir: Path) -> tuple[dict, dict[str, dict]]:
    """The newest run in <workdir>/runs.db and its stages by name."""
    from hybridflow.store.state import RunStore

    store = RunStore(workdir / "runs.db")
    [run] = store.runs(limit=1)
    return run, {s["stage"]: s for s in store.stages(run["run_id"])}
