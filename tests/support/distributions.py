"""Tiny installed distributions for tests: a module and its .dist-info, laid out in a directory the
way pip lays out site-packages, so importlib.metadata (and `import`) find them on sys.path."""

from __future__ import annotations

import shutil
from pathlib import Path


def install(site: Path, name: str, version: str, module: str, code: str = "", top_level: bool = False) -> Path:
    """Installs `name` (version) providing the module `module` into `site`, replacing any version of it
    there. top_level: declare the module in top_level.txt (setuptools), else in RECORD only (most
    wheels built today)."""
    site.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    for old in site.glob(f"{stem}-*.dist-info"):
        shutil.rmtree(old)
    (site / f"{module}.py").write_text(code or f"VERSION = {version!r}\n")
    info = site / f"{stem}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{module}.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    if top_level:
        (info / "top_level.txt").write_text(f"{module}\n")
    return info
