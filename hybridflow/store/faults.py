"""Named crash points for fault-injection tests of publishing and recovery.

`HYBRIDFLOW_CRASH_AT=publish:moved` makes the process SIGKILL itself when it
reaches that point, exactly as a power cut or the OOM killer would.
"""

from __future__ import annotations

import os
import signal

_ENV = "HYBRIDFLOW_CRASH_AT"


def checkpoint(name: str) -> None:
    if os.environ.get(_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
