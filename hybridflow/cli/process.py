"""The command's own process: where library logging goes while it lives, and its end without
Python's teardown."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn


def log_warnings_to_current_stderr() -> None:
    """Warnings logged by anyone reach the current stderr; nothing below them is shown. Left without
    a handler, the root logger gets one from the first module-level logging call (py4j's garbage
    collection thread calls logging.info once a stopped JVM no longer answers), bound to whatever
    sys.stderr was at that moment: a stage's log, closed later, or the terminal, where every engine's
    INFO records that reach the root (Dask's scheduler's) then printed over the run's display."""
    if not logging.root.handlers:
        logging.root.addHandler(logging.lastResort)  # level WARNING, writes to sys.stderr as it is then


def exit_without_teardown(code: int | str | None) -> NoReturn:
    """Exit as Python would (other threads joined, exit handlers run, output flushed) but without
    tearing down every imported module: after a run that loaded Spark's, Dask's and Ray's Python
    modules that took 0.9 s on 2 cores, added to every run's wall time. What it skips is freeing
    memory, which the OS does anyway."""
    code = code_of(code)
    end_the_process_lightly()
    os._exit(code)


def code_of(code: int | str | None) -> int:
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
        return 1
    return code or 0


def end_the_process_lightly() -> None:
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (| head) must not change the exit code
            stream.flush()
