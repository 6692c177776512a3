"""Stage code as engines ship it to their workers: one zip per stage package or module file."""

from __future__ import annotations

import os
from pathlib import Path

from .stagelog import private_dir


def code_archive(path: Path, into: Path) -> Path:
    """A zip of one stage package (or module file) that engines ship to their workers."""
    import hashlib
    import zipfile

    into = private_dir(into / "shipped-code")  # under the run's logs: the owner's only
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    archive = into / f"{path.stem}-{digest}.zip"
    if not archive.exists():
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for file in files:
                bundle.write(file, file.relative_to(path.parent).as_posix())
        os.chmod(archive, 0o600)
    return archive
