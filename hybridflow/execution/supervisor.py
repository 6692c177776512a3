"""The `hybridflow run` command as a thin parent of the process that runs the pipeline.

`os._exit` in a stage, or a crash in native code (a segfault), ends the process that runs the stage
at once: nothing in that process can record the run's end or say what happened, and cron would see
whatever exit status it left (0 for `os._exit(0)`). So the process the user or cron started forks
the run and waits for it. The run tells its parent, through a pipe, each run it begins and ends;
when the run's process ends with a run begun and not ended, the parent records that run as killed,
names the stage that was running, and exits 1. A run's process that ends the command's own way (an
error it reported, exit codes and all) says so first, and its exit code is the command's.

The parent is also the child subreaper of everything under it (PR_SET_CHILD_SUBREAPER): a process a
stage left behind, daemonised or not, is re-parented to it rather than to init, and the parent ends
every process still under it once the run's process has ended.

Signals: SIGTERM and SIGHUP sent to the parent are passed on to the run's process, which stops as it
always does; SIGINT too, unless it came from the terminal, which sends Ctrl-C to the whole
foreground process group (the run's process has it already). If the parent dies (`kill -9`), the
run's process is killed too (SIGKILL), as a command run in one process always was. Linux only;
elsewhere the run happens in the command's own process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable

from .. import processes

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SI_KERNEL = 0x80  # si_code of a signal the kernel sent (the terminal's Ctrl-C), not another process
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# what a signal that ends a run's process most likely means
CAUSES = {signal.SIGKILL: ": out of memory, or kill -9", **dict.fromkeys(
    (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT), ": a crash in native code")}

_channel: int | None = None  # in the run's process: the pipe to the parent


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(signal, "sigwaitinfo")


def run_began(run_id: str) -> None:
    _tell(f"began {run_id}")


def run_ended(run_id: str) -> None:
    _tell(f"ended {run_id}")


def _tell(line: str) -> None:
    if _channel is not None:
        with contextlib.suppress(OSError):  # a parent that is gone has nothing to hear
            os.write(_channel, f"{line}\n".encode())


@dataclass
class Outcome:
    """How the run's process ended: its exit code, or the run it left unfinished and how it died."""

    exit_code: int
    unfinished: str | None = None  # the id of a run begun and never ended, by a process that died
    death: str = ""  # 'exit status 0: ...', 'killed by SIGSEGV: a crash in native code'


def supervise(work: Callable[[], int]) -> Outcome:
    """`work()` (which returns an exit code) in a forked child, waited for here."""
    _flush()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        _be_the_run(work, writer)  # never returns
    os.close(writer)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    lines: list[str] = []
    listening = threading.Thread(target=_listen, args=(reader, lines), daemon=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {*PASSED_ON, signal.SIGCHLD})  # the thread inherits it
    listening.start()
    status = _wait_passing_signals_on(pid)
    processes.end_all()  # what the run left under us: a stage's daemon, an engine it could not stop
    listening.join(timeout=5)  # the pipe's last writers went with them
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*PASSED_ON, signal.SIGCHLD})
    return _outcome(status, lines)


def _be_the_run(work: Callable[[], int], writer: int) -> None:
    global _channel
    code = 70
    try:
        _channel = writer
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # what a stage detaches comes back to this process, to be ended with its stage (the flag lasts
        # as long as the process: set here, in the command's own run process, never in a library caller's)
        processes.adopt_orphans()
        code = work()
        _tell(f"exit {code}")  # the command's own end: whatever it left unfinished, it has reported
    finally:
        _flush()
        os._exit(code)


def _wait_passing_signals_on(pid: int) -> int:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        info = signal.sigwaitinfo({*PASSED_ON, signal.SIGCHLD})
        if info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGINT and info.si_code == SI_KERNEL:
            continue  # the terminal's Ctrl-C reached the run's process group already
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, info.si_signo)


def _listen(reader: int, lines: list[str]) -> None:
    with os.fdopen(reader, "r", encoding="utf-8", errors="replace") as pipe:
        for line in pipe:  # until every writer is gone: the run's process and anything it forked
            lines.append(line.strip())


def _outcome(status: int, lines: list[str]) -> Outcome:
    code = os.waitstatus_to_exitcode(status)
    began = [line.split(" ", 1)[1] for line in lines if line.startswith("began ")]
    ended = {line.split(" ", 1)[1] for line in lines if line.startswith("ended ")}
    unfinished = next((run for run in reversed(began) if run not in ended), None)
    if any(line.startswith("exit ") for line in lines):
        unfinished = None
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        death = f"killed by {signal.Signals(signum).name}{CAUSES.get(signum, '')}"
        code = 128 + signum
    else:
        death = f"exit status {code}: os._exit in a stage?"
    return Outcome(code, unfinished, death)


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
