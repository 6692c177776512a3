"""A second, independent S3 server for tests: the Versity S3 Gateway (versitygw, Apache-2.0) serving a
folder through its posix backend, one process on 127.0.0.1 with a key pair made for the run, started
and stopped by pid. It implements conditional writes (If-None-Match: * and If-Match on PutObject and
CompleteMultipartUpload), so every object-storage path of hybridflow can be proved on a store that is
neither AWS nor moto.

The binary is built once from the Go module proxy into ~/.cache/hybridflow/tools (a few minutes on two
cores, then nothing): `python -m tests.support.versitygw` does it, and .ci/run calls that. Where it is
not built (no Go toolchain), tests of this store are skipped with that reason.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from tests.support.gotools import GoTool
from tests.support.s3server import REGION, S3Endpoint, free_port, stop_group, wait_for_port

TOOL = GoTool("versitygw", "github.com/versity/versitygw/cmd/versitygw", "v1.8.0", "tests.support.versitygw")
binary, missing_reason, install = TOOL.binary, TOOL.missing_reason, TOOL.install


class VersityServer(S3Endpoint):
    name = "versitygw"

    def __init__(self, log: Path, root: Path, host: str = "127.0.0.1") -> None:
        self.log, self.root, self.host = log, root, host  # root: the folder whose subfolders are the buckets
        self.port = free_port(host)
        self.endpoint = f"http://{host}:{self.port}"
        self.process: subprocess.Popen | None = None
        # made for this run, and given through the environment: a command line is visible to everyone (ps)
        self.access_key, self.secret_key = f"hf{secrets.token_hex(8)}", secrets.token_urlsafe(24)

    def start(self) -> VersityServer:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ROOT_ACCESS_KEY": self.access_key, "ROOT_SECRET_KEY": self.secret_key,
               "VGW_REGION": REGION}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([str(binary()), "--port", f"{self.host}:{self.port}", "posix",
                                             str(self.root)], stdout=out, stderr=out, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.process, self.host, self.port, "versitygw", self.log)
        return self

    def stop(self) -> None:
        stop_group(self.process)


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        print(f"versitygw: not installed ({exc}); its tests will be skipped", file=sys.stderr)
        sys.exit(1)
