"""`hybridflow doctor`: each check on a real pipeline and environment, and the command under `env -i`."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.definition.config import load_pipeline
from hybridflow.engines.spark import host
from hybridflow.errors import ExitCode
from hybridflow.installing import install_extras
from hybridflow.ops import doctor
from hybridflow.ops.doctor import Target
from tests.support.crontabs import TINY_STAGES, tiny_pipeline

ENGINES_PIPELINE = '''
name: engines
stages:
  make:
    run: mypkg.steps:make
    outputs: [numbers]
  etl:
    backend: spark
    run: mypkg.steps:take
    inputs: [numbers]
    outputs: [clean]
  tune:
    backend: ray
    run: mypkg.steps:take
    inputs: [clean]
    outputs: [best]
'''
ENGINE_STAGES = TINY_STAGES + '''

def take(**inputs):
    return next(iter(inputs.values()))
'''


@pytest.fixture
def engines(project):
    project.stages(ENGINE_STAGES)
    return load_pipeline(project.pipeline(ENGINES_PIPELINE))


def findings(check, pipeline, environ, **options):
    return {f.check: f for f in check(Target(pipeline, environ), **options)}


def test_a_missing_engine_package_is_reported_with_its_pip_fix(engines):
    extras = {"ray": ("ray", "hybridflow_no_such_engine"), "dask": ("dask", "hybridflow_no_such_engine")}
    found = findings(doctor.check_packages, engines, {}, extras=extras)
    assert list(found) == ["ray engine"]  # only the backends the pipeline uses
    assert (found["ray engine"].status, found["ray engine"].fix) == ("error", install_extras("ray"))
    assert found["ray engine"].detail == "hybridflow_no_such_engine is not installed"
    # without a pipeline every engine is looked at, and a missing one is optional
    found = findings(doctor.check_packages, None, {}, extras=extras)
    assert {name: f.status for name, f in found.items()} == {"dask engine": "warning", "ray engine": "warning"}


def test_installed_engines_are_found_without_being_imported(engines):
    found = findings(doctor.check_packages, engines, {})
    assert set(found) == {"spark engine", "ray engine"}
    for backend, module in (("spark", "pyspark"), ("ray", "ray")):
        installed = importlib.util.find_spec(module) is not None
        assert (found[f"{backend} engine"].status == "ok") == installed
    # in a fresh interpreter (this one may have imported engines for other tests)
    probe = ("import sys; from hybridflow.ops import doctor; list(doctor.check_packages(doctor.Target(None, {}))); "
             "print(sorted(m for m in ('pyspark', 'ray', 'dask', 'distributed') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_java_missing_from_path_is_an_error_for_a_spark_pipeline(engines, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    [java] = doctor.check_engines(Target(engines, {"PATH": str(empty)}))
    assert (java.status, java.detail) == ("error", "no java on PATH, which Spark needs")
    assert "JAVA_HOME" in java.fix
    [java] = doctor.check_engines(Target(engines, {"PATH": str(empty), "JAVA_HOME": str(tmp_path / "nojdk")}))
    assert java.status == "error" and f"JAVA_HOME/bin/java ({tmp_path / 'nojdk/bin/java'})" in java.detail


def test_java_older_than_17_is_an_error(engines, tmp_path):
    home = tmp_path / "jdk11"
    (home / "bin").mkdir(parents=True)
    fake = home / "bin" / "java"  # a stand-in for an old JDK: it only answers -version
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.21" 2023-10-17\' >&2\n')
    fake.chmod(0o755)
    [java] = doctor.check_engines(Target(engines, {"JAVA_HOME": str(home)}))
    assert (java.status, java.detail) == ("error", f"Java 11 at {fake}; Spark needs 17 or later")
    fake.write_text('#!/bin/sh\necho \'java version "1.8.0_392"\' >&2\n')
    assert host.java_version(str(fake), {}) == 8


def test_real_java_is_accepted(engines):
    if shutil.which("java") is None:
        pytest.skip("no java on PATH")
    [java] = doctor.check_engines(Target(engines, {"PATH": os.environ["PATH"]}))
    assert java.status == "ok" and java.detail.startswith("Java ")


def test_java_is_not_checked_without_spark(project):
    project.stages(TINY_STAGES)
    pipeline = load_pipeline(project.pipeline(tiny_pipeline("0 3 * * 1", "UTC")))
    assert list(doctor.check_engines(Target(pipeline, {"PATH": ""}))) == []


def test_workdir_is_checked_at_its_nearest_existing_parent(project):
    project.stages(ENGINE_STAGES)
    pipeline = load_pipeline(project.pipeline("workdir: state/deep\n" + ENGINES_PIPELINE.lstrip()))
    [workdir] = doctor.check_workdir(Target(pipeline, {}))
    assert (workdir.status, workdir.detail) == (
        "ok", f"{project.root / 'state/deep'} will be created in {project.root}, which is writable")
    [disk] = doctor.check_disk(Target(pipeline, {}))
    assert disk.detail.endswith(f"GiB free in {project.root}")
    (project.root / "state").write_text("a file where a directory should be")
    [workdir] = doctor.check_workdir(Target(pipeline, {}))
    assert (workdir.status, workdir.detail) == ("error", f"{project.root / 'state'} is not a directory")


@pytest.mark.crontab  # a process named cron: what the cron tests see as a cron daemon already running
def test_cron_daemon_is_found_in_proc_and_a_zombie_is_not(tmp_path):
    before = doctor.cron_daemon()
    fake = tmp_path / "cron"  # a process named cron: what /proc shows for the real daemon
    shutil.copy("/bin/sleep", fake)
    process = subprocess.Popen([str(fake), "3600"])  # killed below
    try:
        assert doctor.cron_daemon() in {process.pid, before} - {None}
        process.kill()
        stat = Path(f"/proc/{process.pid}/stat")
        deadline = time.monotonic() + 60
        while (state := stat.read_text().rpartition(")")[2].split()[0]) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state == "Z", f"the killed fake cron (pid {process.pid}) is in state {state!r} 60 s after SIGKILL, " \
                             "not a zombie"
        assert doctor.cron_daemon() == before  # killed but not yet reaped: it runs nothing
    finally:
        process.kill()
        process.wait()


def test_schedule_check_says_whether_the_line_is_installed(project, saved_crontab):
    from hybridflow.ops import schedule

    project.stages(TINY_STAGES)
    path = project.pipeline(tiny_pipeline("0 3 * * 1", "UTC"))
    [found] = doctor.check_schedule(Target(load_pipeline(path), {}))
    assert (found.status, found.fix) == ("error", f"hybridflow schedule install {path}")
    schedule.install(load_pipeline(path))
    [found] = doctor.check_schedule(Target(load_pipeline(path), {}))
    assert found.status == "ok"
    project.pipeline(tiny_pipeline("0 4 * * 1", "UTC"))
    [found] = doctor.check_schedule(Target(load_pipeline(path), {}))
    assert found.status == "warning" and "'0 3 * * 1' (UTC), the file '0 4 * * 1'" in found.detail


def test_a_failing_check_is_reported_and_the_others_still_run():
    def check_broken(target):
        raise RuntimeError("boom")
        yield  # a generator, like the real checks

    def check_fine(target):
        yield doctor.Finding("fine", "ok", "all good")

    results = doctor.run_checks(None, {}, checks=[check_broken, check_fine])
    assert [(f.check, f.status) for f in results] == [("broken", "error"), ("fine", "ok")]
    assert results[0].detail == "the check itself failed: RuntimeError: boom"


def test_doctor_under_env_i_reports_what_cron_would_miss(project, saved_crontab):
    project.stages(TINY_STAGES)
    path = project.pipeline(tiny_pipeline("0 3 * * 1", "UTC").replace("make:\n", "make:\n        backend: spark\n"))
    python = os.path.abspath(sys.executable)
    done = subprocess.run(["env", "-i", "COLUMNS=300", python, "-m", "hybridflow.cli", "doctor", str(path)],
                          capture_output=True, text=True, cwd=project.root, timeout=240)
    assert done.returncode == ExitCode.UNAVAILABLE, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    rows = {line.split("│")[2].strip(): line for line in done.stdout.splitlines() if line.count("│") >= 4}
    assert {"spark engine", "java", "workdir", "disk", "crontab", "cron daemon", "schedule"} <= set(rows)
    assert "the pipeline's schedule is not in the crontab" in rows["schedule"]
    assert f"hybridflow schedule install {path}" in rows["schedule"]
    assert re.search(r"^[1-9]\d* errors?, \d+ warnings?$", done.stdout, re.MULTILINE)


SECRET_PIPELINE = tiny_pipeline("0 3 * * 1", "UTC") + '''
    params:
      token: "${env:HF_DOCTOR_TOKEN}"
      endpoint: "https://${env:HF_DOCTOR_HOST}/v1"
      cache: "${env:HOME}/cache"
'''
SECRETS = {"HF_DOCTOR_TOKEN": "tok-0123456789", "HF_DOCTOR_HOST": "db.internal.example"}


def test_doctor_names_the_env_variables_cron_will_not_give_a_scheduled_run(project, fake_crontab, monkeypatch):
    from hybridflow.ops import schedule

    monkeypatch.setattr(schedule, "SYSTEM_ENVIRONMENT", project.root / "no-etc-environment", raising=False)
    project.stages(TINY_STAGES)
    shell = {"PATH": "/usr/bin:/bin", "HOME": str(project.root), **SECRETS}
    pipeline = load_pipeline(project.pipeline(SECRET_PIPELINE), environ=shell)

    def row():
        [found] = [f for f in doctor.run_checks(pipeline, shell) if f.check == "cron environment"]
        assert not any(value in found.detail + found.fix for value in SECRETS.values())  # names, never values
        return found

    found = row()  # not installed yet: the line `schedule install` would write carries neither
    assert found.status == "error"
    assert "HF_DOCTOR_HOST, HF_DOCTOR_TOKEN" in found.detail and "HOME" not in found.detail  # cron sets HOME
    assert "a crontab line installed from this shell" in found.detail
    assert found.fix.startswith("crontab -e and add HF_DOCTOR_HOST=... and HF_DOCTOR_TOKEN=..., one per line")

    schedule.install(pipeline, environ=shell)
    assert not any(value in fake_crontab.read_text() for value in SECRETS.values())  # install carries no secret
    found = row()
    assert found.status == "error" and "not on the installed crontab line" in found.detail

    # the crontab's own NAME=value lines reach the job below them, not the jobs above
    fake_crontab.write_text(f"HF_DOCTOR_TOKEN=x\n{fake_crontab.read_text()}HF_DOCTOR_HOST=y\n")
    found = row()
    assert found.status == "error" and "reads HF_DOCTOR_HOST (" in found.detail
    assert found.fix.startswith("crontab -e and add HF_DOCTOR_HOST=..., one per line")

    fake_crontab.write_text(f"HF_DOCTOR_HOST = y\n{fake_crontab.read_text()}")
    schedule.install(pipeline, environ=shell)  # a reinstall keeps the user's lines above it
    assert (row().status, row().detail) == (
        "ok", "cron sets HF_DOCTOR_HOST, HF_DOCTOR_TOKEN, HOME, which the pipeline reads (${env:...})")


def test_etc_environment_counts_and_unscheduled_pipelines_are_not_checked(project, fake_crontab, monkeypatch):
    from hybridflow.ops import schedule

    system = project.write("etc-environment", 'LANG="C.UTF-8"\nexport HF_DOCTOR_TOKEN=a\nHF_DOCTOR_HOST=b\n')
    monkeypatch.setattr(schedule, "SYSTEM_ENVIRONMENT", system)
    project.stages(TINY_STAGES)
    shell = {"PATH": "/usr/bin:/bin", "HOME": str(project.root), **SECRETS}
    pipeline = load_pipeline(project.pipeline(SECRET_PIPELINE), environ=shell)
    [found] = doctor.check_cron_environment(Target(pipeline, shell))
    assert found.status == "ok"
    unscheduled = SECRET_PIPELINE.replace('''
    schedule:
      cron: "0 3 * * 1"
      timezone: UTC''', "")
    assert "schedule" not in unscheduled
    pipeline = load_pipeline(project.pipeline(unscheduled, "unscheduled.yaml"), environ=shell)
    assert list(doctor.check_cron_environment(Target(pipeline, shell))) == []  # cron never runs it
    plain = load_pipeline(project.pipeline(tiny_pipeline("0 3 * * 1", "UTC"), "plain.yaml"))
    assert list(doctor.check_cron_environment(Target(plain, shell))) == []  # nothing read from the environment


def test_the_installed_lines_variables_are_read_by_name():
    from hybridflow.ops import schedule

    line = ("0 3 * * 1 cd '/p 50\\% x' && mkdir -p /p/w && /usr/bin/env 'JAVA_HOME=/opt/my jdk' PATH=/v/bin:/bin "
            "LANG=C.UTF-8 /v/bin/python -m hybridflow.cli run --trigger cron X=1 /p/x.yaml >> /p/w/cron.log 2>&1")
    assert schedule.line_variables(line) == {"JAVA_HOME", "PATH", "LANG"}
    assert schedule.line_variables("0 3 * * 1 echo 'unbalanced") == set()


S3_SCHEDULED = '''
name: lakeflow
workdir: s3://lake/team
stages:
  make: {run: mypkg.steps:make, outputs: [numbers]}
schedule: {cron: "0 3 * * 1", timezone: UTC}
'''


def test_doctor_says_when_crons_runs_would_reach_another_store(project, fake_crontab, monkeypatch):
    from hybridflow.ops import schedule

    monkeypatch.setattr(schedule, "SYSTEM_ENVIRONMENT", project.root / "no-etc-environment", raising=False)
    project.stages(TINY_STAGES)
    shell = {"PATH": "/usr/bin:/bin", "HOME": str(project.root), "AWS_ENDPOINT_URL": "http://store-a:9000",
             "AWS_REGION": "eu-west-3"}
    pipeline = load_pipeline(project.pipeline(S3_SCHEDULED), environ=shell)

    def row(environ):
        [found] = [f for f in doctor.run_checks(pipeline, environ, [doctor.check_cron_store])]
        return found

    schedule.install(pipeline, environ=shell)
    assert row(shell).status == "ok" and "http://store-a:9000" in row(shell).detail
    moved = {**shell, "AWS_ENDPOINT_URL": "http://store-b:9000"}  # the shell now points elsewhere
    found = row(moved)
    assert found.status == "error" and "endpoint http://store-a:9000 (this shell: http://store-b:9000)" in found.detail
    # a crontab line above the job that names another profile counts as cron's too
    fake_crontab.write_text(f"AWS_PROFILE=other\n{fake_crontab.read_text()}")
    assert "profile other (this shell: default)" in row(shell).detail
