"""Shared helpers: small throwaway projects (a pipeline file plus its stage module) in tmp_path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


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


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)
