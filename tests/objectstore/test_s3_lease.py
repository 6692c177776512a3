"""The lease of a workdir in object storage, against real servers on 127.0.0.1 (two S3 servers; the
frozen runner and gc's grace on every cloud's store too) with their faults injected: a runner frozen
past its lease while another machine collects garbage publishes nothing and exits 75; answers to
conditional writes lost on the way back (tests/support/s3proxy.py) are recognised as the run's own;
a runner in another pid namespace on the same host does not take a live lease; gc spares a young
upload that has no manifest yet."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.objectstore.test_s3_workdir import current_versions, hf, small, statuses
from tests.support.s3proxy import S3Proxy, conditional_put
from tests.support.s3server import S3Endpoint
from tests.support.s3stores import every_cloud, every_store

pytestmark = pytest.mark.timeout(300)

SHORT_LEASE = {"HYBRIDFLOW_LEASE_SECONDS": "2"}


def assert_current_is_whole(s3: S3Endpoint, prefix: str) -> None:
    """Every file each current manifest names is in the store, at its size (on any cloud's store)."""
    for name, version in current_versions(s3, f"{prefix}/small").items():
        directory = f"{prefix}/small/datasets/{name}/versions/{version}"
        manifest = json.loads(s3.get_bytes(f"{directory}/_manifest.json"))
        for entry in manifest["files"]:
            assert len(s3.get_bytes(f"{directory}/{entry['path']}")) == entry["size"]


def stopped_in_group(pgid: int) -> bool:
    """Whether a process of the group stopped itself (state T)."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "T" and int(fields[2]) == pgid:
            return True
    return False


@every_cloud
def test_a_run_frozen_past_its_lease_while_another_machine_collects_garbage_publishes_nothing(project, s3, tmp_path):
    prefix = small(project, s3, "frozen")
    first = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1", env=SHORT_LEASE)
    assert first.returncode == 0, first.stdout + first.stderr
    before = current_versions(s3, f"{prefix}/small")

    # frozen right after writing a new version's manifest, before making it current
    frozen = hf(project, s3, "run", "pipeline.yaml", "--force", cache=tmp_path / "m1", wait=False,
                env={**SHORT_LEASE, "HYBRIDFLOW_STOP_AT": "publish:moved"})
    deadline = time.monotonic() + 120
    while not stopped_in_group(frozen.pid):
        assert frozen.poll() is None and time.monotonic() < deadline, frozen.communicate()
        time.sleep(0.1)
    try:
        # another machine finds the lease unrenewed, takes it over and removes the uncommitted version
        collected = collect_garbage_elsewhere(project, s3, tmp_path / "m2")
        assert "removed a@" in collected.stdout, collected.stdout
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    out, err = frozen.communicate(timeout=120)
    assert frozen.returncode == 75, out + err
    assert f"this run lost its lease on {s3.scheme}://{prefix}; nothing more was published" in out + err, out + err
    assert "Traceback" not in out + err
    assert current_versions(s3, f"{prefix}/small") == before
    assert_current_is_whole(s3, prefix)
    again = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m2", env=SHORT_LEASE)
    assert again.returncode == 0 and set(statuses(again.stdout).values()) == {"skipped"}, again.stdout + again.stderr


@every_store
def test_a_run_frozen_in_a_stage_past_its_lease_stops_and_publishes_nothing_more(project, s3, tmp_path):
    """Frozen from outside (the whole process group, as a suspended VM) while a stage runs: once
    thawed, the run notices its lease is gone, stops the stage and exits 75."""
    prefix = small(project, s3, "thawed")
    first = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1", env=SHORT_LEASE)
    assert first.returncode == 0, first.stdout + first.stderr
    before = current_versions(s3, f"{prefix}/small")
    earlier_logs = set((tmp_path / "m1").rglob("slow.log"))
    never = tmp_path / "never"  # the stage waits for it: only losing the lease ends it
    run = hf(project, s3, "run", "pipeline.yaml", "--force", "--param", f"slow.gate={never}", cache=tmp_path / "m1",
             wait=False, env=SHORT_LEASE)
    deadline = time.monotonic() + 120

    def slow_is_called() -> bool:  # this run's log of it says so (b was made current before it)
        return any("calling mypkg.steps:slow" in log.read_text(errors="replace")
                   for log in set((tmp_path / "m1").rglob("slow.log")) - earlier_logs)
    while current_versions(s3, f"{prefix}/small")["b"] == before["b"] or not slow_is_called():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.1)
    os.killpg(run.pid, signal.SIGSTOP)
    try:
        collect_garbage_elsewhere(project, s3, tmp_path / "m2")
    finally:
        os.killpg(run.pid, signal.SIGCONT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 75, out + err
    assert f"this run lost its lease on s3://{prefix}; nothing more was published" in out + err, out + err
    assert statuses(out)["slow"] == "failed" and "Traceback" not in out + err, out + err
    assert current_versions(s3, f"{prefix}/small")["c"] == before["c"]
    assert_current_is_whole(s3, prefix)


def collect_garbage_elsewhere(project, s3: S3Endpoint, cache: Path):
    """`hybridflow gc` from another machine, tried until the lease it finds is no longer renewed
    (exit 75 until then) and it takes it over."""
    for _ in range(60):
        collected = hf(project, s3, "gc", "pipeline.yaml", "--keep", "1", cache=cache, env=SHORT_LEASE)
        if collected.returncode != 75:
            break
        time.sleep(1)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    return collected


@every_store
def test_conditional_writes_whose_answers_were_lost_are_recognised_as_the_runs_own(project, s3, tmp_path):
    prefix = small(project, s3, "lost-answers")
    proxy = S3Proxy(s3.endpoint).start()
    try:
        dropped = {name: proxy.drop_answer(rule) for name, rule in {
            "lease taken": lambda m, p, h: conditional_put("/LEASE")(m, p, h) and "if-none-match" in h,
            "lease renewed": lambda m, p, h: conditional_put("/LEASE")(m, p, h) and "if-match" in h,
            "manifest": conditional_put("/_manifest.json"),
            "CURRENT": conditional_put("/CURRENT"),
        }.items()}
        done = hf(project, s3, "run", "pipeline.yaml", "--param", "slow.seconds=2", cache=tmp_path / "m1",
                  env={**SHORT_LEASE, "AWS_ENDPOINT_URL": proxy.endpoint})
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert statuses(done.stdout) == {"make": "done", "check": "done", "slow": "done"}, done.stdout
    assert {name: len(rule.dropped) for name, rule in dropped.items()} == dict.fromkeys(dropped, 1)
    assert set(current_versions(s3, f"{prefix}/small")) == {"a", "b", "c"}
    assert_current_is_whole(s3, prefix)
    assert not [k for k in s3.keys(f"{prefix}/") if k.endswith("/LEASE")]  # released, not left behind


@every_store
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a pid namespace")
def test_a_runner_in_another_pid_namespace_does_not_take_a_live_lease(project, s3, tmp_path):
    """Two containers on one host share its host name and boot id, not their pids: the holder's pid
    is no process there, which must not make its lease look dead."""
    prefix = small(project, s3, "namespaces")
    holder = hf(project, s3, "run", "pipeline.yaml", "--param", "slow.seconds=6", cache=tmp_path / "m1", wait=False,
                env=SHORT_LEASE)
    deadline = time.monotonic() + 120
    while not [k for k in s3.keys(f"{prefix}/") if k.endswith("/LEASE")]:
        assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
        time.sleep(0.1)
    environ = {**os.environ, **s3.env(), **SHORT_LEASE, "HYBRIDFLOW_CACHE": str(tmp_path / "m2")}
    other = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "hybridflow.cli",
                            "run", "pipeline.yaml", "--force", "--wait"], cwd=project.root, env=environ,
                           capture_output=True, text=True, timeout=240)
    out, err = holder.communicate(timeout=120)
    assert holder.returncode == 0, out + err  # never lost its lease to the other runner
    assert statuses(out) == {"make": "done", "check": "done", "slow": "done"}, out
    assert other.returncode == 0, other.stdout + other.stderr  # it ran once the lease was released
    assert statuses(other.stdout) == {"make": "done", "check": "done", "slow": "done"}, other.stdout


@every_cloud
def test_gc_spares_a_young_upload_without_a_manifest(project, s3, tmp_path):
    prefix = small(project, s3, "grace")
    done = hf(project, s3, "run", "pipeline.yaml", cache=tmp_path / "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    # a slow writer's version, uploaded after the current one and not yet given its manifest
    upload = f"{prefix}/small/datasets/a/versions/29991231T000000000000Z-0123456789-abcd/part-0.parquet"
    s3.put_bytes(upload, b"PAR1 still being written")
    spared = hf(project, s3, "gc", "pipeline.yaml", "--keep", "1", cache=tmp_path / "m2")
    assert spared.returncode == 0, spared.stdout + spared.stderr
    assert upload in s3.keys(f"{prefix}/small/datasets/a/versions/"), spared.stdout
    collected = hf(project, s3, "gc", "pipeline.yaml", "--keep", "1", cache=tmp_path / "m2",
                   env={"HYBRIDFLOW_GC_GRACE_SECONDS": "0"})
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert upload not in s3.keys(f"{prefix}/small/datasets/a/versions/"), collected.stdout
    assert_current_is_whole(s3, prefix)
