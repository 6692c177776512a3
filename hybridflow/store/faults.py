"""Named crash points for fault-injection tests of publishing and recovery.

`HYBRIDFLOW_CRASH_AT=publish:moved` makes the process SIGKILL itself when it
reaches that point, exactly as a power cut or the OOM killer would;
`HYBRIDFLOW_STOP_AT=publish:moved` makes it SIGSTOP itself there, as a suspended
VM or a long pause would (it goes on when sent SIGCONT).
"""

from __future__ import annotations

import os
import signal

_ENV = "HYBRIDFLOW_CRASH_AT"
_STOP_ENV = "HYBRIDFLOW_STOP_AT"


def checkpoint(name: str) -> None:
    if os.environ.get(_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(_STOP_ENV) == name:
        os.kill(os.getpid(), signal.SIGSTOP)
