"""The pip command that installs hybridflow's optional extras, as this copy of hybridflow was installed:
from a source checkout (pip install -e), the checkout again; from a package index, the package."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def install_extras(extras: str = "") -> str:
    """The command that installs hybridflow with the extras `extras` ("spark" or "spark,dask"; none:
    hybridflow alone) into this environment."""
    wanted = f"[{extras}]" if extras else ""
    checkout = source_checkout()
    if checkout is None:
        return f"pip install 'hybridflow{wanted}'"
    shown = "." if checkout == Path.cwd().resolve() else _relative_or_absolute(checkout)
    return f"pip install -e '{shown}{wanted}'"


@functools.lru_cache(maxsize=1)
def source_checkout() -> Path | None:
    """The source checkout this copy of hybridflow is imported from (an editable install), or None."""
    root = Path(__file__).resolve().parent.parent
    try:
        project = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "hybridflow"' in project else None


def _relative_or_absolute(path: Path) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("../..") else str(path)
