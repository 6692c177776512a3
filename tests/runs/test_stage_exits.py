"""A stage that ends its own process (sys.exit, os._exit, a segfault) fails the run: exit 1, one line
naming the stage, the run recorded. The command's process supervises the one that runs the stages
(supervisor.py), since os._exit and a crash in native code cannot be caught in the process itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.projects import last_run_record

STAGES = """
    import ctypes
    import os
    import sys

    import pandas as pd


    def make():
        return pd.DataFrame({"a": [1, 2]})


    def exits(made):
        sys.exit(0)


    def exits_hard(made):
        os._exit(0)


    def crashes(made):
        ctypes.string_at(0)  # reads address 0: SIGSEGV
"""


def run_cli(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", *args], cwd=project.root,
                          capture_output=True, text=True, timeout=120)


def pipeline_calling(project, function: str, timeout: str = "") -> str:
    project.stages(STAGES)
    project.pipeline(f"""
        name: exits
        root: .
        stages:
          make: {{backend: python, run: "mypkg.steps:make", outputs: [made]}}
          bad: {{backend: python, run: "mypkg.steps:{function}", inputs: [made], outputs: [out]{timeout}}}
    """)
    return "pipeline.yaml"


@pytest.mark.parametrize("timeout", ["", ", timeout: 60"], ids=["in-process", "in-a-child"])
def test_sys_exit_in_a_stage_is_a_stage_failure_with_its_summary(project, timeout):
    run = run_cli(project, pipeline_calling(project, "exits", timeout))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "bad failed:" in run.stderr and "sys.exit(0)" in run.stderr, run.stderr
    assert "exits run" in run.stdout and "failed" in run.stdout  # the summary
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "failed" and stages["bad"]["status"] == "failed"


@pytest.mark.parametrize("function, death", [("exits_hard", "exit status 0"), ("crashes", "killed by SIGSEGV")])
def test_a_stage_that_ends_the_process_fails_the_run_in_one_line_and_is_recorded(project, function, death):
    run = run_cli(project, pipeline_calling(project, function))
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "during stage 'bad'" in errors[0] and death in errors[0], run.stderr
    assert "bad.log" in errors[0] and "--resume" in errors[0]
    assert "Traceback" not in run.stderr
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "killed" and death in record["error"]
    assert stages["make"]["status"] == "done" and stages["bad"]["status"] == "killed"
    # the next run is not refused, and finds the killed run to resume
    again = run_cli(project, "pipeline.yaml", "--resume")
    assert again.returncode == 1 and "resuming run" in again.stderr, again.stderr
