"""What a stage left running is told from what an engine is starting, even while the engine's
process is half started (forked, not yet exec'd) when the stage ends."""

from __future__ import annotations

import subprocess
import threading
import time

from hybridflow import processes


def _slow_to_exec() -> None:
    time.sleep(1.5)  # runs in the child between fork and exec


def test_a_process_an_engine_is_starting_is_never_taken_for_a_stage_s():
    before = processes.children()
    stage = subprocess.Popen(["sleep", "30"])  # the stage's own
    started: list[subprocess.Popen] = []

    def launch_engine():
        with processes.launching_engine():
            started.append(subprocess.Popen(["sleep", "30"], preexec_fn=_slow_to_exec))

    launcher = threading.Thread(target=launch_engine)
    launcher.start()
    try:
        deadline = time.monotonic() + 10
        while len(processes.children() - before) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the engine's process is forked: it sleeps before its exec
        left = processes.left_behind(before)
        launcher.join()
        assert stage.pid in left
        assert started[0].pid not in left
    finally:
        launcher.join()
        for process in [stage, *started]:
            process.kill()
            process.wait()
