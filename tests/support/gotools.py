"""Test servers built from a Go module (versitygw, fake-gcs-server): `go install` of one pinned
version, once, into the tools cache (HYBRIDFLOW_TOOLS, default ~/.cache/hybridflow/tools)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_VARIABLE = "HYBRIDFLOW_TOOLS"


@dataclass(frozen=True)
class GoTool:
    name: str  # the binary's name
    module: str  # what `go install` builds it from
    version: str
    builder: str  # the module that builds it: python -m <builder>

    def binary(self) -> Path:
        root = Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "hybridflow" / "tools")
        return root / f"{self.name}-{self.version}" / self.name

    def missing_reason(self) -> str | None:
        """Why the server cannot run here (None: it can)."""
        if self.binary().is_file():
            return None
        return (f"{self.name} {self.version} is not built at {self.binary()} "
                f"(run: python -m {self.builder}; needs Go)")

    def install(self) -> Path:
        """Build the binary unless it is there (idempotent); put in place only once whole."""
        target = self.binary()
        if target.is_file():
            return target
        go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)
        if go is None:
            raise RuntimeError(f"the Go toolchain is not installed: {self.name} cannot be built")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            env = {**os.environ, "GOBIN": scratch, "GOFLAGS": "-buildvcs=false"}
            subprocess.run([go, "install", f"{self.module}@{self.version}"], env=env, check=True, cwd=scratch)
            os.replace(Path(scratch) / self.name, target)
        return target
