"""The fenced code blocks of the docs (docs/**/*.md and README.md), and how tests/docs checks each one.

The rules, as docs/reference/docs-conventions.md tells writers: a page's blocks run top to bottom in one
scratch project (a copy of the repository's example configs, stages, data and scripts); shell and
Python blocks are run, YAML blocks validated as a pipeline file or a part of one laid over a small
valid pipeline; `<!-- docs: illustration (why) -->` right above a fence shows a block without running
it, `<!-- docs: file PATH -->` writes it into the scratch project, `<!-- docs: with-s3 -->` runs it with
the AWS variables of an S3 server (moto) the page's scratch project starts. Every block is at least parsed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
EXAMPLE_PROJECT = ("configs", "stages", "data", "scripts")  # what a page's scratch project starts with

SHELL = {"bash", "sh", "shell"}
SHOWN = {"text", "console", "toml", "sql", ""}
KNOWN = SHELL | SHOWN | {"python", "yaml"}
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w+-]*)[^\n`]*$")
_MARKER = re.compile(r"^ *<!-- docs: (?P<kind>illustration|file|with-s3)(?: (?P<arg>[^>]*?))? -->$")
_SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None = None  # "illustration", "file" or "with-s3"
    arg: str | None = None  # the file's path, or the illustration's reason

    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line} ({self.lang or 'no language'})"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise AssertionError(f"{page}:{i + 1}: a fence that is never closed")
        body = "\n".join(line[indent:] for line in lines[i + 1:end])
        marker = _MARKER.match(lines[i - 1]) if i else None
        found.append(Block(page, i + 1, opening["lang"].lower(), _expand_snippets(body) + "\n",
                           marker["kind"] if marker else None, (marker["arg"] or "").strip() if marker else None))
        i = end + 1
    return found


def _expand_snippets(text: str) -> str:
    """pymdownx.snippets' `--8<-- "path"` lines, as the site shows them (paths relative to docs/)."""
    return "\n".join((DOCS / m["path"]).read_text().rstrip("\n") if (m := _SNIPPET.match(line)) else line
                     for line in text.split("\n"))


def check_syntax(block: Block) -> None:
    """What every block must be, run or not: the language it says it is."""
    if block.lang not in KNOWN:
        raise AssertionError(f"{block.where()}: unknown fence language; use one of {sorted(KNOWN)}")
    if block.lang == "yaml":
        yaml.safe_load(block.text)
    elif block.lang == "python":
        compile(block.text, block.where(), "exec")
    elif block.lang in SHELL:
        done = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{block.where()}: {done.stderr}"


def _generated(folder: str, names: list[str]) -> set[str]:
    """What is left out of a scratch project: caches, and the data sets scripts generate (data/retrain/...)."""
    return {n for n in names if n == "__pycache__" or (Path(folder).name == "data" and n != "sample")}


class Scratch:
    """One page's scratch project: where its blocks run, one after another."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for part in EXAMPLE_PROJECT:
            shutil.copytree(REPO / part, root / part, ignore=_generated)
        self.cwd = root
        self.bin = root.parent / f"{root.name}-bin"
        self.bin.mkdir()
        # `hybridflow` and `python` as the suite runs them: this interpreter, this checkout's code
        for name, command in (("hybridflow", f'"{sys.executable}" -m hybridflow.cli'),
                              ("python", f'"{sys.executable}"'), ("python3", f'"{sys.executable}"')):
            (self.bin / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
            (self.bin / name).chmod(0o755)
        self.env = {**os.environ, "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                    "COLUMNS": "160", "NO_COLOR": "1", "HYBRIDFLOW_CACHE": str(root.parent / f"{root.name}-cache")}
        self.s3 = None  # the page's S3 server, started by its first with-s3 block

    def close(self) -> None:
        if self.s3 is not None:
            self.s3.stop()

    def check(self, block: Block) -> None:
        check_syntax(block)
        if block.marker == "illustration":
            return
        if block.marker == "file":
            path = self.cwd / block.arg
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)
            if block.lang == "yaml":
                self.validate(path, block)
            return
        if block.marker == "with-s3" and self.s3 is None:
            from tests.support.s3server import S3Server

            self.s3 = S3Server(self.root.parent / "s3.log").start()
            self.env.update(self.s3.env())
        if block.lang in SHELL:
            self._shell(block)
        elif block.lang == "python":
            self._run([sys.executable, "-c", block.text], block)
        elif block.lang == "yaml":
            self.validate(self._laid_over_base(block), block)

    def _shell(self, block: Block) -> None:
        state = self.root.parent / f"{self.root.name}-cwd"
        script = f"set -e\n{block.text}\npwd > '{state}'\n"
        self._run(["bash", "-c", script], block)
        self.cwd = Path(state.read_text().strip())

    def _run(self, argv: list[str], block: Block) -> None:
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (f"{block.where()} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                      f"{done.stderr[-3000:]}")

    def _laid_over_base(self, block: Block) -> Path:
        """A whole pipeline file as it is; a part of one followed by what it lacks of a small valid
        pipeline (a name, a stage). Put together as text, so that the file is read as hybridflow reads
        it (`on:` stays a key) and the block's own lines keep their numbers."""
        keys = set(re.findall(r"^([A-Za-z_][\w-]*):", block.text, re.MULTILINE))
        base = {"name": "name: docs-example\n",
                "stages": "stages:\n  step: {run: 'stages.docs_stub:step', outputs: [out]}\n"}
        path = self.cwd / f"docs-block-{block.line}.yaml"
        path.write_text(block.text + "".join(text for key, text in base.items() if key not in keys))
        return path

    def validate(self, path: Path, block: Block) -> None:
        import hybridflow

        self._stub_stage_code(path)
        # ${env:NAME} values a block uses (credentials, tokens) are set to a stand-in while it is checked
        names = set(re.findall(r"\$\{env:(\w+)\}", path.read_text())) - set(os.environ)
        os.environ.update({name: "docs-stand-in" for name in names})
        try:
            _, problems = hybridflow.validate([path])
        finally:
            for name in names:
                os.environ.pop(name, None)
        errors = [str(p) for p in problems if p.severity == "error"]
        assert not errors, f"{block.where()}: hybridflow validate found:\n" + "\n".join(errors)

    def _stub_stage_code(self, path: Path) -> None:
        """Stage modules and SQL files a block names but does not show: a function taking anything, a
        query over the stage's first input. A module that exists is never touched (a missing function
        in it is a real error)."""
        spec = yaml.safe_load(path.read_text())
        root = (path.parent / spec.get("root", ".")).resolve()
        for stage in (spec.get("stages") or {}).values():
            target = str(stage.get("run", ""))
            if target.endswith(".sql"):
                sql = root / target
                if not sql.exists():
                    sql.parent.mkdir(parents=True, exist_ok=True)
                    inputs = stage.get("inputs") or []
                    sql.write_text(f"SELECT * FROM {inputs[0]}\n" if inputs else "SELECT 1 AS one\n")
            elif ":" in target:
                module, function = target.split(":")
                file = root.joinpath(*module.split(".")).with_suffix(".py")
                for package in file.relative_to(root).parents:
                    if str(package) != ".":
                        (root / package).mkdir(exist_ok=True)
                        (root / package / "__init__.py").touch()
                if not file.exists():
                    file.write_text(textwrap.dedent(f"""\
                        def {function}(ctx=None, **inputs_and_params):
                            return None
                        """))
